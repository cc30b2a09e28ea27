"""Entry point of the ``hubless`` command. Each sub-command lives in its own module."""

from __future__ import annotations

import warnings

import typer

from hubless import __version__
from hubless.cli import bank, data, demo, index
from hubless.cli.attach import attach_command
from hubless.cli.augment import augment_command
from hubless.cli.embed import embed_command
from hubless.cli.eval import eval_command
from hubless.cli.export import export_command
from hubless.cli.fairness import fairness_command
from hubless.cli.methods import methods_command
from hubless.cli.score_matrices import correct_command
from hubless.cli.search_command import search_command
from hubless.cli.serve import SettingsCommand, serve_command
from hubless.cli.tune import tune_command


def _flags_show_no_type() -> None:
    """A flag (--overwrite, --no-progress, --help) takes no value, but typer 0.29's help shows each
    with a ``<bool>`` type as if it did: show none (every other option keeps its type)."""
    from typer.core import TyperOption

    original = TyperOption.display_type_rich
    if getattr(original, "hubless", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else original(self, ctx)

    display_type_rich.hubless = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_show_no_type()

app = typer.Typer(
    name="hubless",
    help="Training-free hubness corrections for text-image retrieval (NNN, QB-Norm, DBNorm, DN, CSLS, GC).",
    no_args_is_help=True,
    add_completion=False,
)


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings as one line on stderr (no source lines), each distinct message once."""
    from hubless.cli._common import print_note

    text = " ".join(str(message).split())
    if text not in _shown_warnings:
        _shown_warnings.add(text)
        print_note(text, "warning")


_shown_warnings: set[str] = set()


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"hubless {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True, help="Show the version and exit."),
    debug: bool = typer.Option(False, "--debug", help="Show the traceback of an unexpected error (a bug) instead of one line."),
) -> None:
    """hubless: better, fairer cross-modal retrieval without retraining."""
    from hubless.cli._common import DEBUG

    DEBUG["on"] = debug
    warnings.showwarning = _show_warning


app.command("methods")(methods_command)
app.command("demo")(demo.demo)
app.command("eval")(eval_command)
app.command("tune")(tune_command)
app.command("embed")(embed_command)
app.command("augment")(augment_command)
app.command("correct")(correct_command)
app.add_typer(data.app, name="data")
app.add_typer(bank.app, name="bank")
app.add_typer(index.app, name="index")
app.command("search")(search_command)
app.command("export")(export_command)
app.command("attach")(attach_command)
app.command("fairness")(fairness_command)
app.command("serve", cls=SettingsCommand)(serve_command)

if __name__ == "__main__":  # pragma: no cover
    app()
