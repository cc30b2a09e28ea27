"""Retrieve with a (corrected) bi-encoder, rerank the top k with a cross-encoder
("Retrieve Fast, Rerank Smart", Geigle et al. 2022).

    pipe = hubless.Pipeline(nnn, load_reranker("Salesforce/blip-itm-base-coco"), k=20,
                            gallery_items=image_paths)
    hits = pipe.search(query_embeddings, query_texts, top_k=10)   # a hubless.Hits, reranked

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

import numpy as np

from hubless._deprecation import deprecated_names
from hubless._validation import check_positive_int
from hubless.errors import InvalidInput, InvalidType
from hubless.hits import Hits
from hubless.progress import progress_bar

__all__ = ["Pipeline", "fuse"]

#: ``RerankResult`` is now :class:`hubless.Hits` (deprecated name, removed in 0.2.0)
__getattr__ = deprecated_names(__name__, {"RerankResult": "hubless.hits:Hits"})

FUSIONS = (None, "add", "norm_add")


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

    def __init__(
        self,
        first_stage,
        reranker,
        k: int = 20,
        fusion: str | None = None,
        fusion_weight: float = 0.1,
        *,
        gallery_items: Sequence | Mapping | None = None,
        batch_queries: int = 16,
        lam: float | None = None,
    ) -> None:
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

    def search(self, query_embeddings, query_items: Sequence, top_k: int = 10, *, progress: bool | None = None, **first_stage) -> Hits:
        """Retrieve the corrected top ``k``, rerank, return the best ``top_k`` (<= k) as
        :class:`~hubless.Hits`, each (n_queries, top_k): ``ids`` (the first stage's: gallery
        positions or an index's ids), ``scores`` (the final ranking score: the cross-encoder
        logit, or the fused score), ``first_stage_scores`` and ``rerank_scores`` (logits) of the
        same items, ``reranked`` with ``rerank_k`` = k, and the seconds spent in each stage in
        ``extra["seconds"]``.

        ``first_stage``: per-call arguments of the first stage's ``search``, e.g. ``weight=0.5``
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
        stage = self.first_stage.search(query_embeddings, top_k=self.k, **first_stage)
        first, ids = stage
        found = stage.found if isinstance(stage, Hits) else ids >= 0  # a plain (scores, ids) pair pads with id -1
        t1 = time.perf_counter()
        if not isinstance(self.gallery_items, Mapping) and found.any():
            top = int(ids[found].max())
            if len(self.gallery_items) < top + 1:
                raise InvalidInput(f"gallery_items has {len(self.gallery_items)} entries; the first stage returned id {top}")
        logits = np.full(ids.shape, -np.inf, dtype=np.float32)  # slots the first stage could not fill stay last
        starts = progress_bar(range(0, ids.shape[0], self.batch_queries), progress, desc="rerank", unit="batch")
        for s in starts:
            rows, cols = np.nonzero(found[s : s + self.batch_queries])
            pairs_q = [query_items[s + r] for r in rows]
            pairs_c = [self.gallery_items[j] for j in ids[s + rows, cols]]
            logits[s + rows, cols] = np.asarray(self.reranker.score_pairs(pairs_q, pairs_c), dtype=np.float32)
        t2 = time.perf_counter()
        if found.all():
            final = fuse(first, logits, self.fusion, self.fusion_weight)
        else:  # missing slots take their row's lowest score, so min-max fusion ignores them, then go last
            final = np.where(
                found, fuse(_fill_missing(first, found), _fill_missing(logits, found), self.fusion, self.fusion_weight), -np.inf
            )
        # Stable sort: equal final scores keep the first stage's order.
        order = np.argsort(-final, axis=1, kind="stable")[:, :top_k]
        take = lambda a: np.take_along_axis(a, order, axis=1)  # noqa: E731
        return Hits.from_found(
            take(final),
            take(ids),
            take(found),
            first_stage_scores=take(first),
            rerank_scores=take(logits),
            reranked=True,
            rerank_k=self.k,
            extra={"seconds": {"first_stage": t1 - t0, "rerank": t2 - t1}},
        )
