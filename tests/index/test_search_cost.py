"""What one ``Index.search`` call costs: the work of the search, not of the index's size, and no
thread team for a small batch (issue 31: a single query against 20,000 x 256 items took 16-37 ms
on a shared 2-core machine, against 0.23 ms per query in a batch).

Measured without wall clocks (they flake on shared machines): the memory a single-query search
allocates at two gallery sizes, the BLAS / OpenMP threads a small batch runs on, and results that
do not depend on the batch a query is searched in.
"""

from __future__ import annotations

import threading
import tracemalloc

import faiss
import numpy as np
import pytest
from threadpoolctl import ThreadpoolController, threadpool_limits

import hubless
from hubless.engine import Dense, stream_reduce
from hubless.engine.parallel import SMALL_BATCH, small_batch_threads
from hubless.index import live


def _unit(n: int, d: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _blas_threads() -> int:
    return max(info["num_threads"] for info in ThreadpoolController().select(user_api="blas").info())


def test_a_small_batch_multiplies_on_one_blas_thread():
    if not ThreadpoolController().select(user_api="blas").info():
        pytest.skip("numpy's BLAS is not one threadpoolctl can set (its threads cannot be checked)")
    gallery, queries = _unit(3000, 16, 0), _unit(2 * SMALL_BATCH, 16, 1)
    seen: list[int] = []

    def record(sims, r0, r1, c0, c1):
        seen.append(_blas_threads())

    with threadpool_limits(limits=2, user_api="blas"):
        for rows in (1, SMALL_BATCH - 1):
            out = np.empty((rows, gallery.shape[0]), np.float32)
            stream_reduce(queries[:rows], gallery, [Dense(out)], transform=record)
            np.testing.assert_allclose(out, queries[:rows] @ gallery.T, rtol=1e-5, atol=1e-6)
        assert seen and set(seen) == {1}
        assert _blas_threads() == 2  # restored after the search


def test_a_small_batch_searches_faiss_on_the_calling_thread_alone():
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(2)
    try:
        other: list[int] = []
        with small_batch_threads(1):
            assert faiss.omp_get_max_threads() == 1
            # a per-thread setting: a search running meanwhile on another thread keeps its team
            worker = threading.Thread(target=lambda: other.append(faiss.omp_get_max_threads()))
            worker.start()
            worker.join()
        assert other == [2]
        assert faiss.omp_get_max_threads() == 2
        with small_batch_threads(SMALL_BATCH):
            assert faiss.omp_get_max_threads() == 2
    finally:
        faiss.omp_set_num_threads(before)


@pytest.fixture(scope="module")
def fitted():
    gallery, bank = _unit(12_000, 16, 2), _unit(600, 16, 3)
    return hubless.NNN(alpha=0.75, k=16).fit(gallery, bank)


@pytest.mark.parametrize("factory", ["Flat", "IVF64,Flat", "HNSW32"])
def test_a_query_gets_the_same_results_alone_as_in_a_batch(fitted, factory):
    index = hubless.Index(fitted, factory, nprobe=4, ef_search=32)
    queries = _unit(3 * SMALL_BATCH, 16, 4)
    scores, ids = index.search(queries, 10)
    for i in range(0, len(queries), 7):
        alone = index.search(queries[i : i + 1], 10)
        np.testing.assert_array_equal(alone[1][0], ids[i])
        np.testing.assert_allclose(alone[0][0], scores[i], rtol=1e-5, atol=1e-6)
    if factory == "Flat":  # the exact ranking, whatever the batch
        np.testing.assert_array_equal(ids, fitted.search(queries, 10)[1])


def test_candidate_similarities_equal_one_gather_of_every_candidate(fitted, monkeypatch):
    index = hubless.Index(fitted, "IVF64,Flat", query_bank=_unit(600, 16, 3))
    index.add(_unit(50, 16, 5))  # rows past the base come from the tail buffer
    snap = index._snap
    queries = _unit(37, 16, 6)
    rows = np.random.default_rng(7).integers(0, snap.n_rows, (37, 40))
    expected = np.einsum("qd,qkd->qk", queries, snap.gather(rows))
    for chunk in (1, 16 * 40 * 3, live.CANDIDATE_CHUNK):  # one query at a time, 3 at a time, all
        monkeypatch.setattr(live, "CANDIDATE_CHUNK", chunk)
        np.testing.assert_array_equal(snap.candidate_sims(queries, rows), expected)


def _peak_bytes(index, query, **options) -> int:
    index.search(query, 10, **options)  # caches of the snapshot (the serving correction, a filter's mask) are made once
    tracemalloc.start()
    try:
        index.search(query, 10, **options)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_flat_single_query_allocates_blocks_not_the_index_size():
    """Flat streams the gallery in blocks of a fixed width (the last one narrower): a single
    query's peak allocation is bounded by two blocks, from 20,000 to 80,000 items alike."""
    bank, query = _unit(400, 16, 8), _unit(1, 16, 9)
    peaks = {}
    for n in (20_000, 80_000):
        index = hubless.Index(hubless.NNN(alpha=0.75, k=16).fit(_unit(n, 16, 10), bank), "Flat")
        peaks[n] = _peak_bytes(index, query)
    assert peaks[80_000] < 1.5 * peaks[20_000] + 16_384, peaks


def test_an_ivf_single_query_allocates_what_its_search_needs_not_the_index_size():
    """Any per-call O(n) work (a copy of the gallery, biases, ids or alive mask; a filter's or
    the alive mask's FAISS bitmap packed again, counted again) makes a single query's peak
    allocation grow with the index: plain, filtered and with a removed item, it must not (it
    did, for the last two: 23 kB at 20,000 items, 38 kB at 80,000)."""
    bank, query = _unit(400, 16, 8), _unit(1, 16, 9)
    peaks: dict[str, dict[int, int]] = {"plain": {}, "where": {}, "removed": {}}
    for n in (20_000, 80_000):
        corr = hubless.NNN(alpha=0.75, k=16).fit(_unit(n, 16, 10), bank)
        index = hubless.Index(corr, "IVF32,Flat", nprobe=4, query_bank=bank, metadata={"even": np.arange(n) % 2 == 0})
        peaks["plain"][n] = _peak_bytes(index, query)
        peaks["where"][n] = _peak_bytes(index, query, where={"even": True})
        index.remove([3])
        peaks["removed"][n] = _peak_bytes(index, query)
    for kind, peak in peaks.items():
        assert peak[80_000] < 1.25 * peak[20_000], (kind, peaks)
        assert peak[80_000] < 80_000, (kind, peaks)  # under a byte per item (the alive mask alone is that much)
