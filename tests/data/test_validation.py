"""Bad input gets a clear error (and good input in other dtypes works)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import hubless
from hubless import UnnormalizedEmbeddingsWarning


@pytest.fixture
def fitted(small_data):
    return hubless.NNN(k=4).fit(small_data["gallery"], small_data["query_bank"])


@pytest.mark.parametrize("arg", ["gallery", "query_bank"])
@pytest.mark.parametrize(
    "bad,match",
    [
        (np.ones(16, np.float32), "2-D"),
        (np.ones((2, 3, 16), np.float32), "2-D"),
        (np.ones((0, 16), np.float32), "empty"),
        (np.ones((5, 0), np.float32), "zero-length"),
    ],
)
def test_fit_rejects_bad_shapes(small_data, arg, bad, match):
    inputs = {"gallery": small_data["gallery"], "query_bank": small_data["query_bank"]}
    inputs[arg] = bad
    with pytest.raises(ValueError, match=match):
        hubless.NNN(k=1).fit(inputs["gallery"], inputs["query_bank"])


def test_one_dimensional_query_gets_a_hint(fitted):
    with pytest.raises(ValueError, match=r"x\[None, :\]"):
        fitted.search(np.ones(16, np.float32))


@pytest.mark.parametrize("where", ["gallery", "query_bank", "queries", "gallery_bank"])
def test_dimension_mismatch_names_the_argument(small_data, where):
    d = dict(small_data)
    d[where] = d[where][:, :10]
    corr = hubless.DualIS()
    if where == "queries":
        corr.fit(d["gallery"], d["query_bank"], d["gallery_bank"])
        with pytest.raises(ValueError, match="queries has dimension 10 but the gallery has dimension 16"):
            corr.search(d["queries"])
    else:
        with pytest.raises(ValueError, match="dimension"):
            corr.fit(d["gallery"], d["query_bank"], d["gallery_bank"])


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("where", ["gallery", "query_bank", "queries"])
def test_non_finite_values_are_refused(small_data, value, where):
    d = {k: v.copy() for k, v in small_data.items()}
    d[where][3, 5] = value
    corr = hubless.NNN(k=2)
    if where == "queries":
        corr.fit(d["gallery"], d["query_bank"])
        with pytest.raises(ValueError, match="queries contains NaN or Inf in 1 row.*row 3"):
            corr.search(d["queries"])
    else:
        with pytest.raises(ValueError, match=f"{where} contains NaN or Inf"):
            corr.fit(d["gallery"], d["query_bank"])


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_, np.complex64, object])
def test_non_float_dtypes_are_refused(small_data, dtype):
    with pytest.raises(TypeError, match="floating-point"):
        hubless.NNN(k=2).fit(small_data["gallery"].astype(dtype), small_data["query_bank"])


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_float16_and_float64_are_converted(small_data, dtype):
    d = small_data
    ref_scores, ref_ids = hubless.NNN(k=3).fit(d["gallery"], d["query_bank"]).search(d["queries"], 5)
    conv = lambda x: x.astype(dtype)  # noqa: E731
    scores, ids = hubless.NNN(k=3).fit(conv(d["gallery"]), conv(d["query_bank"])).search(conv(d["queries"]), 5)
    assert scores.dtype == np.float32
    tol = 1e-2 if dtype == np.float16 else 1e-6
    np.testing.assert_allclose(scores, ref_scores, atol=tol)
    if dtype == np.float64:
        np.testing.assert_array_equal(ids, ref_ids)


def test_lists_are_accepted(small_data):
    d = small_data
    corr = hubless.NNN(k=2).fit(d["gallery"].tolist(), d["query_bank"].tolist())
    assert corr.search(d["queries"][:2].tolist(), 3)[1].shape == (2, 3)


def test_k_larger_than_the_bank(small_data):
    with pytest.raises(ValueError, match=r"k=201 exceeds the size of the query bank \(200\)"):
        hubless.NNN(k=201).fit(small_data["gallery"], small_data["query_bank"])
    with pytest.raises(ValueError, match="exceeds the size of the gallery"):
        hubless.CSLS(k=61).fit(small_data["gallery"], small_data["query_bank"])
    with pytest.raises(ValueError, match="k_activation"):
        hubless.DynamicInvertedSoftmax(k_activation=61).fit(small_data["gallery"], small_data["query_bank"])


@pytest.mark.parametrize(
    "top_k,exc,match", [(10**6, ValueError, "top_k=1000000 is far beyond"), (0, ValueError, ">= 1"), (2.5, TypeError, "integer")]
)
def test_bad_top_k(fitted, small_data, top_k, exc, match):
    with pytest.raises(exc, match=match):
        fitted.search(small_data["queries"], top_k=top_k)


def test_top_k_beyond_the_gallery_is_padded(fitted, small_data):
    """The one top-k rule (tests/code/test_top_k_rule.py): 61 of 60 items keeps the width."""
    scores, ids = fitted.search(small_data["queries"], top_k=61)
    assert ids.shape == (small_data["queries"].shape[0], 61)
    assert (ids[:, 60] == -1).all() and (scores[:, 60] == -np.inf).all() and (np.sort(ids[:, :60], axis=1) == np.arange(60)).all()


def test_top_k_equal_to_gallery_size_returns_a_permutation(fitted, small_data):
    _, ids = fitted.search(small_data["queries"], top_k=60)
    assert (np.sort(ids, axis=1) == np.arange(60)).all()


@pytest.mark.parametrize(
    "make,exc",
    [
        (lambda: hubless.NNN(k=0), ValueError),
        (lambda: hubless.NNN(k=2.0), TypeError),
        (lambda: hubless.NNN(alpha=float("nan")), ValueError),
        (lambda: hubless.NNN(alpha="big"), TypeError),
        (lambda: hubless.InvertedSoftmax(beta=0), ValueError),
        (lambda: hubless.InvertedSoftmax(beta=-1), ValueError),
        (lambda: hubless.DualIS(beta_query=0, beta_gallery=0), ValueError),
        (lambda: hubless.DN(lam=-0.1), ValueError),
        (lambda: hubless.NNN(normalize="yes"), TypeError),
    ],
)
def test_bad_parameters_fail_at_construction(make, exc):
    with pytest.raises(exc):
        make()


def test_set_params_validates_and_rolls_back():
    nnn = hubless.NNN(alpha=0.5, k=4)
    with pytest.raises(ValueError):
        nnn.set_params(k=0)
    assert nnn.get_params() == {"alpha": 0.5, "k": 4, "normalize": True}
    with pytest.raises(ValueError, match="no parameter 'beta'"):
        nnn.set_params(beta=3)


def test_missing_banks(small_data):
    d = small_data
    with pytest.raises(ValueError, match="needs a query bank"):
        hubless.NNN().fit(d["gallery"])
    with pytest.raises(ValueError, match="needs a gallery bank"):
        hubless.DualIS().fit(d["gallery"], d["query_bank"])
    with pytest.raises(ValueError, match="needs a gallery bank"):
        hubless.DualDIS().fit(d["gallery"], d["query_bank"])
    # banks a method has no use for are ignored, even if malformed
    hubless.NNN(k=2).fit(d["gallery"], d["query_bank"], gallery_bank=np.zeros(3))


def test_use_before_fit():
    with pytest.raises(hubless.NotFitted, match="not fitted"):
        hubless.NNN().search(np.ones((1, 4), np.float32))


def test_wrong_search_keyword(fitted, small_data):
    with pytest.raises(TypeError, match="accepts weight="):
        fitted.search(small_data["queries"], lam=0.3)
    with pytest.raises(TypeError, match="no weight override"):
        hubless.InvertedSoftmax().fit(small_data["gallery"], small_data["query_bank"]).search(small_data["queries"], alpha=0.3)
    with pytest.raises(ValueError, match="one value per query"):
        fitted.search(small_data["queries"], weight=np.ones(3))


def test_unnormalised_input_warns_once_without_normalize(small_data):
    d = small_data
    g, b = 3 * d["gallery"], 2 * d["query_bank"]
    with pytest.warns(UnnormalizedEmbeddingsWarning) as record:
        corr = hubless.NNN(k=2, normalize=False).fit(g, b)
        corr.fit(g, b)
    assert sorted(str(w.message).split()[0] for w in record) == ["gallery", "query_bank"]


def test_normalize_true_is_silent_and_equals_normalised_input(small_data):
    d = small_data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaled = hubless.NNN(k=2).fit(3 * d["gallery"], 2 * d["query_bank"]).search(5 * d["queries"], 5)
    plain = hubless.NNN(k=2).fit(d["gallery"], d["query_bank"]).search(d["queries"], 5)
    np.testing.assert_allclose(scaled[0], plain[0], atol=1e-6)
    np.testing.assert_array_equal(scaled[1], plain[1])


def test_zero_vector_cannot_be_normalised(small_data):
    g = small_data["gallery"].copy()
    g[7] = 0
    with pytest.raises(ValueError, match="all-zero row.*row 7"):
        hubless.NNN(k=2).fit(g, small_data["query_bank"])


def test_input_arrays_are_not_modified(small_data):
    d = {k: 2 * v for k, v in small_data.items()}
    before = {k: v.copy() for k, v in d.items()}
    corr = hubless.DualDIS().fit(d["gallery"], d["query_bank"], d["gallery_bank"])
    corr.search(d["queries"])
    corr.score(d["queries"])
    for k in d:
        np.testing.assert_array_equal(d[k], before[k])


@pytest.mark.parametrize(
    "spec,match",
    [
        ("nope", "unknown method 'nope'"),
        ("nnn:alpha", "write name=value"),
        ("nnn:beta=2", "no parameter"),
        ("", "non-empty"),
        ("nnn:k=-3", ">= 1"),
    ],
)
def test_bad_method_specs(spec, match):
    with pytest.raises((ValueError, TypeError), match=match):
        hubless.make_correction(spec)


@pytest.mark.parametrize("name", list(hubless.METHODS))
def test_spec_round_trip(name):
    corr = hubless.make_correction(name)
    again = hubless.make_correction(corr.spec)
    assert type(again) is type(corr) and again.get_params() == corr.get_params()


def test_normalising_a_row_does_not_depend_on_its_batch():
    from hubless._validation import as_embeddings

    near_unit = np.array([[0.6, 0.7995]], dtype=np.float32)  # norm 0.9996: within the warning tolerance
    batch = np.vstack([near_unit, [[3.0, 4.0]]]).astype(np.float32)
    alone, together = as_embeddings(near_unit, "x", normalize=True), as_embeddings(batch, "x", normalize=True)
    np.testing.assert_array_equal(alone[0], together[0])
    assert abs(np.linalg.norm(alone[0]) - 1) < 1e-6
    assert near_unit[0, 1] == np.float32(0.7995) and batch[1, 0] == 3.0  # the caller's arrays are not modified
    unit = np.array([[0.6, 0.8]], dtype=np.float32)
    assert as_embeddings(unit, "x", normalize=True) is unit  # already unit: no copy
