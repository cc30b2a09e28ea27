"""An attached collection served by :class:`~hubless.search.Searcher` as an index is:
:class:`AttachedIndex`, read only.

An attached collection (a sidecar directory written by ``hubless attach``, see
:mod:`hubless.attached`) or an :class:`hubless.attached.AttachedCollection`, given where an index is
expected, is opened as an :class:`AttachedIndex` on the collection its sidecar names
(:func:`as_attached`). Its search is the attached search
(:meth:`hubless.attached.AttachedCollection.search_certified`: a :class:`~hubless.Hits` whose
``certified`` and ``exact`` say, per query, which promise its answer keeps, and whose ``found``
mask says which slots hold a hit, any int64 being an id), ``compare`` is the store's own plain
ranking, and the hits' metadata is the store's payload (none for a FAISS file)
(:func:`search_attached`). Before each answer the collection is checked as
:mod:`hubless.attached.checks` says (a FAISS file rewritten under a running server is compared
whole, any other change refused until ``hubless attach --update``). A write goes to the store,
then ``hubless attach --update``; filters, reranking and versions are refused, naming why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hubless._validation import check_top_k
from hubless.errors import Conflict, InvalidInput
from hubless.hits import Hits

__all__ = ["AttachedIndex", "as_attached", "search_attached"]


@dataclass
class _Rows:
    embeddings: np.ndarray


class AttachedIndex:
    """An attached collection (:class:`hubless.attached.AttachedCollection`) seen as a served,
    read-only index: what :class:`Searcher` and the service read of an index (size, method,
    weight, dimension, membership, an item's vector, metadata records), its search the certified
    attached one. Open one with :meth:`open` on a sidecar directory (the collection is the one
    the sidecar names, opened with the options it was attached with) or wrap an open collection."""

    read_only = True
    model = None  # an attached collection records no model: embedding and item queries
    factory = None
    metadata_schema = None
    query_bank = None
    gallery_bank = None
    keep_versions = 0

    def __init__(self, collection, path: Path | None = None) -> None:
        self.collection = collection
        self.path = path

    @classmethod
    def open(cls, sidecar) -> AttachedIndex:
        """The collection named in sidecar directory ``sidecar``, checked against its
        fingerprint (:class:`~hubless.errors.Conflict` when it changed since)."""
        from hubless.attached import AttachedCollection

        return cls(AttachedCollection.from_sidecar(sidecar), Path(sidecar))

    def snapshot(self) -> AttachedIndex:
        return self

    def refresh(self) -> None:
        """Nothing to catch up with: each search checks the collection first (see
        :mod:`hubless.attached.checks`)."""

    @property
    def ntotal(self) -> int:
        return self.collection.ntotal

    @property
    def method(self) -> str:
        return self.collection.spec

    @property
    def weight_param(self) -> str | None:
        return self.collection.correction.weight_param

    @property
    def weight(self) -> float | None:
        name = self.weight_param
        return None if name is None else float(getattr(self.collection.correction, name))

    @property
    def has_metadata(self) -> bool:
        return self.collection.source.kind != "faiss"  # a FAISS index file keeps no payload

    def info(self) -> dict:
        """The index-like description: method, dimension, size, ``kind`` "attached" and the
        store's ``source`` kind (not its address, which may hold credentials)."""
        side = self.collection.sidecar.info
        return {
            "kind": "attached",
            "source": self.collection.source.kind,
            "method": self.method,
            "dim": int(side["dim"]),
            "normalize": bool(side["normalize"]),
            "n_items": self.ntotal,
            "metadata_columns": [],
            "reserve": int(self.collection.reserve_ids.size),
        }

    def __contains__(self, item_id) -> bool:
        ids = self.collection.sidecar.ids
        at = int(np.searchsorted(ids, int(item_id)))
        return at < ids.size and int(ids[at]) == int(item_id)

    def get(self, ids) -> _Rows:
        """The stored vectors of ``ids`` (read from the store)."""
        return _Rows(self.collection.source.fetch(np.asarray(ids, np.int64)))

    def records(self, ids) -> list[dict]:
        """The store's payloads of ``ids`` (one dict per id)."""
        return self.collection.source.payloads(np.asarray(ids, np.int64))

    def search(self, queries, top_k: int, **options) -> Hits:
        return self.collection.search(queries, top_k, **options)

    def search_certified(self, queries, top_k: int, **options) -> Hits:
        return self.collection.search_certified(queries, top_k, **options)

    def search_uncorrected(self, queries, top_k: int, **knobs) -> Hits:
        """The store's own plain top-``top_k`` (the store is asked at most its item count; the
        slots past it are not found: the one top-k rule)."""
        top_k = check_top_k(top_k, self.ntotal, "the collection")
        plain = self.collection.source.search(np.asarray(queries, np.float32), min(top_k, max(self.ntotal, 1)), **knobs)
        missing = top_k - plain.top_k
        if missing <= 0:
            return plain
        pad = np.zeros((plain.n_queries, missing))
        return Hits.from_found(
            np.hstack([plain.scores, pad]), np.hstack([plain.ids, pad.astype(np.int64)]), np.hstack([plain.found, pad.astype(bool)])
        )

    def _refuse(self, *args, **kwargs):
        raise Conflict(
            f"{self.collection.source.uri} is an attached collection, served read only: write to the store itself, "
            "then run hubless attach --update"
        )

    add = remove = delete = update_metadata = add_bank = restore = _refuse


def as_attached(value) -> AttachedIndex | None:
    """``value`` as an attached collection when it is one (a sidecar directory or an
    AttachedCollection), else None."""
    from hubless.attached import AttachedCollection
    from hubless.attached.sidecar import is_sidecar

    if isinstance(value, AttachedIndex):
        return value
    if isinstance(value, AttachedCollection):
        return AttachedIndex(value)
    if isinstance(value, (str, os.PathLike)) and is_sidecar(value):
        return AttachedIndex.open(value)
    return None


def search_attached(fields: dict, current: AttachedIndex, vectors, top_k: int, options: dict, *, compare: bool, rerank: bool) -> Hits:
    """:meth:`Searcher.search` on an attached collection: the attached search's
    :class:`~hubless.Hits` (``certified`` and ``exact`` per query, ``found`` masks), the store's
    plain ranking for ``compare``, the store's payloads as metadata; ``fields``: the result's
    ``index``, ``method`` and ``queries``."""
    if rerank:
        raise InvalidInput(f"{fields['index']!r} is an attached collection: reranking is not offered on it")
    if "where" in options:
        raise InvalidInput(f"{fields['index']!r} is an attached collection: metadata filters (where) are not offered on it")
    hits = current.search_certified(vectors, top_k, **options)
    if compare:
        knobs = {k: v for k, v in options.items() if k != "weight"}
        hits = hits.with_fields(uncorrected=current.search_uncorrected(vectors, top_k, **knobs))
    if current.has_metadata:
        ids = hits.shown_ids()
        fields = {**fields, "metadata": dict(zip(ids.tolist(), current.records(ids)))}
    return hits.with_fields(**fields)
