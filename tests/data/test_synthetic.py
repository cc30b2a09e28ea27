"""The synthetic generator: seeded, well-formed, and with hubs that corrections can remove."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from hubless.data import make_retrieval_data
from hubless.metrics import k_occurrence, recall_at_k


def test_shapes_norms_and_layout():
    d = make_retrieval_data(n_items=50, captions_per_item=3, dim=16, n_query_bank=101, n_gallery_bank=20, n_val_items=7)
    assert d.gallery.shape == (50, 16) and d.queries.shape == (150, 16)
    assert d.query_bank.shape == (101, 16) and d.gallery_bank.shape == (20, 16)
    assert d.val_gallery.shape == (7, 16) and d.val_queries.shape == (21, 16)
    np.testing.assert_array_equal(d.query_item, np.arange(150) // 3)
    for arr in (d.gallery, d.queries, d.query_bank, d.gallery_bank, d.val_gallery, d.val_queries):
        assert arr.dtype == np.float32
        np.testing.assert_allclose(np.linalg.norm(arr, axis=1), 1.0, atol=1e-5)


def test_seeded():
    a, b, c = make_retrieval_data(seed=3), make_retrieval_data(seed=3), make_retrieval_data(seed=4)
    np.testing.assert_array_equal(a.queries, b.queries)
    assert not np.array_equal(a.queries, c.queries)


def test_banks_do_not_contain_test_queries():
    d = make_retrieval_data()
    rows = {r.tobytes() for r in d.queries}
    assert not any(r.tobytes() in rows for r in d.query_bank)
    assert not any(r.tobytes() in rows for r in d.val_queries)


def test_hubness_knob_creates_hubs_that_nnn_removes():
    def top1(data, corr):
        return corr.fit(data.gallery, data.query_bank).search(data.queries, top_k=1)[1]

    flat = make_retrieval_data(hubness=0.0)
    hubby = make_retrieval_data(hubness=1.0)
    assert k_occurrence(top1(hubby, hubless.Baseline()), 1000).max() > 1.5 * k_occurrence(top1(flat, hubless.Baseline()), 1000).max()
    base, nnn = top1(hubby, hubless.Baseline()), top1(hubby, hubless.NNN())
    assert recall_at_k(nnn, hubby.query_item, 1) > recall_at_k(base, hubby.query_item, 1) + 3
    assert k_occurrence(nnn, 1000).max() < k_occurrence(base, 1000).max() / 2


@pytest.mark.parametrize("bad", [{"n_items": 0}, {"dim": 0}, {"n_query_bank": 0}])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        make_retrieval_data(**bad)


def test_the_cone_makes_global_hubs_and_leaves_everything_else_as_it_was():
    from hubless.engine import exact_search
    from hubless.metrics import hubness_statistics

    kwargs = {
        "n_items": 10_000,
        "captions_per_item": 1,
        "dim": 128,
        "n_query_bank": 500,
        "n_gallery_bank": 10,
        "n_val_items": 10,
        "n_topics": 100,
    }
    plain, cone, none = make_retrieval_data(**kwargs), make_retrieval_data(**kwargs, cone=0.5), make_retrieval_data(**kwargs, cone=0.0)
    for name in ("gallery", "queries", "query_bank", "gallery_bank"):
        np.testing.assert_array_equal(getattr(plain, name), getattr(none, name))  # cone=0: the same arrays
    queries = cone.queries[np.random.default_rng(0).choice(10_000, 1000, replace=False)]
    skew = hubness_statistics(exact_search(queries, cone.gallery, 10)[1], 10_000, ks=(10,))["N10_skewness"]
    before = hubness_statistics(exact_search(plain.queries[:1000], plain.gallery, 10)[1], 10_000, ks=(10,))["N10_skewness"]
    assert skew >= 10 > 4 > before  # strongly hub-prone (N10 skewness 11.1 measured), where the plain set has 3.3
    np.testing.assert_allclose(np.linalg.norm(cone.gallery, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("cone", [-0.1, float("nan"), float("inf"), True, "0.5"])
def test_a_bad_cone_is_refused(cone):
    with pytest.raises(hubless.errors.InvalidInput, match="cone"):
        make_retrieval_data(n_items=10, cone=cone)
