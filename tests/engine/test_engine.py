"""The streamed engine: running top-k, log-sum-exp, exact search, bounded memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from hubless.engine import LogSumExp, SortedRows, TopK, exact_search, stream_reduce
from hubless.engine.topk import RunningTopK
from tests.reference import ranking


def _blocks(matrix, widths):
    start = 0
    for w in widths:
        if start >= matrix.shape[1]:
            return
        yield start, matrix[:, start : start + w]
        start += w
    if start < matrix.shape[1]:
        yield start, matrix[:, start:]


matrices = st.tuples(
    st.integers(0, 2**32 - 1),
    st.integers(1, 8),  # rows
    st.integers(1, 80),  # cols
    st.integers(1, 20),  # k
    st.lists(st.integers(1, 40), min_size=1, max_size=6),  # block widths
    st.booleans(),  # coarse values (many ties)
)


def _matrix(seed, n, m, coarse):
    rng = np.random.default_rng(seed)
    if coarse:
        return rng.integers(0, 4, (n, m)).astype(np.float32)
    return rng.standard_normal((n, m)).astype(np.float32)


@settings(max_examples=200, deadline=None)
@given(matrices)
def test_running_topk_with_ids_equals_sorting(params):
    seed, n, m, k, widths, coarse = params
    k = min(k, m)
    x = _matrix(seed, n, m, coarse)
    running = RunningTopK(n, k, with_ids=True)
    # blocks may arrive in any order: ties must still go to the lower id
    blocks = list(_blocks(x, widths))
    np.random.default_rng(seed).shuffle(blocks)
    for offset, block in blocks:
        running.update(block, offset)
    values, ids = running.sorted()
    expected = ranking(x)[:, :k]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(values, np.take_along_axis(x, expected, axis=1))


@settings(max_examples=200, deadline=None)
@given(matrices)
def test_running_topk_values_equal_sorting(params):
    seed, n, m, k, widths, coarse = params
    k = min(k, m)
    x = _matrix(seed, n, m, coarse)
    running = RunningTopK(n, k)
    for offset, block in _blocks(x, widths):
        running.update(block, offset)
    values, ids = running.sorted()
    assert ids is None
    np.testing.assert_array_equal(values, -np.sort(-x, axis=1)[:, :k])


@settings(max_examples=200, deadline=None)
@given(matrices, st.integers(1, 79), st.booleans())
def test_seeded_running_topk_extends_a_topk_over_earlier_columns(params, split, with_ids):
    """top-k of x[:, :split], then seeded with it over x[:, split:], equals top-k of x."""
    seed, n, m, k, widths, coarse = params
    split = min(split, m - 1) if m > 1 else 0
    x = _matrix(seed, n, m, coarse)
    k = min(k, max(split, 1), m)
    if split == 0:
        return
    first = RunningTopK(n, k, with_ids=with_ids)
    first.update(x[:, :split], 0)
    values, ids = first.sorted()
    merged = RunningTopK(n, k, with_ids=with_ids, initial=(values, ids))
    for offset, block in _blocks(x[:, split:], widths):
        merged.update(block, split + offset)
    values, ids = merged.sorted()
    expected = ranking(x)[:, :k]
    np.testing.assert_array_equal(values, np.take_along_axis(x, expected, axis=1))
    if with_ids:
        np.testing.assert_array_equal(ids, expected)


def test_stream_reduce_matches_dense_computation():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((700, 24)).astype(np.float32)
    cols = rng.standard_normal((1500, 24)).astype(np.float32)
    dense = rows.astype(np.float64) @ cols.T.astype(np.float64)
    top = TopK(700, 9, with_ids=True)
    lse = LogSumExp(700, [0.0, 0.5, 3.0])
    probes = SortedRows(700, 1500)
    stream_reduce(rows, cols, [top, lse, probes], row_block=128, col_block=400)
    np.testing.assert_array_equal(top.ids, ranking(dense)[:, :9])
    np.testing.assert_allclose(top.values, -np.sort(-dense, axis=1)[:, :9], rtol=1e-5, atol=1e-5)
    for t, beta in enumerate([0.0, 0.5, 3.0]):
        np.testing.assert_allclose(lse.values[:, t], logsumexp(beta * dense, axis=1), rtol=1e-6)
    np.testing.assert_allclose(probes.values, np.sort(dense, axis=1), rtol=1e-5, atol=1e-5)


def test_logsumexp_does_not_overflow_at_large_beta():
    rows = np.ones((3, 4), np.float32)
    cols = 10 * np.ones((5, 4), np.float32)
    lse = LogSumExp(3, [400.0])
    stream_reduce(rows, cols, [lse])
    np.testing.assert_allclose(lse.values[:, 0], 400 * 40 + np.log(5))


def test_exact_search_breaks_ties_by_lower_index():
    gallery = np.array([[1, 0], [0, 1], [1, 0], [1, 0], [0.5, 0.5]], dtype=np.float32)
    queries = np.array([[1, 0], [0, 1]], dtype=np.float32)
    scores, ids = exact_search(queries, gallery, 4)
    assert ids.tolist() == [[0, 2, 3, 4], [1, 4, 0, 2]]
    np.testing.assert_allclose(scores, [[1, 1, 1, 0.5], [1, 0.5, 0, 0]])


def test_exact_search_ranks_blocks_rewritten_by_the_transform():
    rng = np.random.default_rng(3)
    q, g = rng.standard_normal((50, 8)).astype(np.float32), rng.standard_normal((300, 8)).astype(np.float32)
    shift = rng.standard_normal(300).astype(np.float32)

    def subtract(sims, r0, r1, c0, c1):
        sims -= shift[c0:c1]

    scores, ids = exact_search(q, g, 12, transform=subtract)
    dense = q.astype(np.float64) @ g.T.astype(np.float64) - shift
    np.testing.assert_array_equal(ids, ranking(dense)[:, :12])
    np.testing.assert_allclose(scores, np.take_along_axis(dense, ids, axis=1), rtol=1e-5, atol=1e-5)


def test_threaded_and_single_threaded_results_agree(monkeypatch):
    rng = np.random.default_rng(5)
    q, g = rng.standard_normal((1000, 16)).astype(np.float32), rng.standard_normal((3000, 16)).astype(np.float32)
    monkeypatch.setenv("HUBLESS_NUM_THREADS", "1")
    one = exact_search(q, g, 5)
    monkeypatch.setenv("HUBLESS_NUM_THREADS", "3")
    three = exact_search(q, g, 5)
    np.testing.assert_array_equal(one[1], three[1])
    # BLAS may round differently with other thread counts: equal to float32 precision
    np.testing.assert_allclose(one[0], three[0], rtol=1e-6)


def test_worker_errors_propagate():
    class Boom(TopK):
        def start(self, start, stop):
            raise RuntimeError("boom")

    rows = np.ones((2000, 4), np.float32)
    with pytest.raises(RuntimeError, match="boom"):
        stream_reduce(rows, rows, [Boom(2000, 1)])


def test_memory_stays_bounded_when_the_similarity_matrix_is_huge():
    """2,000 x 150,000 similarities would take 1.2 GB; the stream must stay far below."""
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((2000, 8)).astype(np.float32)
    cols = rng.standard_normal((150_000, 8)).astype(np.float32)
    tracemalloc.start()
    try:
        top = TopK(2000, 16)
        lse = LogSumExp(2000, [20.0])
        stream_reduce(rows, cols, [top, lse])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 150 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    dense_row = rows[:1].astype(np.float64) @ cols.T.astype(np.float64)
    np.testing.assert_allclose(top.values[0], -np.sort(-dense_row[0])[:16], rtol=1e-5)


@pytest.mark.parametrize("coarse", [False, True])
@pytest.mark.parametrize("with_ids", [False, True])
@pytest.mark.parametrize("width", [4096, 2571])
def test_running_topk_on_wide_blocks(coarse, with_ids, width):
    """Wide first blocks take the group-maxima bound (over the columns of whole groups when the
    width is no multiple of the group: a bank part of any size); later blocks the running threshold."""
    x = _matrix(7, 6, 3 * width, coarse)
    running = RunningTopK(6, 40, with_ids=with_ids)
    for offset in range(0, x.shape[1], width):
        running.update(x[:, offset : offset + width], offset)
    values, ids = running.sorted()
    expected = ranking(x)[:, :40]
    np.testing.assert_array_equal(values, np.take_along_axis(x, expected, axis=1))
    if with_ids:
        np.testing.assert_array_equal(ids, expected)
