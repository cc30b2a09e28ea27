"""Numerically safe inverted softmaxes: centred (log-mean-exp) biases rank as float64 does over
the whole accepted beta range; out-of-range parameters and inputs are refused with a message;
a fitted bias is never NaN or inf."""

from __future__ import annotations

import re

import numpy as np
import pytest

import hubless
from hubless.corrections.inverted_softmax import BETA_RANGE
from tests import reference as ref


def float64_is_bias(gallery, bank, beta):
    """(1/beta) log mean_b exp(beta s(b, r)) in float64 with max-subtraction: the reference."""
    s = ref.cos(bank, gallery).astype(np.float64) * beta
    peak = s.max(axis=0)
    return (peak + np.log(np.exp(s - peak).mean(axis=0))) / beta


@pytest.mark.parametrize("beta", [1e-6, 1e-4, 0.5, 20.0, 1e3, 1e5, 1e6])
def test_is_ranks_as_float64_over_the_beta_range(small_data, beta):
    g, b, q = small_data["gallery"], small_data["query_bank"], small_data["queries"]
    corr = hubless.InvertedSoftmax(beta=beta).fit(g, b)
    expected = float64_is_bias(g, b, beta)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(corr.bias_, expected, atol=2e-6 * scale)
    want = ref.cos(q, g).astype(np.float64) - expected[None, :]
    _, ids = corr.search(q, 10)
    ref.assert_same_ranking(ids, want, 10, atol=1e-5)


@pytest.mark.parametrize("beta", [1e-4, 20.0, 1e5])
def test_dualis_ranks_as_float64(small_data, beta):
    g, b, gb, q = small_data["gallery"], small_data["query_bank"], small_data["gallery_bank"], small_data["queries"]
    corr = hubless.DualIS(beta_query=beta, beta_gallery=beta / 2).fit(g, b, gb)
    expected = (beta * float64_is_bias(g, b, beta) + beta / 2 * float64_is_bias(g, gb, beta / 2)) / (1.5 * beta)
    np.testing.assert_allclose(corr.bias_, expected, atol=2e-6 * max(1.0, float(np.abs(expected).max())))
    _, ids = corr.search(q, 10)
    ref.assert_same_ranking(ids, ref.cos(q, g).astype(np.float64) - expected[None, :], 10, atol=1e-5)


def test_scores_stay_the_inverted_softmax_probability(small_data):
    g, b, q = small_data["gallery"], small_data["query_bank"], small_data["queries"]
    np.testing.assert_allclose(hubless.InvertedSoftmax(beta=7.0).fit(g, b).score(q), ref.inverted_softmax(q, g, b, 7.0), rtol=1e-4)
    gb = small_data["gallery_bank"]
    np.testing.assert_allclose(hubless.DualIS(6.0, 3.0).fit(g, b, gb).score(q), ref.dual_is(q, g, b, gb, 6.0, 3.0), rtol=1e-4)


@pytest.mark.parametrize("beta", [1e-7, 2e6, 1e20, 3e38, 1e39, float("inf"), float("nan"), -1.0])
def test_out_of_range_betas_are_refused(beta):
    with pytest.raises(ValueError, match="beta"):
        hubless.InvertedSoftmax(beta=beta)
    with pytest.raises(ValueError, match="beta"):
        hubless.DualIS(beta_query=beta)
    with pytest.raises(ValueError, match="beta"):
        hubless.make_correction(f"dis:beta={beta}")


def test_beta_range_is_documented_in_the_error():
    with pytest.raises(ValueError, match=re.escape(f"between {BETA_RANGE[0]:g} and {BETA_RANGE[1]:g}")):
        hubless.InvertedSoftmax(beta=1e9)
    assert hubless.DualIS(beta_query=20.0, beta_gallery=0.0).beta_gallery == 0.0  # 0 switches a factor off


def test_huge_raw_vectors_are_refused_not_crashing(small_data):
    g = small_data["gallery"] * 1e20
    with pytest.raises(ValueError, match="overflow float32"):
        hubless.InvertedSoftmax().set_params(normalize=False).fit(g, small_data["query_bank"])
    ok = small_data["gallery"] * 1e3  # large but safe: accepted (with the not-normalised warning)
    with pytest.warns(hubless.UnnormalizedEmbeddingsWarning):
        corr = hubless.NNN().set_params(normalize=False).fit(ok, small_data["query_bank"])
    assert np.isfinite(corr.bias_).all()
