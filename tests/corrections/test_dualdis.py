"""DualDIS as published (a factor whose gate does not fire is the raw score s), checked against
an independent implementation; how hubless.Index serves it; the earlier "exp" form as an option;
DualIS with beta_gallery = 0 is IS."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from tests import reference as ref


def clip_like(rng, n, d, common):
    """Unit vectors sharing a common direction, so every cosine is positive (as CLIP's are)."""
    x = rng.standard_normal((n, d)) + common
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(21)
    common = 2.5 * rng.standard_normal(16)
    return {name: clip_like(rng, n, 16, common) for name, n in (("gallery", 120), ("bank", 300), ("gallery_bank", 150), ("queries", 200))}


def gate_configs(corr, queries):
    gates = corr.weights(corr.queries(queries)) > 0
    return {(bool(a), bool(b)) for a, b in gates}


def test_published_form_equals_the_independent_implementation(data):
    g, b, gb, q = data["gallery"], data["bank"], data["gallery_bank"], data["queries"]
    assert (ref.cos(q, g) > 0).all()
    corr = hubless.DualDIS(beta_query=8.0, beta_gallery=4.0, k_activation=1).fit(g, b, gb)
    assert len(gate_configs(corr, q)) >= 3  # the mixed cases are exercised, not only DualIS
    expected = ref.dual_dis_published(q, g, b, gb, 8.0, 4.0, 1)
    np.testing.assert_allclose(corr.score(q), expected, rtol=2e-4, atol=1e-7)
    _, ids = corr.search(q, 10)
    ref.assert_same_ranking(ids, expected, 10, atol=1e-6 * float(np.abs(expected).max()))


def test_items_with_non_positive_scores_come_last(small_data):
    g, b, gb, q = small_data["gallery"], small_data["query_bank"], small_data["gallery_bank"], small_data["queries"]
    corr = hubless.DualDIS(beta_query=8.0, beta_gallery=4.0).fit(g, b, gb)
    s = ref.cos(q, g)
    full = corr.score(q)
    gates = corr.weights(corr.queries(q)) > 0
    mixed = ~(gates[:, 0] & gates[:, 1])
    assert mixed.any()
    assert np.all(full[mixed][s[mixed] <= 0] == 0) and np.all(full[mixed][s[mixed] > 0] > 0)
    expected = ref.dual_dis_published(q, g, b, gb, 8.0, 4.0, 1)
    positive = np.where(s > 0, expected, -np.inf)  # the published score where it is a valid ranking
    _, ids = corr.search(q, 5)
    ref.assert_same_ranking(ids, positive, 5, atol=1e-6 * float(np.abs(expected).max()))


def test_index_serves_the_published_form(data):
    g, b, gb, q = data["gallery"], data["bank"], data["gallery_bank"], data["queries"]
    exact_scores, exact_ids = hubless.DualDIS(beta_query=8.0, beta_gallery=4.0).fit(g, b, gb).search(q, 10)
    flat = hubless.Index.build(g, b, "dualdis:beta_query=8.0,beta_gallery=4.0", "Flat", gallery_bank=gb)
    scores, ids = flat.search(q, 10)
    np.testing.assert_array_equal(ids, exact_ids)  # Flat: the exact streamed search
    np.testing.assert_array_equal(scores, exact_scores)
    ivf = hubless.Index.build(g, b, "dualdis:beta_query=8.0,beta_gallery=4.0", "IVF8,Flat", gallery_bank=gb, nprobe=8, rescore=False)
    _, ann_ids = ivf.search(q, 10)  # re-scored exactly even with rescore=False: the score is not a plain bias
    recall = np.mean([len(set(a) & set(e)) for a, e in zip(ann_ids, exact_ids)]) / 10
    assert recall >= 0.95, recall


def test_exp_form_is_an_option_and_a_plain_bias(data):
    corr = hubless.make_correction("dualdis:ungated=exp")
    assert corr.ungated == "exp" and corr.exactly_additive and "ungated=exp" in corr.spec
    assert not hubless.DualDIS().exactly_additive and hubless.make_correction(corr.spec).ungated == "exp"
    with pytest.raises(ValueError, match="ungated"):
        hubless.DualDIS(ungated="both")


def test_dualis_with_gallery_beta_zero_is_is(data):
    g, b, gb, q = data["gallery"], data["bank"], data["gallery_bank"], data["queries"]
    dual = hubless.DualIS(beta_query=10.0, beta_gallery=0.0).fit(g, b, gb)
    qb_norm = hubless.InvertedSoftmax(beta=10.0).fit(g, b)
    np.testing.assert_array_equal(dual.search(q, 10)[1], qb_norm.search(q, 10)[1])
