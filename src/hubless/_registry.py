"""Registries: name -> class for corrections, encoders, rerankers and vector stores (by URI
scheme), one per package.

A class registers itself with the registry's decorator in its own module::

    @CORRECTIONS.register
    class MyCorrection(AdditiveCorrection):
        name = "mine"
        ...

and every module of the registry's package is imported on the first lookup, so a new
correction, encoder or reranker is added in one file: no list elsewhere to edit. A registry is
a read-only mapping (``"nnn" in METHODS``, ``METHODS["nnn"]``, ``list(METHODS)``), ordered by
``sort_key`` (registration order by default); an unknown name raises
:class:`~hubless.errors.InvalidInput` listing the valid ones.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from hubless.errors import Conflict, InvalidInput

__all__ = ["Registry"]

T = TypeVar("T")
_NAME = re.compile(r"[a-z][a-z0-9_+-]*")  # "+" for URI schemes such as qdrant+http


class Registry(Mapping[str, T], Generic[T]):
    """Name -> class, filled by :meth:`register` as the modules of ``package`` are imported.

    ``what`` names the kind of thing in messages ("method", "encoder kind"); ``names_of(cls)``
    gives the names a class registers under (default: its ``name`` attribute); ``sort_key``
    orders the entries (default: registration order)."""

    def __init__(
        self,
        what: str,
        package: str,
        *,
        names_of: Callable[[Any], tuple[str, ...]] | None = None,
        sort_key: Callable[[Any], Any] | None = None,
    ) -> None:
        self.what, self.package = what, package
        self._names_of = names_of or (lambda cls: (cls.__dict__.get("name", ""),))
        self._sort_key = sort_key
        self._entries: dict[str, T] = {}
        self._discovered = False
        self._lock = threading.RLock()

    def register(self, cls: T) -> T:
        """Class decorator: add ``cls`` under its names (each lowercase, unique)."""
        names = self._names_of(cls)
        for name in names:
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise InvalidInput(
                    f"{getattr(cls, '__name__', cls)!r}: a {self.what} name must be lowercase letters, digits, -, + or _; got {name!r}"
                )
            have = self._entries.get(name)
            if have is not None and have is not cls:
                raise Conflict(f"{self.what} {name!r} is registered twice: by {have!r} and by {cls!r}")
        for name in names:
            self._entries[name] = cls
        return cls

    def _discover(self) -> dict[str, T]:
        """Import every module of the package once (each registers its classes), then order."""
        if not self._discovered:
            with self._lock:
                if not self._discovered:
                    package = importlib.import_module(self.package)
                    for module in pkgutil.iter_modules(package.__path__, self.package + "."):
                        importlib.import_module(module.name)
                    self._discovered = True
        key = self._sort_key
        if key is None:
            return self._entries
        return dict(sorted(self._entries.items(), key=lambda item: key(item[1])))

    def get_class(self, name: str) -> T:
        """The class registered as ``name`` (case-insensitive), or InvalidInput naming the choices."""
        key = str(name).strip().lower()
        entries = self._discover()
        if key not in entries:
            raise InvalidInput(f"unknown {self.what} {name!r}; choose from {', '.join(entries)}")
        return entries[key]

    def __getitem__(self, name: str) -> T:
        return self._discover()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._discover())

    def __len__(self) -> int:
        return len(self._discover())

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self)})"
