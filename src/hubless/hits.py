"""What every search in hubless returns: :class:`Hits`.

One result type for a correction's search, an index's, an attached collection's, an exported
store's, a reranked search and the :class:`~hubless.search.Searcher` under the CLI and the
service. Each array is (n_queries, top_k), best first:

- ``scores``: float32, the method's own scores (the reranker's when ``reranked``);
- ``ids``: int64, the items' ids (gallery positions for a :class:`~hubless.Correction`);
- ``found``: bool, which slots hold a hit. A slot that could not be filled (fewer items, or
  fewer matching a filter, than ``top_k``; an ANN structure that ran dry) is ``False``, comes
  last in its row, and has id -1 and score -inf *as padding only*: whether a slot is a hit is
  read from ``found``, never from its id, so any int64 is an id (-1 included).

and per query, where the search gives them: ``certified`` (an attached collection's answer is
exact relative to the store's plain ranking), ``exact`` (the answer equals the exact corrected
search over the collection as it is now), ``candidates`` (the k' each query was answered with).
A reranked search (:class:`hubless.Pipeline`, ``Searcher.search(rerank=True)``) also gives, per
slot, ``first_stage_scores`` and ``rerank_scores``, and the seconds of each stage
(:attr:`Hits.seconds`); a search through the :class:`~hubless.search.Searcher` names its
``index``, ``method`` and ``queries`` and looks up the ``metadata`` of the items it shows;
``compare`` adds the ``uncorrected`` ranking, itself a :class:`Hits`.

A :class:`Hits` unpacks as the ``(scores, ids)`` pair searches returned before
(``scores, ids = index.search(q)``; ``hits[0]``, ``hits[1]``), so code written for the pair keeps
working; everything else is a named field.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import numpy as np

__all__ = ["PADDING_ID", "Hits"]

_H = TypeVar("_H", bound="Hits")

#: The id of an unfilled slot. Padding only: ``Hits.found`` says which slots are hits.
PADDING_ID = -1


@dataclass(eq=False)
class Hits:
    """The hits of a batch of queries (see the module docstring). Build one with
    :meth:`from_found` or :meth:`padded`; read one query's hits with :meth:`hits` and every
    query's, JSON-ready, with :meth:`records`."""

    scores: np.ndarray
    ids: np.ndarray
    found: np.ndarray
    #: per query: the answer is exact relative to the store's plain ranking (attached collections)
    certified: np.ndarray | None = None
    #: per query: the answer equals the exact corrected search over the collection as it is now
    exact: np.ndarray | None = None
    #: per query: the number of candidates (k') the answer was re-scored from
    candidates: np.ndarray | None = None
    #: the records of the items in the results, by id (indexes with metadata, stores' payloads)
    metadata: dict[int, dict] | None = None
    #: the plain inner-product ranking of the same queries (a search with ``compare``)
    uncorrected: Hits | None = None
    #: when reranked: the first-stage (corrected) scores of the same items
    first_stage_scores: np.ndarray | None = None
    #: when reranked: the reranker's own scores (logits) of the same items (``scores`` are these,
    #: or the fused score with fusion)
    rerank_scores: np.ndarray | None = None
    reranked: bool = False
    rerank_k: int | None = None
    #: the index (or collection) searched and its method's spec, when known
    index: str | None = None
    method: str | None = None
    #: the texts or image names the queries were made from (else None)
    queries: list[str] | None = None
    #: anything else a search reports (timings of a reranked search: ``{"seconds": {...}}``)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.scores = np.asarray(self.scores, np.float32)
        self.ids = np.asarray(self.ids, np.int64)
        self.found = np.asarray(self.found, bool)
        if self.scores.ndim != 2 or self.ids.shape != self.scores.shape or self.found.shape != self.scores.shape:
            raise ValueError(
                f"scores, ids and found must be (n_queries, top_k) arrays of one shape; got {self.scores.shape}, {self.ids.shape}, {self.found.shape}"
            )
        for name in ("certified", "exact", "candidates"):
            value = getattr(self, name)
            if value is not None and np.shape(value) != (self.scores.shape[0],):
                raise ValueError(f"{name} must have one value per query ({self.scores.shape[0]}); got shape {np.shape(value)}")
        for name in ("first_stage_scores", "rerank_scores"):
            value = getattr(self, name)
            if value is not None and np.shape(value) != self.scores.shape:
                raise ValueError(f"{name} must have one value per slot {self.scores.shape}; got shape {np.shape(value)}")

    # ------------------------------------------------------------------ building
    @classmethod
    def from_found(cls: type[_H], scores, ids, found, **fields: Any) -> _H:
        """Hits from ``found`` slots (any order within a row is kept as given: best first), the
        unfilled slots set to the padding (id -1, score -inf)."""
        found = np.asarray(found, bool)
        scores = np.where(found, np.asarray(scores, np.float32), np.float32(-np.inf)).astype(np.float32, copy=False)
        ids = np.where(found, np.asarray(ids, np.int64), PADDING_ID).astype(np.int64, copy=False)
        return cls(scores, ids, found, **fields)

    @classmethod
    def padded(cls: type[_H], scores, ids, **fields: Any) -> _H:
        """Hits from a ``(scores, ids)`` pair padded with id -1 where the ids cannot be negative
        (gallery positions, an index's ids, which are >= 0): ``found = ids >= 0``."""
        ids = np.asarray(ids, np.int64)
        return cls.from_found(scores, ids, ids >= 0, **fields)

    @classmethod
    def empty(cls: type[_H], n_queries: int = 0, top_k: int = 0, **fields: Any) -> _H:
        """No hits: (n_queries, top_k) slots, none found."""
        shape = (n_queries, top_k)
        return cls(np.full(shape, -np.inf, np.float32), np.full(shape, PADDING_ID, np.int64), np.zeros(shape, bool), **fields)

    def widened(self: _H, top_k: int) -> _H:
        """These hits with ``top_k`` slots per query (never narrower): the added slots come last,
        not found (id -1, scores -inf), as the one top-k rule pads a search beyond its items."""
        missing = top_k - self.top_k
        if missing <= 0:
            return self

        def pad(array, value):
            return None if array is None else np.pad(array, ((0, 0), (0, missing)), constant_values=value)

        return self.with_fields(
            scores=pad(self.scores, -np.inf),
            ids=pad(self.ids, PADDING_ID),
            found=pad(self.found, False),
            first_stage_scores=pad(self.first_stage_scores, -np.inf),
            rerank_scores=pad(self.rerank_scores, -np.inf),
        )

    def with_fields(self: _H, **fields: Any) -> _H:
        """A copy with ``fields`` replaced (the arrays are shared, not copied)."""
        return replace(self, **fields)

    # ------------------------------------------------------------------ the pair
    def __iter__(self) -> Iterator[np.ndarray]:  # scores, ids = hits
        return iter((self.scores, self.ids))

    def __getitem__(self, position: int) -> np.ndarray:  # hits[0], hits[1] as the pair's
        return (self.scores, self.ids)[position]

    def __len__(self) -> int:  # the pair's length, so len(hits) == 2 as before
        return 2

    @property
    def n_queries(self) -> int:
        return int(self.scores.shape[0])

    @property
    def top_k(self) -> int:
        return int(self.scores.shape[1])

    @property
    def seconds(self) -> dict[str, float] | None:
        """The seconds each stage took, when the search measured them (a reranked search:
        ``{"first_stage": ..., "rerank": ...}``), else None; kept in :attr:`extra`."""
        return self.extra.get("seconds")

    @property
    def counts(self) -> np.ndarray:
        """The number of hits of each query (n_queries,)."""
        return self.found.sum(axis=1)

    def shown_ids(self) -> np.ndarray:
        """The distinct ids of the found slots, with the uncorrected ranking's when compared
        (sorted int64): the items whose records a search looks up for :attr:`metadata`."""
        parts = [self.ids[self.found]]
        if self.uncorrected is not None:
            parts.append(self.uncorrected.ids[self.uncorrected.found])
        return np.unique(np.concatenate(parts))

    # ------------------------------------------------------------------ reading
    def hits(self, row: int) -> list[dict]:
        """The hits of query ``row``, best first: id, score (None when not finite), the item's
        metadata (when known); with ``uncorrected``, each hit's uncorrected rank and rank change
        (None: not in the uncorrected top k); when reranked, the first-stage score."""
        found = self.found[row]
        out = [self._hit(j, v) for j, v in zip(self.ids[row][found], self.scores[row][found])]
        if self.first_stage_scores is not None:
            for h, f in zip(out, self.first_stage_scores[row][found]):
                h["first_stage_score"] = _finite(f)
        if self.uncorrected is not None:
            plain = self.uncorrected
            before = {int(j): r for r, j in enumerate(plain.ids[row][plain.found[row]], start=1)}
            for rank, h in enumerate(out, start=1):
                h["uncorrected_rank"] = before.get(h["id"])
                h["rank_change"] = None if h["uncorrected_rank"] is None else h["uncorrected_rank"] - rank
        return out

    def uncorrected_hits(self, row: int) -> list[dict]:
        """The uncorrected top k of query ``row`` (a search with ``compare`` only)."""
        if self.uncorrected is None:
            raise ValueError("these hits have no uncorrected ranking (search with compare=True)")
        plain = self.uncorrected
        found = plain.found[row]
        return [self._hit(j, v) for j, v in zip(plain.ids[row][found], plain.scores[row][found])]

    def records(self) -> list[dict]:
        """One JSON-ready dict per query: ``query`` (its position), ``text`` (when texts or images
        were given), ``certified`` / ``exact`` / ``candidates`` (when the search gives them),
        ``hits`` and, with compare, ``uncorrected``."""
        out = []
        for row in range(self.n_queries):
            record: dict[str, Any] = {"query": row}
            if self.queries is not None:
                record["text"] = self.queries[row]
            if self.certified is not None:
                record["certified"] = bool(self.certified[row])
            if self.exact is not None:
                record["exact"] = bool(self.exact[row])
            if self.candidates is not None:
                record["candidates"] = int(self.candidates[row])
            record["hits"] = self.hits(row)
            if self.uncorrected is not None:
                record["uncorrected"] = self.uncorrected_hits(row)
            out.append(record)
        return out

    def _hit(self, item_id, score) -> dict:
        hit: dict[str, Any] = {"id": int(item_id), "score": _finite(score)}
        if self.metadata is not None:
            hit["metadata"] = self.metadata.get(int(item_id))
        return hit

    def __repr__(self) -> str:
        flags = [name for name in ("certified", "exact", "candidates", "uncorrected") if getattr(self, name) is not None]
        more = f", with {', '.join(flags)}" if flags else ""
        return f"Hits({self.n_queries} queries x top {self.top_k}, {int(self.found.sum())} found{more})"


def _finite(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
