"""Retrieval metrics from ranked result lists."""

from __future__ import annotations

import numpy as np

__all__ = ["recall_at_k"]


def recall_at_k(ranked_ids: np.ndarray, relevant: np.ndarray, k: int) -> float:
    """Recall@k in percent for one relevant item per query: the share of queries whose relevant
    item ``relevant[i]`` is among the first ``k`` of ``ranked_ids[i]`` (n_queries, >= k)."""
    ranked_ids = np.asarray(ranked_ids)
    relevant = np.asarray(relevant)
    if ranked_ids.ndim != 2 or relevant.shape != (ranked_ids.shape[0],):
        raise ValueError("ranked_ids must be (n_queries, n_ranked) and relevant (n_queries,)")
    if not 1 <= k <= ranked_ids.shape[1]:
        raise ValueError(f"k={k} must be between 1 and the number of ranked items ({ranked_ids.shape[1]})")
    hits = (ranked_ids[:, :k] == relevant[:, None]).any(axis=1)
    return float(100.0 * hits.mean())
