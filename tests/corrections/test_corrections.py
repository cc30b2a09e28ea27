"""Every correction against an independent brute-force computation of its formula."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from tests import reference as ref


def _fit(corr, d):
    return corr.fit(d["gallery"], d["query_bank"], d["gallery_bank"])


CASES = {
    "baseline": (hubless.Baseline(), lambda d: ref.cos(d["queries"], d["gallery"])),
    "nnn": (
        hubless.NNN(alpha=0.75, k=5),
        lambda d: ref.nnn(d["queries"], d["gallery"], d["query_bank"], 0.75, 5),
    ),
    "csls": (hubless.CSLS(k=4), lambda d: ref.csls(d["queries"], d["gallery"], d["query_bank"], 4)),
    "dn": (
        hubless.DN(lam=0.4),
        lambda d: ref.dn(d["queries"], d["gallery"], d["query_bank"], 0.4, d["gallery_bank"]),
    ),
    "is": (
        hubless.InvertedSoftmax(beta=7.0),
        lambda d: ref.inverted_softmax(d["queries"], d["gallery"], d["query_bank"], 7.0),
    ),
    "dis": (
        hubless.DynamicInvertedSoftmax(beta=7.0, k_activation=2),
        lambda d: ref.dynamic_inverted_softmax(d["queries"], d["gallery"], d["query_bank"], 7.0, 2),
    ),
    "dualis": (
        hubless.DualIS(beta_query=6.0, beta_gallery=3.0),
        lambda d: ref.dual_is(d["queries"], d["gallery"], d["query_bank"], d["gallery_bank"], 6.0, 3.0),
    ),
    "dualdis (exp form)": (
        hubless.DualDIS(beta_query=6.0, beta_gallery=3.0, k_activation=1, ungated="exp"),
        lambda d: ref.dual_dis(d["queries"], d["gallery"], d["query_bank"], d["gallery_bank"], 6.0, 3.0, 1),
    ),
    "gc": (hubless.GlobalCorrection(), lambda d: ref.global_correction(d["queries"], d["gallery"], d["query_bank"])),
}


@pytest.mark.parametrize("name", list(CASES))
def test_score_matches_brute_force(name, small_data):
    corr, formula = CASES[name]
    expected = formula(small_data)
    got = _fit(corr, small_data).score(small_data["queries"])
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_search_ranks_as_brute_force(name, small_data):
    corr, formula = CASES[name]
    expected = formula(small_data)
    scores, ids = _fit(corr, small_data).search(small_data["queries"], top_k=7)
    assert scores.shape == ids.shape == (len(small_data["queries"]), 7)
    assert scores.dtype == np.float32 and ids.dtype == np.int64
    ref.assert_same_ranking(ids, expected, 7, atol=1e-5 * max(1.0, np.abs(expected).max()))
    # the scores returned are the method's own, for the items returned
    np.testing.assert_allclose(scores, np.take_along_axis(expected, ids, axis=1), rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", [n for n in CASES if n != "gc"])
def test_bias_form_ranks_as_own_score(name, small_data):
    """Ranking by the augmented vectors [q, -w].[r, bias] equals ranking by the method's score."""
    corr, _ = CASES[name]
    corr = _fit(corr, small_data)
    q = small_data["queries"]
    own = corr.score(q).astype(np.float64)
    weights = corr.query_weights(q)
    augmented_q = np.hstack([q, -weights]).astype(np.float64)
    augmented_r = np.hstack([corr.gallery_, corr.bias_columns_]).astype(np.float64)
    by_bias = augmented_q @ augmented_r.T
    top = ref.ranking(by_bias)[:, :10]
    ref.assert_same_ranking(top, own, 10, atol=1e-5 * max(1.0, np.abs(own).max()))


