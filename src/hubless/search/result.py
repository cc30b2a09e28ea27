"""What a search through :class:`~hubless.search.Searcher` returns: :class:`SearchResult`, the
ids and scores of each query's hits (with the uncorrected ranking when compared, the first-stage
scores when reranked, an attached collection's certificates), and its JSON-ready records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["SearchResult"]


@dataclass
class SearchResult:
    """What :meth:`Searcher.search` returns, each array (n_queries, top_k): ``ids`` (the items'
    ids; -1 for a slot that could not be filled) and ``scores`` (the method's own, or
    the reranker's with ``reranked``); ``uncorrected`` = (scores, ids) of the plain inner-product
    ranking when compared; ``first_stage_scores`` when reranked; ``queries``: the texts or image
    names given (else None)."""

    index: str
    method: str
    ids: np.ndarray
    scores: np.ndarray
    metadata: dict[int, dict] | None = None  # the records of the items in the results, by id
    uncorrected: tuple[np.ndarray, np.ndarray] | None = None
    first_stage_scores: np.ndarray | None = None
    reranked: bool = False
    rerank_k: int | None = None
    queries: list[str] | None = None
    #: an attached collection's search: per query, whether its answer is certified exact
    certified: np.ndarray | None = None

    def hits(self, row: int) -> list[dict]:
        """The found hits of query ``row``, best first: id, score (None when not finite), the
        item's metadata (when the index has some); with compare, each hit's uncorrected rank and
        rank change (None: not in the uncorrected top k); when reranked, the first-stage score."""
        found = self.ids[row] >= 0
        out = [self._hit(j, v) for j, v in zip(self.ids[row][found], self.scores[row][found])]
        if self.first_stage_scores is not None:
            for h, f in zip(out, self.first_stage_scores[row][found]):
                h["first_stage_score"] = _finite(f)
        if self.uncorrected is not None:
            before = {int(j): r for r, j in enumerate(self.uncorrected[1][row], start=1) if j >= 0}
            for rank, h in enumerate(out, start=1):
                h["uncorrected_rank"] = before.get(h["id"])
                h["rank_change"] = None if h["uncorrected_rank"] is None else h["uncorrected_rank"] - rank
        return out

    def uncorrected_hits(self, row: int) -> list[dict]:
        """The uncorrected top k of query ``row`` (compare only)."""
        assert self.uncorrected is not None  # compare=True
        scores, ids = self.uncorrected
        found = ids[row] >= 0
        return [self._hit(j, v) for j, v in zip(ids[row][found], scores[row][found])]

    def records(self) -> list[dict]:
        """One JSON-ready dict per query: ``query`` (its position), ``text`` (when texts or images
        were given), ``hits`` and, with compare, ``uncorrected``."""
        out = []
        for row in range(self.ids.shape[0]):
            record: dict[str, Any] = {"query": row}
            if self.queries is not None:
                record["text"] = self.queries[row]
            if self.certified is not None:
                record["certified"] = bool(self.certified[row])
            record["hits"] = self.hits(row)
            if self.uncorrected is not None:
                record["uncorrected"] = self.uncorrected_hits(row)
            out.append(record)
        return out

    def _hit(self, item_id, score) -> dict:
        hit: dict[str, Any] = {"id": int(item_id), "score": _finite(score)}
        if self.metadata is not None:
            hit["metadata"] = self.metadata[int(item_id)]
        return hit


def _finite(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None
