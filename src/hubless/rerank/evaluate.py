"""Retrieve-only vs retrieve+rerank: R@K and latency per query."""

from __future__ import annotations

import numpy as np

from hubless.metrics.retrieval import recall_at_k
from hubless.metrics.truth import Truth

__all__ = ["rerank_eval"]


def _recalls(ids: np.ndarray, truth: Truth, ks) -> dict[str, float]:
    return {f"R@{k}": recall_at_k(ids, truth, k) for k in ks}


def rerank_eval(pipeline, query_embeddings, query_items, truth: Truth, ks=(1, 5, 10), *, progress=None) -> dict:
    """R@K of the first stage alone and after reranking its top ``pipeline.k``, with the mean
    latency per query of each stage (ms). ``truth``: relevant gallery ids per query."""
    ks = [k for k in ks if k <= pipeline.k]
    result = pipeline.search(query_embeddings, query_items, top_k=max(ks), progress=progress)
    first_ids = pipeline.first_stage.search(query_embeddings, top_k=max(ks))[1]
    n = len(query_items)
    return {
        "k": pipeline.k,
        "fusion": pipeline.fusion,
        "fusion_weight": pipeline.fusion_weight,
        "retrieve": _recalls(first_ids, truth, ks),
        "retrieve+rerank": _recalls(result.ids, truth, ks),
        "ms_per_query": {"retrieve": 1000 * result.seconds["first_stage"] / n, "rerank": 1000 * result.seconds["rerank"] / n},
    }
