"""The errors hubless raises: one base class, :class:`HublessError`, and a few kinds.

Every error hubless raises on purpose (bad input, a missing file or id, a conflict with what
exists, a busy lock, damaged data, a missing optional package) is a :class:`HublessError`.
Each kind also derives from the builtin a caller would catch without knowing hubless, so
``except ValueError`` still catches :class:`InvalidInput`, ``except KeyError`` catches
:class:`NotFound`, ``except FileNotFoundError`` catches :class:`MissingFile`, and so on.

The command line and the HTTP service map *only* these to user-facing errors:

============================  =================================  =========  ==========
kind                          builtin(s)                         CLI exit   HTTP status
============================  =================================  =========  ==========
:class:`InvalidInput`         ValueError                         2          422
:class:`InvalidType`          ValueError, TypeError              2          422
:class:`NotFitted`            ValueError, AttributeError         2          422
:class:`NotFound`             KeyError                           2          404
:class:`MissingFile`          KeyError, FileNotFoundError        2          404
:class:`Conflict`             ValueError                         2          409
:class:`AlreadyExists`        ValueError, FileExistsError        2          409
:class:`Busy`                 TimeoutError                       2          503
:class:`Corrupt`              ValueError                         2          500
:class:`MissingDependency`    ImportError                        2          500
:class:`Incomplete`           RuntimeError                       2          500
============================  =================================  =========  ==========

Anything else that escapes is a bug: the CLI says so and exits 1 (the traceback with
``--debug`` or ``HUBLESS_DEBUG=1``), the service answers a 500 without details.
"""

from __future__ import annotations

from hubless._deprecation import deprecated_names

__all__ = [
    "AlreadyExists",
    "Busy",
    "Conflict",
    "Corrupt",
    "HublessError",
    "Incomplete",
    "InvalidInput",
    "InvalidType",
    "MissingDependency",
    "MissingFile",
    "MissingInput",
    "NotFitted",
    "NotFound",
    "check_available",
    "message",
    "optional_import",
]


class HublessError(Exception):
    """Base class of every error hubless raises on purpose (see the module docstring)."""


class InvalidInput(HublessError, ValueError):
    """An argument, file content or request field is not acceptable (shape, NaN, range, ...)."""


class InvalidType(InvalidInput, TypeError):
    """An argument of the wrong type (also a TypeError, as Python's own would be)."""


class NotFitted(InvalidInput, AttributeError):
    """A correction (or an index) was used before it was fitted.

    Subclasses ValueError and AttributeError, as scikit-learn's ``NotFittedError`` does, so code
    written for scikit-learn estimators catches it.
    """


class MissingInput(InvalidInput):
    """A required input was not given. ``argument`` is its Python name (``gallery_bank``); the
    message names it as a keyword argument, and :meth:`for_cli` as the command-line flag."""

    def __init__(self, argument: str, template: str) -> None:
        self.argument, self.template = argument, template
        super().__init__(template.format(arg=f"{argument}=..."))

    def for_cli(self) -> str:
        return self.template.format(arg="--" + self.argument.replace("_", "-"))


class NotFound(HublessError, KeyError):
    """Something named does not exist: an item id, an index, a table, an array in a file."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingFile(NotFound, FileNotFoundError):
    """A file or folder named by the caller does not exist."""

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else OSError.__str__(self)


class Conflict(HublessError, ValueError):
    """The request contradicts what exists: a duplicate id, an index of another model, ..."""


class AlreadyExists(Conflict, FileExistsError):
    """The target exists and would be replaced (pass ``overwrite=True`` / ``--overwrite``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if len(self.args) == 1 else OSError.__str__(self)


class Busy(HublessError, TimeoutError):
    """A lock was held by another writer for longer than the timeout; retry later."""


class Corrupt(HublessError, ValueError):
    """Saved data is damaged, truncated or was altered (a checksum or a size differs)."""


class Incomplete(HublessError, RuntimeError):
    """A resumable job stopped before it finished; running it again completes it."""


class MissingDependency(HublessError, ImportError):
    """An optional package is needed: the message names the extra that installs it."""

    def __init__(self, what: str, package: str, extra: str, detail: str = "") -> None:
        self.package, self.extra = package, extra
        self.install = f"pip install 'hubless[{extra}]'"
        super().__init__(f"{what} needs {package}: {self.install}" + (f" ({detail})" if detail else ""))


def message(exc: BaseException) -> str:
    """The one-line text of an error (for the CLI and the service)."""
    if isinstance(exc, MissingInput):
        return exc.for_cli()
    text = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(str(text).split()) or type(exc).__name__


def check_available(module: str, what: str, extra: str, package: str | None = None) -> None:
    """Raise :class:`MissingDependency` now, before any work, when ``module`` is not
    installed (checked without importing it)."""
    import sys
    from importlib.util import find_spec

    if module in sys.modules:  # imported already, or blocked (None)
        found = sys.modules[module] is not None
    else:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
    if not found:
        raise MissingDependency(what, package or module, extra)


#: The names used before (until 0.2.0, with a DeprecationWarning): the kinds are named as
#: NotFound, MissingFile and MissingDependency are.
__getattr__ = deprecated_names(
    __name__,
    {
        "NotFittedError": "hubless.errors:NotFitted",
        "MissingInputError": "hubless.errors:MissingInput",
        "MissingDependencyError": "hubless.errors:MissingDependency",
    },
)


def optional_import(module: str, what: str, extra: str, package: str | None = None):
    """The one way hubless imports an optional package: ``module`` (e.g. ``"pyarrow.parquet"``)
    imported, or :class:`MissingDependency` saying that ``what`` needs ``package`` (default: the
    module's top-level name) and which extra installs it. A package that is installed but fails
    to import says so too (the original error is chained)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and exc.name is not None and module.startswith(exc.name)
        detail = "" if missing else f"it is installed but importing {module} failed: {exc}"  # a missing library, a version clash
        raise MissingDependency(what, package or module.partition(".")[0], extra, detail) from exc
