"""Invariants of the corrections, checked on many random inputs (hypothesis)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hubless

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _data(seed: int, n_gallery: int, n_bank: int, n_queries: int, dim: int):
    rng = np.random.default_rng(seed)
    make = lambda n: rng.standard_normal((n, dim)).astype(np.float32)  # noqa: E731
    return make(n_gallery), make(n_bank), make(n_queries), make(max(2, n_gallery // 2))


sizes = st.tuples(
    st.integers(0, 2**32 - 1),  # seed
    st.integers(2, 40),  # gallery
    st.integers(1, 60),  # bank
    st.integers(1, 12),  # queries
    st.integers(2, 12),  # dim
)


@SETTINGS
@given(sizes, st.integers(1, 60))
def test_alpha_zero_changes_nothing(shape, k):
    g, b, q, _ = _data(*shape)
    k = min(k, len(b))
    top_k = min(5, len(g))
    base_scores, base_ids = hubless.Baseline().fit(g).search(q, top_k)
    nnn = hubless.NNN(alpha=0.0, k=k).fit(g, b)
    scores, ids = nnn.search(q, top_k)
    np.testing.assert_array_equal(ids, base_ids)
    np.testing.assert_array_equal(scores, base_scores)
    # and a fitted NNN searched with alpha=0 at query time is the baseline too
    _, ids_override = hubless.NNN(alpha=0.9, k=k).fit(g, b).search(q, top_k, weight=0.0)
    np.testing.assert_array_equal(ids_override, base_ids)


@SETTINGS
@given(sizes, st.integers(1, 60))
def test_csls_ranks_as_nnn_with_half_alpha(shape, k):
    g, b, q, _ = _data(*shape)
    k = min(k, len(b), len(g))
    top_k = min(5, len(g))
    _, csls_ids = hubless.CSLS(k=k).fit(g, b).search(q, top_k)
    _, nnn_ids = hubless.NNN(alpha=0.5, k=k).fit(g, b).search(q, top_k)
    np.testing.assert_array_equal(csls_ids, nnn_ids)


@SETTINGS
@given(sizes, st.floats(0.5, 30.0))
def test_dis_with_empty_activation_set_is_baseline(shape, beta):
    g, b, q, _ = _data(*shape)
    top_k = min(5, len(g))
    dis = hubless.DynamicInvertedSoftmax(beta=beta).fit(g, b)
    dis.activation_mask_[:] = False
    scores, ids = dis.search(q, top_k)
    base_scores, base_ids = hubless.Baseline().fit(g).search(q, top_k)
    np.testing.assert_array_equal(ids, base_ids)
    np.testing.assert_allclose(scores, base_scores)
    np.testing.assert_allclose(dis.score(q), hubless.Baseline().fit(g).score(q))


@SETTINGS
@given(
    st.tuples(st.integers(0, 2**32 - 1), st.integers(4, 40), st.integers(4, 60), st.integers(1, 12), st.integers(2, 12)),
    st.sampled_from(["nnn:k=3", "csls:k=2", "dn", "is:beta=5", "dis:beta=5", "dualis", "dualdis", "gc"]),
)
def test_permuting_the_gallery_permutes_the_results(shape, spec):
    g, b, q, gb = _data(*shape)
    top_k = 3
    perm = np.random.default_rng(shape[0]).permutation(len(g))
    plain = hubless.make_correction(spec).fit(g, b, gb)
    permuted = hubless.make_correction(spec).fit(g[perm], b, gb)
    full = plain.score(q)
    np.testing.assert_allclose(permuted.score(q), full[:, perm], rtol=1e-5, atol=1e-5)
    scores, ids = plain.search(q, top_k)
    p_scores, p_ids = permuted.search(q, top_k)
    np.testing.assert_allclose(p_scores, scores, rtol=1e-5, atol=1e-5)
    # the same items come back, unless two of the top k + 1 scores are (near-)tied
    top = -np.sort(-full, axis=1)[:, : top_k + 1]
    untied = np.abs(np.diff(top, axis=1)).min(axis=1) > 1e-4 * np.maximum(1.0, np.abs(top).max(axis=1))
    np.testing.assert_array_equal(perm[p_ids][untied], ids[untied])


@SETTINGS
@given(sizes, st.floats(0.0, 2.0), st.integers(1, 60))
def test_query_time_alpha_equals_refitting(shape, alpha, k):
    g, b, q, _ = _data(*shape)
    k = min(k, len(b))
    top_k = min(5, len(g))
    fitted = hubless.NNN(alpha=0.75, k=k).fit(g, b)
    s1, i1 = fitted.search(q, top_k, weight=alpha)
    s2, i2 = hubless.NNN(alpha=alpha, k=k).fit(g, b).search(q, top_k)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_allclose(s1, s2)


@SETTINGS
@given(sizes)
def test_per_query_alpha_equals_one_search_per_query(shape):
    g, b, q, _ = _data(*shape)
    top_k = min(3, len(g))
    nnn = hubless.NNN(k=1).fit(g, b)
    alphas = np.linspace(0.0, 1.5, len(q))
    scores, ids = nnn.search(q, top_k, weight=alphas)
    for i, a in enumerate(alphas):
        s_i, ids_i = nnn.search(q[i : i + 1], top_k, weight=float(a))
        np.testing.assert_array_equal(ids[i], ids_i[0])
        np.testing.assert_allclose(scores[i], s_i[0], rtol=1e-6, atol=1e-6)
