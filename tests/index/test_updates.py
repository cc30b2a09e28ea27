"""Incremental updates (add/remove gallery items, add query-bank items) equal a refit from scratch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless
from hubless.corrections import incremental, make_correction
from hubless.data.synthetic import make_retrieval_data
from hubless.engine import BankStatistics

METHODS = [
    "baseline",
    "nnn:alpha=0.75,k=8",
    "csls:k=5",
    "dn",
    "is:beta=20.0",
    "dis:beta=20.0,k_activation=1",
    "dis:beta=10.0,k_activation=3",
    "dualis",
    "dualdis:k_activation=2",
    "gc",
]


@pytest.fixture(scope="module")
def data():
    return make_retrieval_data(n_items=600, dim=24, n_query_bank=900, n_gallery_bank=300, n_val_items=10, hubness=0.8, seed=11)


def fitted(method, gallery, query_bank, gallery_bank):
    return make_correction(method).fit(gallery, query_bank, gallery_bank)


def assert_same_fit(corr, ref, queries):
    """Same fitted state (biases, gates, kept statistics) and same scores and ranking."""
    assert corr.n_gallery_ == ref.n_gallery_
    np.testing.assert_array_equal(corr.gallery_, ref.gallery_)
    for name in ("bias_columns_", "probes_"):
        if hasattr(ref, name):
            np.testing.assert_allclose(getattr(corr, name), getattr(ref, name), rtol=1e-5, atol=1e-6)
    for name in ("activation_mask_", "activation_masks_"):
        if hasattr(ref, name):
            np.testing.assert_array_equal(getattr(corr, name), getattr(ref, name))
    a, b = corr.statistics_, ref.statistics_
    assert (a.n_gallery, a.n_query_bank, a.n_gallery_bank) == (b.n_gallery, b.n_query_bank, b.n_gallery_bank)
    for name in ("query_activation", "gallery_activation"):
        if getattr(b, name) is not None:
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_allclose(corr.score(queries), ref.score(queries), rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(corr.search(queries, 5)[1], ref.search(queries, 5)[1])


@pytest.mark.parametrize("method", METHODS)
def test_add_items_equals_fitting_on_the_grown_gallery(data, method):
    g, qb, gb = data.gallery, data.query_bank, data.gallery_bank
    corr = incremental.add_items(fitted(method, g[:450], qb, gb), g[450:], qb, gb)
    assert_same_fit(corr, fitted(method, g, qb, gb), data.queries[:200])


@pytest.mark.parametrize("method", METHODS)
def test_remove_items_equals_fitting_on_the_rest(data, method):
    g, qb, gb = data.gallery, data.query_bank, data.gallery_bank
    corr = fitted(method, g, qb, gb)
    # remove every third item and, for the gated methods, most of the activation set, so that
    # bank items lose their nearest items and have them recomputed
    hubs = np.flatnonzero(getattr(corr, "activation_mask_", np.zeros(len(g), bool)))
    removed = np.union1d(np.arange(0, len(g), 3), hubs[::2])
    incremental.remove_items(corr, removed, qb, gb)
    keep = np.setdiff1d(np.arange(len(g)), removed)
    assert_same_fit(corr, fitted(method, g[keep], qb, gb), data.queries[:200])


@pytest.mark.parametrize("method", METHODS)
def test_add_query_bank_equals_fitting_on_the_grown_bank(data, method):
    g, qb, gb = data.gallery, data.query_bank, data.gallery_bank
    corr = incremental.add_query_bank(fitted(method, g, qb[:700], gb), qb[700:])
    assert_same_fit(corr, fitted(method, g, qb, gb), data.queries[:200])


@pytest.mark.parametrize("method", ["dn", "dualis", "dualdis:k_activation=2"])
def test_add_gallery_bank_equals_fitting_on_the_grown_bank(data, method):
    g, qb, gb = data.gallery, data.query_bank, data.gallery_bank
    corr = incremental.add_gallery_bank(fitted(method, g, qb, gb[:200]), gb[200:])
    ref = fitted(method, g, qb, gb)
    assert_same_fit(corr, ref, data.queries[:200])
    np.testing.assert_allclose(corr.statistics_.gallery_bank_mean, ref.statistics_.gallery_bank_mean, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(n_new=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_adding_then_removing_items_restores_the_fit(n_new, seed):
    rng = np.random.default_rng(seed)
    g, qb, new = (rng.standard_normal((n, 8)).astype(np.float32) for n in (50, 80, n_new))
    corr = hubless.DynamicInvertedSoftmax(beta=5.0, k_activation=2).fit(g, qb)
    before = corr.bias_columns_.copy(), corr.activation_mask_.copy()
    incremental.remove_items(incremental.add_items(corr, new, qb), np.arange(50, 50 + n_new), qb)
    np.testing.assert_allclose(corr.bias_columns_, before[0], rtol=1e-6)
    np.testing.assert_array_equal(corr.activation_mask_, before[1])


def test_updates_check_their_inputs(data):
    g, qb = data.gallery, data.query_bank
    corr = hubless.NNN(k=8).fit(g, qb)
    with pytest.raises(ValueError, match="needs the query_bank"):
        incremental.add_items(corr, g[:3])
    with pytest.raises(ValueError, match="fitted on 900"):
        incremental.add_items(corr, g[:3], qb[:10])
    with pytest.raises(ValueError, match="dimension"):
        incremental.add_items(corr, g[:3, :5], qb)
    with pytest.raises(ValueError, match="must be in"):
        incremental.remove_items(corr, [len(g)])
    with pytest.raises(ValueError, match="every gallery item"):
        incremental.remove_items(corr, np.arange(len(g)))
    with pytest.raises(ValueError, match="k=10"):
        incremental.remove_items(hubless.CSLS(k=10).fit(g[:12], qb), [0, 1, 2])
    with pytest.raises(ValueError, match="query bank"):
        incremental.remove_items(hubless.DynamicInvertedSoftmax().fit(g, qb), np.arange(len(g) - 1))
    assert corr.n_gallery_ == len(g)  # failed updates changed nothing
    with pytest.raises(ValueError, match="without a gallery bank"):
        incremental.add_gallery_bank(corr, data.gallery_bank)
    with pytest.raises(hubless.NotFitted, match="not fitted"):
        incremental.add_items(hubless.NNN(), g[:3], qb)


def test_statistics_round_trip_through_arrays(data):
    corr = hubless.DualDIS(k_activation=2).fit(data.gallery, data.query_bank, data.gallery_bank)
    stats = BankStatistics.from_arrays(dict(corr.statistics_.to_arrays()))
    assert stats.request == corr.statistics_.request
    again = hubless.DualDIS(k_activation=2).fit(data.gallery, data.query_bank, data.gallery_bank, statistics=stats)
    np.testing.assert_array_equal(again.bias_columns_, corr.bias_columns_)
    np.testing.assert_array_equal(again.activation_masks_, corr.activation_masks_)


def test_a_saved_correction_loads_back_ranking_bitwise_as_it_did(data, tmp_path):
    from hubless.corrections import score_fit

    g, qb, gb, q = data.gallery, data.query_bank, data.gallery_bank, data.queries[:50]
    for spec in ("nnn:alpha=0.5,k=8", "dualdis:k_activation=2", "csls:k=5", "gc", "baseline"):
        corr = fitted(spec, g, qb, gb)
        path = corr.save(tmp_path / f"{spec.partition(':')[0]}.npz")
        again = hubless.load_correction(path)
        assert again.spec == corr.spec and type(again) is type(corr)
        np.testing.assert_array_equal(again.score(q), corr.score(q))
        np.testing.assert_array_equal(again.search(q, 7).ids, corr.search(q, 7).ids)
        if corr.additive:
            np.testing.assert_array_equal(again.bias(), corr.bias())
        incremental.add_items(again, g[:5], qb, gb)  # what it keeps is enough to update it
        assert again.n_gallery_ == corr.n_gallery_ + 5
    on_scores = score_fit.fit_scores(hubless.NNN(k=8), qb @ g.T)  # a fit on score matrices saves too
    again = hubless.load_correction(on_scores.save(tmp_path / "scores.npz"))
    np.testing.assert_array_equal(score_fit.correct_rows(again, q @ g.T), score_fit.correct_rows(on_scores, q @ g.T))


def test_save_refuses_to_replace_what_hubless_did_not_write_and_load_refuses_damage(data, tmp_path):
    corr = fitted("nnn:k=8", data.gallery, data.query_bank, None)
    mine = tmp_path / "mine.npz"
    mine.write_bytes(b"not hubless")
    with pytest.raises(hubless.errors.AlreadyExists, match="overwrite=True"):
        corr.save(mine)
    with pytest.raises(hubless.errors.AlreadyExists, match="not a file hubless wrote"):
        corr.save(mine, overwrite=True)
    assert mine.read_bytes() == b"not hubless"
    path = corr.save(tmp_path / "nnn.npz")
    corr.save(path, overwrite=True)  # its own file: replaced
    with pytest.raises(hubless.errors.Corrupt):
        hubless.load_correction(mine)
    damaged = tmp_path / "damaged.npz"
    damaged.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(hubless.errors.Corrupt):
        hubless.load_correction(damaged)
    with pytest.raises(hubless.errors.MissingFile):
        hubless.load_correction(tmp_path / "nothing.npz")
    with pytest.raises(hubless.NotFitted):
        hubless.NNN().save(tmp_path / "unfitted.npz")
    with pytest.raises(hubless.errors.InvalidType, match="not by a per-candidate bias"):
        fitted("gc", data.gallery, data.query_bank, None).bias()
