"""Exceptions hubless raises beyond the built-in ones."""

from __future__ import annotations

__all__ = ["MissingDependencyError", "MissingInputError", "NotFittedError", "check_available"]


class NotFittedError(ValueError, AttributeError):
    """A correction (or an index) was used before it was fitted.

    Subclasses ValueError and AttributeError, as scikit-learn's ``NotFittedError`` does, so code
    written for scikit-learn estimators catches it.
    """


class MissingInputError(ValueError):
    """A required input was not given. ``argument`` is its Python name (``gallery_bank``); the
    message names it as a keyword argument, and :meth:`for_cli` as the command-line flag."""

    def __init__(self, argument: str, template: str) -> None:
        self.argument, self.template = argument, template
        super().__init__(template.format(arg=f"{argument}=..."))

    def for_cli(self) -> str:
        return self.template.format(arg="--" + self.argument.replace("_", "-"))


class MissingDependencyError(ImportError):
    """An optional package is needed: the message names the extra that installs it."""

    def __init__(self, what: str, package: str, extra: str) -> None:
        self.package, self.extra = package, extra
        self.install = f"pip install 'hubless[{extra}]'"
        super().__init__(f"{what} needs {package}: {self.install}")


def check_available(module: str, what: str, extra: str, package: str | None = None) -> None:
    """Raise :class:`MissingDependencyError` now, before any work, when ``module`` is not
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
        raise MissingDependencyError(what, package or module, extra)
