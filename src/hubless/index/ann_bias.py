"""Fit a correction with sublinear (ANN) bank statistics, and measure what that costs.

The bank statistics come from :func:`hubless.engine.ann.ann_statistics` (an inverted file or a
FAISS index over the query bank instead of every similarity; NNN paper, section 3.1 and
appendix C). Only top-k statistics and means can be approximated this way (NNN, CSLS, DN);
:func:`bias_error` compares the biases with an exact fit on a sample of gallery items.
"""

from __future__ import annotations

import time

import numpy as np

from hubless.corrections import AdditiveCorrection, make_additive
from hubless.corrections.fit_inputs import validate_fit_inputs
from hubless.engine.ann import ann_statistics
from hubless.index.factory import check_factory

__all__ = ["bias_error", "fit_ann_bias"]


def fit_ann_bias(
    correction: AdditiveCorrection, gallery, query_bank, gallery_bank=None, *, bias_search: str = "ann", nprobe: int = 32
) -> dict[str, float]:
    """Fit ``correction`` in place from ANN bank statistics; returns its :func:`bias_error`.

    ``bias_search``: "ann" (an IVF over the bank with about 2 sqrt(n) lists) or a FAISS factory
    string for the bank ("IVF2048,Flat", "HNSW32"); ``nprobe`` lists are visited.
    """
    g, qb, gb = validate_fit_inputs([correction], gallery, query_bank, gallery_bank)
    factory = None if bias_search == "ann" else check_factory(bias_search, qb.shape[0], qb.shape[1])
    stats = ann_statistics(g, qb, gb, correction.statistics_request(), factory=factory, nprobe=nprobe)
    correction.fit(g, qb, gb, statistics=stats)
    return bias_error(correction, g, qb, gb)


def bias_error(
    correction: AdditiveCorrection, gallery: np.ndarray, query_bank: np.ndarray, gallery_bank=None, *, sample: int = 1000, seed: int = 0
) -> dict[str, float]:
    """Mean and max |bias_ann - bias_exact| over a random sample of gallery items, and the exact
    time per item (for choosing), comparing ``correction`` (fitted) with an exact refit."""
    rng = np.random.default_rng(seed)
    n = gallery.shape[0]
    rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    exact = make_additive(correction.spec).set_params(normalize=correction.normalize)
    t0 = time.perf_counter()
    exact.fit(gallery[rows], query_bank, gallery_bank)
    seconds = time.perf_counter() - t0
    diff = np.abs(correction.bias_columns_[rows] - exact.bias_columns_).sum(axis=1)
    return {
        "mean_abs": float(diff.mean()),
        "max_abs": float(diff.max()),
        "sample": int(rows.size),
        "exact_seconds_per_item": seconds / rows.size,
    }
