"""What :meth:`hubless.Index.info` returns: :class:`IndexInfo`, a typed description of an index
(sizes, the method, the banks, the metadata columns and its :class:`~hubless.index.IndexConfig`)
that still reads as the dict it was: ``info["dim"]``, ``dict(info)``, ``{**info}``,
``info.items()`` and ``info == {...}`` behave as before, and :meth:`IndexInfo.to_dict` gives
the plain dict (the JSON, the CLI table and the HTTP answer are built from it)."""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from hubless.index.config import IndexConfig

__all__ = ["IndexInfo"]


@dataclass(frozen=True, eq=False)
class IndexInfo(Mapping[str, Any]):
    """An index's description. ``method``: the correction's spec; ``n_items``: live items;
    ``dim``: the embeddings' dimension; ``bias_columns``: the bias's columns in the FAISS rows;
    ``normalize``: whether rows are L2-normalised; ``n_query_bank`` / ``n_gallery_bank``: the
    banks the biases come from (None: not used / none); ``banks_kept``: whether the banks are
    stored; ``metadata_columns``; ``next_id``: the id the next added item gets; ``config``: how
    it was built and is searched (its fields are keys of the mapping too: ``info["factory"]``)."""

    method: str
    n_items: int
    dim: int
    bias_columns: int
    normalize: bool
    n_query_bank: int | None
    n_gallery_bank: int | None
    banks_kept: bool
    metadata_columns: list[str]
    next_id: int
    config: IndexConfig

    def to_dict(self) -> dict[str, Any]:
        """The plain dict: these fields, then the config's (what ``Index.info()`` returned before)."""
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "config"}
        return {**out, **self.config.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IndexInfo:
        """Inverse of :meth:`to_dict` (the config's fields checked as :class:`IndexConfig` does)."""
        own = {f.name for f in fields(cls)} - {"config"}
        return cls(
            **{k: v for k, v in data.items() if k in own}, config=IndexConfig.from_dict({k: v for k, v in data.items() if k not in own})
        )

    def __getitem__(self, key: str) -> Any:
        if key in _OWN:
            return getattr(self, key)
        if key in _CONFIG:
            return copy.deepcopy(getattr(self.config, key))  # a copy, as the dict held
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


_OWN = frozenset(f.name for f in fields(IndexInfo)) - {"config"}
_CONFIG = frozenset(f.name for f in fields(IndexConfig))
