"""Sublinear bank statistics: top-k similarities from an ANN index over the query bank.

The exact NNN bias needs every s(b, r): n_gallery x n_bank inner products. An IVF index over
the bank visits only ``nprobe`` of its ``nlist`` lists per gallery item (NNN paper, section 3.1
and appendix C: 55-160x faster for at most 0.2 points of R@1), and HNSW a graph neighbourhood.
The top-k found this way can only miss true neighbours, so the approximate bias is a lower bound
of the exact one; :func:`hubless.index.ann_bias.bias_error` measures the gap on a sample so users
can choose.

Only statistics made of top-k similarities and means can be computed this way (NNN, CSLS, DN,
the baseline); log-sum-exp over the whole bank (IS, DIS, DualIS, DualDIS) and GC's probes need
every similarity, and are refused with a clear message.
"""

from __future__ import annotations

import re

import faiss
import numpy as np

from hubless.engine.exact import exact_search
from hubless.engine.parallel import num_threads
from hubless.engine.statistics import BankStatistics, StatisticsRequest, compute_statistics
from hubless.errors import InvalidInput

__all__ = ["ann_statistics", "default_bank_factory", "ivf_topk"]


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

    ``factory``: "IVF{nlist}" (default :func:`default_bank_factory`) runs :func:`ivf_topk`; any
    other FAISS factory string (e.g. "HNSW32") builds that index over the bank. Inputs are validated float32 arrays (as the corrections' ``fit`` makes).
    """
    unsupported = [
        name
        for name, need in (
            ("log-sum-exp over the bank (IS/DIS/DualIS/DualDIS)", request.query_betas or request.gallery_betas),
            ("sorted probes (GC)", request.query_probes),
            ("activation sets (DIS/DualDIS)", request.query_activation_k or request.gallery_activation_k),
        )
        if need
    ]
    if unsupported:
        raise InvalidInput(
            f"ANN bank statistics only give top-k similarities and means; this method needs {', '.join(unsupported)}: use exact statistics"
        )
    stats = compute_statistics(gallery, query_bank, gallery_bank, StatisticsRequest())  # the means
    k = request.query_topk
    if not k:
        return stats
    factory = factory or default_bank_factory(query_bank.shape[0])
    match = re.fullmatch(r"IVF(\d+)(?:,Flat)?", factory.replace(" ", ""))
    if match:
        values = ivf_topk(gallery, query_bank, k, nlist=int(match.group(1)), nprobe=nprobe, seed=seed)
    else:
        values = _faiss_topk(gallery, query_bank, k, factory, ef_search)
    stats.query_topk = values
    return stats


def ivf_topk(gallery: np.ndarray, bank: np.ndarray, k: int, *, nlist: int, nprobe: int, seed: int = 0) -> np.ndarray:
    """Approximate top-``k`` similarities of each gallery row over ``bank``, descending, by an
    inverted file scanned with GEMMs: the bank is split into ``nlist`` k-means lists, each
    gallery row visits its ``nprobe`` nearest lists, and every list is scored against all the
    rows that visit it in one matrix product (FAISS scans lists row by row, several times slower
    on CPUs). Missing slots (lists smaller than k) hold -1, the floor of a cosine."""
    nlist = int(min(nlist, bank.shape[0]))
    nprobe = int(min(nprobe, nlist))
    km = faiss.Kmeans(
        bank.shape[1], nlist, niter=10, spherical=True, seed=seed, max_points_per_centroid=32, min_points_per_centroid=1, verbose=False
    )
    km.train(bank)
    centroids = np.ascontiguousarray(km.centroids, dtype=np.float32)
    list_of = exact_search(bank, centroids, 1)[1][:, 0]
    order = np.argsort(list_of, kind="stable")
    members = bank[order]
    bounds = np.searchsorted(list_of[order], np.arange(nlist + 1))
    probes = exact_search(gallery, centroids, nprobe)[1]  # (n_gallery, nprobe)
    flat = probes.ravel()
    by_list = np.argsort(flat, kind="stable")
    starts = np.searchsorted(flat[by_list], np.arange(nlist + 1))
    candidates = np.full((gallery.shape[0] * nprobe, k), -1.0, dtype=np.float32)
    for lst in range(nlist):
        slots = by_list[starts[lst] : starts[lst + 1]]  # (row * nprobe + probe) entries visiting lst
        block = members[bounds[lst] : bounds[lst + 1]]
        if slots.size == 0 or block.shape[0] == 0:
            continue
        sims = gallery[slots // nprobe] @ block.T
        take = min(k, block.shape[0])
        best = sims if take == sims.shape[1] else np.partition(sims, sims.shape[1] - take, axis=1)[:, -take:]
        candidates[slots, :take] = best
    candidates = candidates.reshape(gallery.shape[0], nprobe * k)
    top = np.partition(candidates, candidates.shape[1] - k, axis=1)[:, -k:]
    return -np.sort(-top, axis=1)


def _faiss_topk(gallery, bank, k, factory, ef_search) -> np.ndarray:
    faiss.omp_set_num_threads(num_threads())
    index = faiss.index_factory(bank.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(bank)
    index.add(bank)
    hnsw = faiss.downcast_index(index)
    if isinstance(hnsw, faiss.IndexHNSW):
        hnsw.hnsw.efSearch = max(ef_search, k)
    values, ids = index.search(gallery, k)
    values = np.where(ids < 0, -1.0, values).astype(np.float32)
    return -np.sort(-values, axis=1)
