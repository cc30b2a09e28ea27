"""The one way hubless deprecates a public name (the policy: CONTRIBUTING.md, "Compatibility").

A deprecated name keeps working for one minor release with a :class:`DeprecationWarning` that
names its replacement and the release that removes it (:data:`REMOVED_IN`); the warning points
at the caller's line (the first frame outside hubless), so Python's default filters show it to
the code that uses the old name and not to hubless itself.

* :func:`warn_deprecated`: warn about an old keyword, method or behaviour at the call;
* :func:`deprecated_names`: a module's ``__getattr__`` for old names of things that moved or were
  renamed (``from hubless.rerank import RerankResult`` warns and gives :class:`hubless.Hits`).
"""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["REMOVED_IN", "deprecated_names", "warn_deprecated"]

#: The release that removes what is deprecated now.
REMOVED_IN = "0.2.0"


def _outside_hubless() -> int:
    """The stacklevel of the first frame outside the hubless package (counted from the caller
    of :func:`warnings.warn` inside :func:`warn_deprecated`), counting frames as
    :func:`warnings.warn` does: the import system's own frames (an old name imported, an old
    module's first import) are skipped, not counted."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name != "hubless" and not name.startswith("hubless."):
            return level
        frame = frame.f_back
        while frame is not None and _importing(frame):
            frame = frame.f_back
        level += 1
    return 2


def _importing(frame: FrameType) -> bool:
    """Whether ``frame`` is the import system's (as :mod:`warnings` tells them)."""
    filename = frame.f_code.co_filename
    return "importlib" in filename and "_bootstrap" in filename


def warn_deprecated(old: str, new: str, *, why: str = "") -> None:
    """Warn that ``old`` is deprecated: ``"{old} is deprecated: use {new} ({why}); it is removed
    in {REMOVED_IN}"``, as a DeprecationWarning at the caller's line."""
    reason = f" ({why})" if why else ""
    warnings.warn(
        f"{old} is deprecated: use {new}{reason}; it is removed in {REMOVED_IN}", DeprecationWarning, stacklevel=_outside_hubless()
    )


def deprecated_names(module: str, old_names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) resolving each old name of ``old_names`` (old name ->
    ``"package.module:new_name"``) to the new object, with a DeprecationWarning; any other name
    is an AttributeError, as without it."""

    def __getattr__(name: str) -> Any:
        target = old_names.get(name)
        if target is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        where, _, new = target.partition(":")
        warn_deprecated(f"{module}.{name}", f"{where}.{new}")
        return getattr(importlib.import_module(where), new)

    return __getattr__