def test_bias_values_match_the_design_table(small_data):
    d = small_data
    g, b, gb = d["gallery"], d["query_bank"], d["gallery_bank"]
    nnn = hubless.NNN(k=5).fit(g, b)
    np.testing.assert_allclose(nnn.bias_, ref.topk_mean_bias(g, b, 5), atol=1e-6)
    dn = hubless.DN().fit(g, b)
    np.testing.assert_allclose(dn.bias_, ref.cos(g, b.mean(axis=0, keepdims=True))[:, 0], atol=1e-6)
    is_ = hubless.InvertedSoftmax(beta=7.0).fit(g, b)
    # the inverted softmaxes keep centred (log-mean-exp) biases: log-sum-exp minus log(bank size)
    np.testing.assert_allclose(is_.bias_, np.log(np.exp(7.0 * ref.cos(b, g)).mean(axis=0)) / 7.0, atol=1e-5)
    dual = hubless.DualIS(beta_query=6.0, beta_gallery=3.0).fit(g, b, gb)
    lme_q = np.log(np.exp(6.0 * ref.cos(b, g)).mean(axis=0))
    lme_g = np.log(np.exp(3.0 * ref.cos(gb, g)).mean(axis=0))
    np.testing.assert_allclose(dual.bias_, (lme_q + lme_g) / 9.0, atol=1e-5)
    for corr in (nnn, dn, is_, dual):
        assert corr.bias_.dtype == np.float32 and corr.bias_.shape == (len(g),)


def test_dis_activation_set_matches_definition(small_data):
    d = small_data
    dis = hubless.DynamicInvertedSoftmax(k_activation=3).fit(d["gallery"], d["query_bank"])
    np.testing.assert_array_equal(dis.activation_mask_, ref.activation_set(d["query_bank"], d["gallery"], 3))


def test_dualis_with_zero_gallery_beta_is_inverted_softmax(small_data):
    d = small_data
    dual = hubless.DualIS(beta_query=9.0, beta_gallery=0.0).fit(d["gallery"], d["query_bank"], d["gallery_bank"])
    is_ = hubless.InvertedSoftmax(beta=9.0).fit(d["gallery"], d["query_bank"])
    _, ids_dual = dual.search(d["queries"], top_k=10)
    _, ids_is = is_.search(d["queries"], top_k=10)
    np.testing.assert_array_equal(ids_dual, ids_is)


def test_gc_rank_counts_strictly_greater_probes():
    gallery = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    bank = np.array([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6]], dtype=np.float32)
    query = np.array([[0.8, 0.6]], dtype=np.float32)
    gc = hubless.GlobalCorrection().fit(gallery, bank)
    # s(q, r0) = 0.8; probes of r0: 1.0, 0.6, 0.8 -> one strictly above -> 0.8 - 1
    # s(q, r1) = 0.6; probes of r1: 0.0, 0.8, 0.6 -> one strictly above -> 0.6 - 1
    np.testing.assert_allclose(gc.score(query), [[-0.2, -0.4]], atol=1e-6)
    with pytest.raises(AttributeError, match="rank-based"):
        _ = gc.bias_


def test_gc_refuses_probe_matrices_over_its_memory_cap(small_data):
    d = small_data
    with pytest.raises(ValueError, match="max_probe_bytes"):
        hubless.GlobalCorrection(max_probe_bytes=1000).fit(d["gallery"], d["query_bank"])


def test_fit_many_equals_separate_fits(small_data):
    d = small_data
    specs = ["baseline", "nnn:alpha=0.5,k=3", "nnn:k=9", "csls:k=4", "dn", "is:beta=5", "dis:beta=8", "dualis", "dualdis", "gc"]
    together = hubless.fit_many(specs, d["gallery"], d["query_bank"], d["gallery_bank"])
    for spec, corr in zip(specs, together):
        alone = hubless.make_correction(spec).fit(d["gallery"], d["query_bank"], d["gallery_bank"])
        np.testing.assert_allclose(corr.score(d["queries"]), alone.score(d["queries"]), rtol=1e-6, atol=1e-7)


def test_statistics_can_be_reused_across_fits(small_data):
    d = small_data
    from hubless.engine import StatisticsRequest, compute_statistics

    stats = compute_statistics(d["gallery"], d["query_bank"], None, StatisticsRequest(query_topk=32))
    for k in (1, 8, 32):
        reused = hubless.NNN(k=k).fit(d["gallery"], d["query_bank"], statistics=stats)
        fresh = hubless.NNN(k=k).fit(d["gallery"], d["query_bank"])
        np.testing.assert_array_equal(reused.bias_, fresh.bias_)
    with pytest.raises(ValueError, match="top-64"):
        hubless.NNN(k=64).fit(d["gallery"], d["query_bank"], statistics=stats)
    with pytest.raises(ValueError, match="other sizes"):
        hubless.NNN(k=4).fit(d["gallery"][:10], d["query_bank"], statistics=stats)
