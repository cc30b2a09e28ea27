"""Retrieve with a (corrected) bi-encoder, rerank the top k with a cross-encoder
("Retrieve Fast, Rerank Smart", Geigle et al. 2022).

    pipe = hubless.Pipeline(nnn, load_reranker("Salesforce/blip-itm-base-coco"), k=20,
                            gallery_items=image_paths)
    result = pipe.search(query_embeddings, query_texts, top_k=10)

The cross-encoder only sees the k first-stage candidates of each query, so its cost grows with
k, not with the gallery. Fusion (optional; the paper found plain reranking best):
"add": f * s_bi + (1 - f) * sigmoid(logit), with f the ``fusion_weight``; "norm_add": the same
after min-max normalising both scores within each query's k candidates. (``fusion_weight`` was
called ``lam``, which is also DN's weight; ``lam=`` still works, with a DeprecationWarning.)
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hubless._validation import check_positive_int
from hubless.errors import InvalidInput, InvalidType
from hubless.progress import progress_bar

__all__ = ["Pipeline", "RerankResult", "fuse"]

FUSIONS = (None, "add", "norm_add")


@dataclass
class RerankResult:
    """Reranked results, each (n_queries, top_k): ``ids`` (gallery positions), ``scores`` (the
    final ranking score: the cross-encoder logit, or the fused score), ``first_stage_scores``
    and ``rerank_scores`` (logits) of the same items; ``seconds`` spent in each stage."""

    ids: np.ndarray
    scores: np.ndarray
    first_stage_scores: np.ndarray
    rerank_scores: np.ndarray
    seconds: dict[str, float]


def _minmax(x: np.ndarray) -> np.ndarray:
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    return np.where(hi > lo, (x - lo) / np.where(hi > lo, hi - lo, 1.0), 0.5)


def fuse(first: np.ndarray, logits: np.ndarray, fusion: str | None, fusion_weight: float) -> np.ndarray:
    """The final score of each candidate (see the module docstring)."""
    lam = fusion_weight
    if fusion is None:
        return logits
    prob = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    if fusion == "add":
        return lam * first + (1.0 - lam) * prob
    if fusion == "norm_add":
        return lam * _minmax(first.astype(np.float64)) + (1.0 - lam) * _minmax(prob)
    raise InvalidInput(f"fusion must be one of None, 'add', 'norm_add'; got {fusion!r}")


def _fill_missing(values: np.ndarray, found: np.ndarray) -> np.ndarray:
    """``values`` with each row's missing entries set to the row's lowest found value (0 if none)."""
    lowest = np.where(found, values, np.inf).min(axis=1, keepdims=True)
    return np.where(found, values, np.where(np.isfinite(lowest), lowest, 0.0)).astype(values.dtype)


class Pipeline:
    """First stage (anything with ``search(queries, top_k) -> (scores, ids)``: a fitted
    correction or a :class:`hubless.Index`) + a reranker over its top ``k``.

    ``gallery_items``: what the reranker sees for the item the first stage returns as id i
    (image paths, PIL images or texts): a sequence indexed by id, or a mapping from id (for an
    index whose ids are not 0, 1, ...: ``hubless.index.ItemColumn(index, "path")``).
    """

    def __init__(self, first_stage, reranker, k: int = 20, fusion: str | None = None, fusion_weight: float = 0.1,
                 *, gallery_items: Sequence | Mapping | None = None, batch_queries: int = 16, lam: float | None = None) -> None:  # fmt: skip
        if lam is not None:
            warnings.warn("Pipeline(lam=) is now fusion_weight= (lam is also DN's weight)", DeprecationWarning, stacklevel=2)
            fusion_weight = lam
        if not hasattr(first_stage, "search"):
            raise InvalidType("first_stage must have search(queries, top_k), e.g. a fitted correction or a hubless.Index")
        if fusion not in FUSIONS:
            raise InvalidInput(f"fusion must be one of None, 'add', 'norm_add'; got {fusion!r}")
        if not 0.0 <= fusion_weight <= 1.0:
            raise InvalidInput(f"fusion_weight must be in [0, 1]; got {fusion_weight}")
        self.first_stage, self.reranker = first_stage, reranker
        self.k = check_positive_int(k, "k")
        self.fusion, self.fusion_weight = fusion, float(fusion_weight)
        self.gallery_items: list | Mapping | None = (
            None if gallery_items is None or isinstance(gallery_items, Mapping) else list(gallery_items)
        )
        if isinstance(gallery_items, Mapping):
            self.gallery_items = gallery_items
        self.batch_queries = check_positive_int(batch_queries, "batch_queries")

    def search(
        self, query_embeddings, query_items: Sequence, top_k: int = 10, *, progress: bool | None = None, **first_stage
    ) -> RerankResult:
        """Retrieve the corrected top ``k``, rerank, return the best ``top_k`` (<= k).

        ``first_stage``: per-call arguments of the first stage's ``search``, e.g. ``alpha=0.5``
        or, for an index, ``nprobe=32``."""
        if self.gallery_items is None:
            raise InvalidInput("the pipeline needs gallery_items (what the reranker sees for each gallery position)")
        query_items = list(query_items)
        if len(query_items) != len(query_embeddings):
            raise InvalidInput(f"{len(query_items)} query items for {len(query_embeddings)} query embeddings")
        top_k = check_positive_int(top_k, "top_k")
        if top_k > self.k:
            raise InvalidInput(f"top_k={top_k} is more than the k={self.k} candidates that are reranked")
        t0 = time.perf_counter()
        first, ids = self.first_stage.search(query_embeddings, top_k=self.k, **first_stage)
        t1 = time.perf_counter()
        if not isinstance(self.gallery_items, Mapping) and len(self.gallery_items) < int(ids.max()) + 1:
            raise InvalidInput(f"gallery_items has {len(self.gallery_items)} entries; the first stage returned id {int(ids.max())}")
        logits = np.full(ids.shape, -np.inf, dtype=np.float32)  # slots an ANN could not fill (id -1) stay last
        starts = progress_bar(range(0, ids.shape[0], self.batch_queries), progress, desc="rerank", unit="batch")
        for s in starts:
            rows, cols = np.nonzero(ids[s : s + self.batch_queries] >= 0)
            pairs_q = [query_items[s + r] for r in rows]
            pairs_c = [self.gallery_items[j] for j in ids[s + rows, cols]]
            logits[s + rows, cols] = np.asarray(self.reranker.score_pairs(pairs_q, pairs_c), dtype=np.float32)
        t2 = time.perf_counter()
        found = ids >= 0
        if found.all():
            final = fuse(first, logits, self.fusion, self.fusion_weight)
        else:  # missing slots take their row's lowest score, so min-max fusion ignores them, then go last
            final = np.where(
                found, fuse(_fill_missing(first, found), _fill_missing(logits, found), self.fusion, self.fusion_weight), -np.inf
            )
        # Stable sort: equal final scores keep the first stage's order.
        order = np.argsort(-final, axis=1, kind="stable")[:, :top_k]
        take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
        return RerankResult(take(ids), take(final).astype(np.float32), take(first), take(logits),
                            {"first_stage": t1 - t0, "rerank": t2 - t1})  # fmt: skip
