"""Query batches: validated queries, this call's weight, and their raw-neighbour statistics.

Some corrections need to know something about each query's *uncorrected* neighbours before they
can rank: the dynamic variants (DIS, DualDIS) gate the bias by the query's raw top-1 gallery item,
and CSLS shows 2s - r_q - r_r with r_q the mean of the query's k largest raw similarities. A
correction states this as a :class:`QueryRequest` (as it states its bank needs as a
:class:`~hubless.engine.StatisticsRequest`); whoever computes the raw neighbours (exact search, a
block of similarities already at hand, a FAISS index, a vector database) fills a
:class:`QueryStatistics`, so no caller has to know which method needs what.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hubless.errors import InvalidInput

__all__ = ["QueryBatch", "QueryRequest", "QueryStatistics"]


@dataclass(frozen=True)
class QueryRequest:
    """What a correction needs about each query's raw (uncorrected) gallery neighbours.

    ``top1``: the id of the raw nearest gallery item (DIS/DualDIS gates). ``topk``: the ``topk``
    largest raw similarities (CSLS's r_q; only for its displayed scores, never for ranking).
    """

    top1: bool = False
    topk: int = 0

    @property
    def depth(self) -> int:
        """How many raw neighbours per query satisfy the request (0: nothing needed)."""
        return max(int(self.top1), self.topk)

    def merge(self, other: QueryRequest) -> QueryRequest:
        return QueryRequest(top1=self.top1 or other.top1, topk=max(self.topk, other.topk))


@dataclass(frozen=True)
class QueryStatistics:
    """Raw-neighbour statistics of a batch of queries (see :class:`QueryRequest`).

    ``top1`` (n_queries,) int64: raw nearest gallery item; ``topk`` (n_queries, k) float32:
    largest raw similarities, descending. Either is None when not requested.
    """

    top1: np.ndarray | None = None
    topk: np.ndarray | None = None

    @classmethod
    def from_neighbours(cls, request: QueryRequest, scores: np.ndarray, ids: np.ndarray) -> QueryStatistics:
        """From a raw top-``request.depth`` search: ``scores``/``ids`` (n_queries, >= depth),
        best first (ties to the lower id)."""
        if scores.shape[1] < request.depth:
            raise InvalidInput(f"raw neighbour lists have {scores.shape[1]} entries; the correction needs {request.depth}")
        return cls(
            top1=np.ascontiguousarray(ids[:, 0], dtype=np.int64) if request.top1 else None,
            topk=np.ascontiguousarray(scores[:, : request.topk], dtype=np.float32) if request.topk else None,
        )

    @classmethod
    def from_similarities(cls, request: QueryRequest, sims: np.ndarray) -> QueryStatistics:
        """From the raw similarities of the queries to the *whole* gallery (n_queries, n_gallery)."""
        top1 = np.argmax(sims, axis=1).astype(np.int64) if request.top1 else None  # first maximum: lower id
        topk = None
        if request.topk:
            n = sims.shape[1]
            part = np.partition(sims, n - request.topk, axis=1)[:, n - request.topk :]
            topk = -np.sort(-part, axis=1)
        return cls(top1=top1, topk=topk)

    def rows(self, start: int, stop: int) -> QueryStatistics:
        return QueryStatistics(
            top1=None if self.top1 is None else self.top1[start:stop],
            topk=None if self.topk is None else self.topk[start:stop],
        )

    def satisfies(self, request: QueryRequest) -> bool:
        return (not request.top1 or self.top1 is not None) and (
            not request.topk or (self.topk is not None and self.topk.shape[1] >= request.topk)
        )


@dataclass
class QueryBatch:
    """Queries ready to be ranked by one correction (made by ``Correction.queries``).

    ``vectors`` (n_queries, d) validated float32; ``weight``: this call's override of the
    correction's weight (None: the fitted value; a scalar or one value per query, float64);
    ``statistics``: raw-neighbour statistics, filled in when first needed.
    """

    vectors: np.ndarray
    weight: np.ndarray | None = None
    statistics: QueryStatistics | None = None

    def __len__(self) -> int:
        return self.vectors.shape[0]

    def rows(self, start: int, stop: int) -> QueryBatch:
        """The queries ``start:stop`` with their weights and statistics."""
        weight = self.weight
        if weight is not None and weight.ndim == 1:
            weight = weight[start:stop]
        stats = None if self.statistics is None else self.statistics.rows(start, stop)
        return replace(self, vectors=self.vectors[start:stop], weight=weight, statistics=stats)
