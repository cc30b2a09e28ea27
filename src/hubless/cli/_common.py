"""Options and helpers shared by the sub-commands (loading inputs, parsing lists, messages).

Every message and table is printed with rich markup off: user content (paths, specs, captions,
``pip install 'hubless[report]'``) is shown exactly as it is, never read as a style tag.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text

from hubless.errors import InvalidInput

err_console = Console(stderr=True, soft_wrap=True, markup=False, highlight=False)

METHOD_HELP = (
    "Correction spec, repeatable, e.g. nnn:alpha=0.75,k=16 or is:beta=20 (`hubless methods` lists every method with its parameters)."
)
NORMALIZE_HELP = "L2-normalise every input so scores are cosine similarities, as in the papers (default on)."


def parse_where(text: str | None) -> dict | None:
    """``--where`` JSON as a dict (None when not given): the metadata filter of ``hubless search``,
    ``index remove`` and ``index update-metadata``."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f'--where must be a JSON object such as \'{{"split": "test"}}\': {exc.msg}') from None
    if not isinstance(value, dict):
        raise InvalidInput("--where must be a JSON object of metadata conditions")
    return value


def parse_ints(text: str, name: str) -> list[int]:
    """'1,5,10' -> [1, 5, 10], with a clear error."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{name} must be comma-separated integers such as 1,5,10; got {text!r}") from None
    if not values:
        raise typer.BadParameter(f"{name} is empty")
    return values


def load(path: Path | None, name: str, *, normalize: bool, dim: int | None = None):
    """Load an embeddings file (None passes through)."""
    if path is None:
        return None
    from hubless.inputs import load_embeddings

    return load_embeddings(path, name, normalize=normalize, dim=dim)


def describe_file(path: Path | None, array) -> dict[str, Any] | None:
    """Path, shape and sha256 of an input, for results files."""
    if path is None:
        return None
    from hubless._atomic import file_sha256
    from hubless.storage.arrays import split_key

    file, _ = split_key(path)  # "file.npz:KEY" and "folder:text" hash the file / folder
    return {"path": str(path), "shape": list(array.shape), "sha256": file_sha256(file)}


def print_error(message: str) -> None:
    """One line on stderr: ``error: message`` (the message is printed as it is)."""
    err_console.print(Text.assemble(("error: ", "bold red"), str(message)))


def print_note(message: str, label: str = "note") -> None:
    """One line on stderr: ``note: message`` (or another label, e.g. warning)."""
    err_console.print(Text.assemble((f"{label}: ", "yellow"), str(message)))


def error_message(exc: BaseException) -> str:
    """The one-line text of a library error (KeyError's repr quotes dropped)."""
    from hubless.errors import message

    return message(exc)


_CLI_EXCEPTIONS = (
    typer.Exit,
    typer.Abort,
    typer.BadParameter,
    *[getattr(typer.exceptions, n) for n in ("TyperException",) if hasattr(typer.exceptions, n)],
)

#: Set by the global ``--debug`` option (or ``HUBLESS_DEBUG=1``): a bug shows its traceback.
DEBUG = {"on": False}


def debugging() -> bool:
    return DEBUG["on"] or bool(os.environ.get("HUBLESS_DEBUG"))


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no file descriptor (a test's captured stdout)
        pass
    finally:
        os.close(devnull)


def friendly_errors(func: Callable) -> Callable:
    """Map errors to exit codes. Exit 2 with a one-line message: a :class:`hubless.errors.HublessError`
    (bad input, a missing file or id, a conflict, a busy lock, damaged data, a missing optional
    package: the message names the pip command), or an OSError from the operating system (a
    path that cannot be read or written, a full disk). Anything else is a bug in hubless: exit 1,
    saying so, with the traceback under ``--debug`` / ``HUBLESS_DEBUG=1``. A reader that closes
    the output pipe early (``| head``) ends the command quietly with the status a Unix tool
    killed by SIGPIPE has (141), nothing printed."""

    @wraps(func)
    def wrapper(*args, **kwargs):
        from hubless.errors import HublessError

        try:
            result = func(*args, **kwargs)
            sys.stdout.flush()  # a reader that closed the pipe shows here, not at exit
            return result
        except _CLI_EXCEPTIONS:  # usage errors and exits: typer reports them itself
            raise
        except BrokenPipeError:  # `hubless search ... --json | head -1`: stop quietly
            _quiet_stdout()
            raise typer.Exit(141) from None  # 128 + SIGPIPE, as a shell reports such a tool
        except (HublessError, OSError) as exc:
            print_error(error_message(exc))
            raise typer.Exit(2) from None
        except MemoryError:
            print_error("out of memory: the inputs or parameters need more memory than this machine has (smaller inputs, or a smaller k)")
            raise typer.Exit(1) from None
        except Exception as exc:  # a bug: one line, the traceback only on request
            if debugging():
                raise
            print_error(
                f"unexpected {type(exc).__name__}: {error_message(exc)} (a bug in hubless: rerun with --debug for the traceback, and please report it)"
            )
            raise typer.Exit(1) from None

    return wrapper


def deprecated_flag(value, old_value, old: str, new: str):
    """The value of option ``new``, or of its deprecated spelling ``old`` (with a warning saying
    so); both at once is an error."""
    if old_value is None:
        return value
    if value is not None:
        raise typer.BadParameter(f"{old} is the old name of {new}: give only {new}")
    print_note(f"{old} is deprecated: use {new}", "warning")
    return old_value


def wide_console() -> Console:
    """A console for result tables (markup off): on a terminal its width, otherwise (pipes, CI
    logs) 160 columns so tables are not folded."""
    console = Console(markup=False)
    if not console.is_terminal:
        console.width = max(console.width, 160)
    return console


#: Marks hubless writes into its JSON results and HTML reports, so a re-run may replace them.
GENERATOR = "hubless"
OVERWRITE_HELP = "Replace existing --out / --report files that hubless did not write."


def generator_mark() -> dict[str, str]:
    """The key every JSON result starts with (see :func:`check_outputs`)."""
    from hubless._version import __version__

    return {"generator": f"{GENERATOR} {__version__}"}


def _written_by_hubless(path: Path) -> bool:
    from hubless._atomic import array_written_by_hubless

    with open(path, "rb") as fh:
        head = fh.read(4096)
    marked = f'"generator": "{GENERATOR}'.encode() in head or f"<meta name='generator' content='{GENERATOR}".encode() in head
    return marked or array_written_by_hubless(path)


def check_outputs(outputs: dict[str, Path | None], inputs: dict[str, Any], *, overwrite: bool = False) -> None:
    """Refuse, before any work, outputs that would destroy something: an output that is one of
    the inputs, two outputs on one path, a path that is not a regular file (a folder, a FIFO, a
    device), or an existing file hubless did not write (unless ``overwrite``)."""
    from hubless.storage.arrays import split_key

    seen: dict[Path, str] = {}
    sources = {}
    for flag, value in inputs.items():
        if value is not None:
            file, _ = split_key(value) if isinstance(value, Path) else (Path(str(value)), None)
            sources[Path(file).resolve()] = flag
    for flag, path in outputs.items():
        if path is None:
            continue
        real = path.resolve()
        if real in sources:
            raise InvalidInput(f"{flag} {path} is also the input {sources[real]}: it would be overwritten; choose another path")
        if real in seen:
            raise InvalidInput(f"{flag} and {seen[real]} are the same file ({path}); give them different paths")
        seen[real] = flag
        if path.exists() or path.is_symlink():
            if not path.is_file():
                raise InvalidInput(f"{flag} {path} exists and is not a regular file (a folder, FIFO or device); choose a file path")
            if not overwrite and not _written_by_hubless(path):
                raise InvalidInput(f"{flag} {path} exists and was not written by hubless; pass --overwrite to replace it")


def warn_coverage(report, losses=None, metric: str = "R@1") -> None:
    """Print the low-coverage warning a bank deserves (see :func:`hubless.banks.coverage_warning`):
    before anything is measured (``losses`` None), or once the corrections were measured with the
    bank, only when some of them (``losses``) did worse than the baseline. ``report`` comes from
    the pass that fits the corrections (None: no query bank)."""
    if report is None:
        return
    from hubless.banks import coverage_warning

    warning = coverage_warning(report, losses, metric)
    if warning:
        print_note(warning, "warning")


def print_results(ev, title: str) -> None:
    """The evaluation as one rich table: a row per method."""
    from hubless.reports.evaluation import results_rows

    rows = results_rows(ev)
    from rich.table import Table

    table = Table(title=title)
    for col in rows[0]:
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=col != "method")
    for row in rows:
        table.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row.values()))
    console = wide_console()
    console.print(table)


def write_evaluation(ev, out: Path | None, report: Path | None, progress: bool | None = None) -> None:
    """Write an :class:`~hubless.evaluation.Evaluation` as JSON to ``out`` and as an HTML report
    to ``report`` (each when given), saying where."""
    write_tuning(None, ev, out, report, progress)


def write_tuning(tuned, ev, out: Path | None, report: Path | None, progress: bool | None = None) -> None:
    """Write a :class:`~hubless.evaluation.TuneResult` (None: an evaluation alone) and the test
    evaluation ``ev`` (or None) as JSON to ``out`` and as an HTML report to ``report`` (a
    spinner while the report's plots are drawn, by ``progress``)."""
    from hubless._atomic import write_json
    from hubless.progress import stage

    if out is not None:
        data = ev.to_dict() if tuned is None else {**tuned.to_dict(), **({} if ev is None else {"test": ev.to_dict()})}
        write_json(out, {**generator_mark(), **data})
        typer.echo(f"results: {out}")
    if report is not None:
        from hubless.reports.evaluation import evaluation_report, tune_report

        with stage(f"writing the report {report}", progress):
            if tuned is None:
                evaluation_report(ev, report)
            else:
                tune_report(tuned, report, ev)
        typer.echo(f"report: {report}")
