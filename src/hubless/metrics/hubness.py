"""Hubness statistics of a ranking (Radovanovic et al. 2010)."""

from __future__ import annotations

import numpy as np

__all__ = ["k_occurrence"]


def k_occurrence(ranked_ids: np.ndarray, n_gallery: int, k: int = 1) -> np.ndarray:
    """N_k(r): how many queries have gallery item r among their first ``k`` results, (n_gallery,)."""
    ranked_ids = np.asarray(ranked_ids)
    if ranked_ids.ndim != 2 or not 1 <= k <= ranked_ids.shape[1]:
        raise ValueError(f"ranked_ids must be (n_queries, >= {k}) gallery indices")
    return np.bincount(ranked_ids[:, :k].ravel(), minlength=n_gallery)
