"""Retrieve-only vs retrieve+rerank: R@K and latency per query."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from hubless.errors import InvalidInput
from hubless.evaluation.results import Evaluation, RerankNumbers
from hubless.metrics.retrieval import recall_at_k
from hubless.metrics.truth import Truth, TruthLike, load_truth

if TYPE_CHECKING:
    from hubless.rerank.pipeline import Pipeline
    from hubless.rerank.rerankers import Reranker

__all__ = ["rerank_evaluation", "rerank_eval"]


def _recalls(ids: np.ndarray, truth: Truth, ks: Sequence[int]) -> dict[str, float]:
    return {f"R@{k}": recall_at_k(ids, truth, k) for k in ks}


def rerank_eval(
    pipeline: Pipeline,
    query_embeddings: np.ndarray,
    query_items: Sequence[str],
    truth: Truth,
    ks: Sequence[int] = (1, 5, 10),
    *,
    progress: bool | None = None,
) -> RerankNumbers:
    """R@K of the first stage alone and after reranking its top ``pipeline.k``, with the mean
    latency per query of each stage (ms), as a :class:`~hubless.evaluation.RerankNumbers` (which
    also reads as the dict it was). ``truth``: relevant gallery ids per query."""
    ks = [k for k in ks if k <= pipeline.k]
    result = pipeline.search(query_embeddings, query_items, top_k=max(ks), progress=progress)
    first_ids = pipeline.first_stage.search(query_embeddings, top_k=max(ks))[1]
    n = len(query_items)
    seconds = result.seconds
    assert seconds is not None  # a reranked search measures its stages
    return RerankNumbers(
        k=pipeline.k,
        fusion=pipeline.fusion,
        fusion_weight=pipeline.fusion_weight,
        retrieve=_recalls(first_ids, truth, ks),
        reranked=_recalls(result.ids, truth, ks),
        ms_retrieve=1000 * seconds["first_stage"] / n,
        ms_rerank=1000 * seconds["rerank"] / n,
    )


def rerank_evaluation(
    evaluation: Evaluation,
    queries: np.ndarray,
    query_items: Sequence[str],
    truth: TruthLike,
    reranker: Reranker,
    gallery_items: Sequence[str],
    *,
    k: int = 50,
    fusion: str | None = None,
    fusion_weight: float = 0.5,
    progress: bool | None = None,
) -> dict[str, RerankNumbers]:
    """Rerank every method of an :func:`hubless.evaluate` result: each method's top ``k`` is
    re-scored by ``reranker`` (a :class:`~hubless.rerank.Reranker`) and R@K (K <= k) is measured
    before and after (:func:`rerank_eval`). ``queries`` are the embeddings the evaluation ranked,
    ``query_items`` / ``gallery_items`` what the reranker reads (texts or image paths, one per
    row). Each entry of ``evaluation.results`` is replaced by one whose ``rerank`` holds its
    numbers (written to ``results.json``); returns {spec: numbers}."""
    from hubless.rerank.pipeline import Pipeline

    n_gallery, n_queries = evaluation.n_gallery, np.shape(queries)[0]
    if len(gallery_items) != n_gallery or len(query_items) != n_queries:
        raise InvalidInput(
            f"items ({len(gallery_items)} gallery, {len(query_items)} queries) must match the embeddings ({n_gallery}, {n_queries})"
        )
    truth = load_truth(truth, n_queries, n_gallery)
    ks = [k_ for k_ in evaluation.ks if k_ <= k]
    if not ks:
        raise InvalidInput(f"k={k} is below every K of the evaluation ({list(evaluation.ks)}): rerank at least the first K")
    out: dict[str, RerankNumbers] = {}
    for i, r in enumerate(evaluation.results):
        pipe = Pipeline(r.correction, reranker, k=k, fusion=fusion, fusion_weight=fusion_weight, gallery_items=gallery_items)
        out[r.spec] = rerank_eval(pipe, queries, query_items, truth, ks=ks, progress=progress)
        evaluation.results[i] = dataclasses.replace(r, rerank=out[r.spec])
    return out
