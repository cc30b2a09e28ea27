"""Sublinear bank statistics: top-k similarities from an ANN index over the query bank.

The exact NNN bias needs every s(b, r): n_gallery x n_bank inner products. An IVF index over
the bank visits only ``nprobe`` of its ``nlist`` lists per gallery item (NNN paper, section 3.1
and appendix C: 55-160x faster for at most 0.2 points of R@1), and HNSW a graph neighbourhood.
The top-k found this way can only miss true neighbours, so the approximate bias is a lower bound
of the exact one; :func:`bias_error` measures the gap on a sample so users can choose.

Only statistics made of top-k similarities and means can be computed this way (NNN, CSLS, DN,
the baseline); log-sum-exp over the whole bank (IS, DIS, DualIS, DualDIS) and GC's probes need
every similarity, and are refused with a clear message.
"""

from __future__ import annotations

import time

import faiss
import numpy as np

from hubless.engine.parallel import num_threads
from hubless.engine.statistics import BankStatistics, StatisticsRequest, compute_statistics

__all__ = ["ann_statistics", "bias_error", "default_bank_factory"]


def default_bank_factory(n_bank: int) -> str:
    """IVF with about 2 sqrt(n) lists (a power of two, at least 16)."""
    nlist = max(16, int(2 ** round(np.log2(2 * np.sqrt(n_bank)))))
    return f"IVF{nlist},Flat"


def ann_statistics(
    gallery: np.ndarray,
    query_bank: np.ndarray,
    gallery_bank: np.ndarray | None,
    request: StatisticsRequest,
    *,
    factory: str | None = None,
    nprobe: int = 32,
    ef_search: int = 128,
    seed: int = 0,
) -> BankStatistics:
    """Like :func:`~hubless.engine.compute_statistics`, with the top-k from an ANN index.

    ``factory``: FAISS factory string for the bank index (default :func:`default_bank_factory`;
    "HNSW32" for a graph). Inputs are validated float32 arrays (as the corrections' ``fit`` makes).
    """
    unsupported = [name for name, need in (
        ("log-sum-exp over the bank (IS/DIS/DualIS/DualDIS)", request.query_betas or request.gallery_betas),
        ("sorted probes (GC)", request.query_probes),
        ("activation sets (DIS/DualDIS)", request.query_activation_k or request.gallery_activation_k),
    ) if need]  # fmt: skip
    if unsupported:
        raise ValueError(f"ANN bank statistics only give top-k similarities and means; this method needs {', '.join(unsupported)}: use exact statistics")
    stats = compute_statistics(gallery, query_bank, gallery_bank, StatisticsRequest())  # the means
    k = request.query_topk
    if not k:
        return stats
    factory = factory or default_bank_factory(query_bank.shape[0])
    faiss.omp_set_num_threads(num_threads())
    index = faiss.index_factory(query_bank.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    ivf = None
    try:
        ivf = faiss.extract_index_ivf(index)
    except RuntimeError:
        pass
    if ivf is not None:
        ivf.cp.niter = 10
        ivf.cp.max_points_per_centroid = 32  # a 32-per-list sample trains the lists well enough
        ivf.cp.seed = seed
        ivf.nprobe = min(nprobe, ivf.nlist)
    if not index.is_trained:
        index.train(query_bank)
    index.add(query_bank)
    hnsw = faiss.downcast_index(index)
    if isinstance(hnsw, faiss.IndexHNSW):
        hnsw.hnsw.efSearch = max(ef_search, k)
    values, ids = index.search(gallery, k)
    # Lists that ran dry return id -1 with -inf/garbage: treat as missing (score -1, the floor of a cosine).
    values = np.where(ids < 0, -1.0, values).astype(np.float32)
    stats.query_topk = -np.sort(-values, axis=1)
    return stats


def bias_error(correction, gallery: np.ndarray, query_bank: np.ndarray, gallery_bank=None, *, sample: int = 1000, seed: int = 0) -> dict[str, float]:
    """Mean and max |bias_ann - bias_exact| over a random sample of gallery items, and the exact
    time per item (for choosing), comparing ``correction`` (fitted) with an exact refit."""
    from hubless.corrections import make_correction

    rng = np.random.default_rng(seed)
    n = gallery.shape[0]
    rows = np.sort(rng.choice(n, size=min(sample, n), replace=False))
    exact = make_correction(correction.spec).set_params(normalize=correction.normalize)
    t0 = time.perf_counter()
    exact.fit(gallery[rows], query_bank, gallery_bank)
    seconds = time.perf_counter() - t0
    diff = np.abs(correction.bias_columns_[rows] - exact.bias_columns_).sum(axis=1)
    return {"mean_abs": float(diff.mean()), "max_abs": float(diff.max()), "sample": int(rows.size), "exact_seconds_per_item": seconds / rows.size}
