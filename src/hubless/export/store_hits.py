"""What a store's search returns (:func:`hubless.export.search`, :meth:`VectorStore.search
<hubless.export.base.VectorStore.search>`): :class:`StoreHits`, the :class:`hubless.Hits` every
search returns, with the store's payload of each hit in :attr:`~hubless.Hits.metadata` (by id;
None when the store keeps no metadata columns).

Before 0.1.0 a store's search returned the triple ``(scores, ids, metadata rows)``. Until 0.2.0
a :class:`StoreHits` still unpacks and indexes as that triple (``scores, ids, rows =
hubless.export.search(...)``, ``result[2]``; the rows rebuilt from :attr:`metadata`: per query,
per found hit, ``{"id": id, column: value, ...}``), with a DeprecationWarning; read the named
fields instead (``hits.scores``, ``hits.ids``, ``hits.metadata[id]``, ``hits.records()``). From
0.2.0 it unpacks as ``(scores, ids)``, as every other search does (the compatibility policy of
CONTRIBUTING.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from hubless._deprecation import warn_deprecated
from hubless.hits import Hits

__all__ = ["StoreHits", "store_hits"]


class StoreHits(Hits):
    """:class:`hubless.Hits` of a store's search; unpacks as the old ``(scores, ids, metadata
    rows)`` triple until 0.2.0, with a DeprecationWarning (see the module docstring)."""

    def _triple(self) -> tuple[np.ndarray, np.ndarray, list[list[dict[str, Any]]]]:
        warn_deprecated(
            "a store search's (scores, ids, metadata rows) triple",
            "its named fields: hits.scores, hits.ids, hits.metadata[id] (or hits.records())",
            why="from 0.2.0 it unpacks as (scores, ids), as every search does",
        )
        meta = self.metadata or {}
        rows = [[{"id": int(i), **meta.get(int(i), {})} for i in self.ids[q][self.found[q]]] for q in range(self.n_queries)]
        return self.scores, self.ids, rows

    def __iter__(self) -> Iterator[Any]:  # scores, ids, rows = hubless.export.search(...)  (deprecated)
        return iter(self._triple())

    def __getitem__(self, position: Any) -> Any:  # hits[0], hits[1], hits[:2] as before; hits[2] (deprecated)
        picked = range(3)[position]
        pair = (self.scores, self.ids)
        if isinstance(picked, int):
            return pair[picked] if picked < 2 else self._triple()[2]
        return tuple(pair[i] for i in picked) if 2 not in picked else self._triple()[position]

    def __len__(self) -> int:
        return 3


def store_hits(scores: np.ndarray, ids: np.ndarray, rows: list, *, metadata: bool) -> StoreHits:
    """The hits of a store search from its padded ``(scores, ids)`` (unfilled slots: id -1;
    a store's ids are an index's, >= 0) and the rows of its found hits (``{"id": ..., column:
    value}``); ``metadata``: whether the store keeps metadata columns."""
    by_id = {int(row["id"]): {k: v for k, v in row.items() if k != "id"} for hits in rows for row in hits} if metadata else None
    ids = np.asarray(ids, np.int64)
    return StoreHits.from_found(scores, ids, ids >= 0, metadata=by_id)
