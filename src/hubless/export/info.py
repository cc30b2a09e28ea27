"""What :func:`hubless.export.describe` returns: :class:`StoreInfo`, a typed view of the hubless
info a store keeps with its table, that still reads as the dict it was (``describe(uri)["ann"]``,
``dict(info)``, the keys in the stored order, equality with a dict); :meth:`StoreInfo.to_dict`
gives the plain dict."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["StoreInfo"]


class StoreInfo(Mapping[str, Any]):
    """A store's info, as :meth:`hubless.export.base.VectorStore.describe` reads it: the format
    version, the correction's ``spec``, the ``model``, the ``metric``, ``dim`` and
    ``bias_columns``, ``n_items``, the ``query_state`` the scores read (DN's means, IS's bank
    size), the ``metadata_columns`` (name -> type), the ``layout`` of the stored vectors and the
    ``ann`` index with its knob and measured curve (None: searched exactly). Keys a store keeps
    beyond these stay readable by name; a value is a copy (changing it changes nothing)."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data: dict[str, Any] = copy.deepcopy(dict(data))

    @property
    def format_version(self) -> int:
        return int(self._data["format_version"])

    @property
    def spec(self) -> str:
        return str(self._data["spec"])

    @property
    def model(self) -> str | None:
        model = self._data.get("model")
        return None if model is None else str(model)

    @property
    def metric(self) -> str:
        return str(self._data.get("metric", "dot"))

    @property
    def dim(self) -> int:
        return int(self._data["dim"])

    @property
    def bias_columns(self) -> int:
        return int(self._data["bias_columns"])

    @property
    def n_items(self) -> int:
        return int(self._data["n_items"])

    @property
    def query_state(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self._data.get("query_state") or {}))

    @property
    def metadata_columns(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self._data.get("metadata_columns") or {}))

    @property
    def layout(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self._data.get("layout") or {}))

    @property
    def ann(self) -> dict[str, Any] | None:
        ann = self._data.get("ann")
        return None if ann is None else copy.deepcopy(dict(ann))

    def to_dict(self) -> dict[str, Any]:
        """The plain dict (what ``describe()`` returned before)."""
        return copy.deepcopy(self._data)

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._data))

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"StoreInfo({self._data!r})"
