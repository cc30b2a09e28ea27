"""Corrected ANN (docs/corrected-ann.md): the augmented transform is exact for every additive
correction, IVF spills and bias-aware probing never change a score, PQ gives the bias codes of
its own, and updates keep the stored rows consistent."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

import hubless
from hubless.data.synthetic import make_retrieval_data
from hubless.index.faiss_build import (
    PROBE_BIAS_SHARE,
    Layout,
    _first_copies,
    build_faiss,
    plan_layout,
    query_rows,
    spill_threshold,
    stored_rows,
)
from hubless.index.live import Snapshot
from tests.index.test_index import assert_same_ranking

ADDITIVE = ["baseline", "nnn:alpha=0.75,k=8", "csls:k=8", "dn:lam=0.5", "is:beta=10", "dis:beta=10,k_activation=1",
            "dualis", "dualdis"]  # fmt: skip


@pytest.fixture(scope="module")
def data():
    return make_retrieval_data(n_items=1500, dim=24, n_query_bank=3000, n_gallery_bank=600, n_val_items=10, seed=5)


@pytest.mark.parametrize("method", [*ADDITIVE[:-1], "dualdis:ungated=exp"])
def test_inner_product_of_augmented_rows_is_the_corrected_ranking(data, method):
    """[q, -W(q)] . [r, bias(r)] ranks like the correction's own exact ranking, for every
    exactly additive correction (per-query gates included), in every layout."""
    corr = hubless.make_correction(method).fit(data.gallery, data.query_bank, data.gallery_bank)
    q = data.queries[:200]
    batch = corr.queries(q)
    reference = corr.rank(batch, q @ corr.gallery_.T)
    assert corr.exactly_additive  # (published DualDIS is not: indexes re-score its candidates, below)
    extra = -corr.weights(batch).astype(np.float32)
    for factory in ("Flat", "IVF8,PQ6", "IVF8,PQ5x4"):
        _, dim, offset = plan_layout(factory, corr.dim_, corr.bias_columns_.shape[1])
        layout = Layout(dim, offset)
        rows = query_rows(corr.gallery_, corr.bias_columns_, layout)
        scores = query_rows(q, extra, layout) @ rows.T
        np.testing.assert_allclose(scores, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ADDITIVE)
def test_ivf_with_spill_probing_every_list_is_exact(data, method):
    """Spilled copies and the centroids' bias coordinates only decide which items are scanned:
    with every list probed, the corrected IVF top 10 is the exact one, each item once."""
    index = hubless.Index.build(data.gallery, data.query_bank, method, "IVF16,Flat", gallery_bank=data.gallery_bank, rescore=False)
    assert index.config.spill == 0.3 and (index.config.spill_below is None) == (method == "baseline")
    assert (
        index._snap.faiss.ntotal
        == stored_rows(index.correction.bias_columns_, index.config.spill_below)
        > (1500 if method != "baseline" else 1499)
    )
    scores, ids = index.search(data.queries[:300], 10, nprobe=16)
    assert all(len(set(row)) == 10 for row in ids)
    ref_scores, ref_ids = index.correction.search(data.queries[:300], 10)
    assert_same_ranking(ids, scores, ref_ids, ref_scores, rtol=1e-4)


def test_centroids_carry_half_the_mean_training_bias_and_items_join_by_cosine(data):
    corr = hubless.NNN(alpha=0.75, k=8).fit(data.gallery, data.query_bank)
    aug = np.hstack([corr.gallery_, corr.bias_columns_])
    index, layout = build_faiss("IVF8,Flat", corr.gallery_, aug, spill=0.0)
    centroids = index.quantizer.reconstruct_n(0, 8)
    lists = np.argmax(corr.gallery_ @ centroids[:, :24].T, axis=1)
    for lst in range(8):
        ids = faiss.rev_swig_ptr(index.invlists.get_ids(lst), index.invlists.list_size(lst))
        assert set(ids.tolist()) == set(np.flatnonzero(lists == lst).tolist())  # by r . c, not [r, bias] . [c, b]
        expected = PROBE_BIAS_SHARE * corr.bias_columns_[lists == lst, 0].mean()
        assert centroids[lst, 24] == pytest.approx(expected, rel=1e-5)


def test_spill_stores_the_lowest_bias_share_in_a_second_list(data):
    corr = hubless.NNN(alpha=0.75, k=8).fit(data.gallery, data.query_bank)
    aug = np.hstack([corr.gallery_, corr.bias_columns_])
    index, layout = build_faiss("IVF8,Flat", corr.gallery_, aug, spill=0.25)
    bias = corr.bias_columns_[:, 0]
    assert layout.spill_below == pytest.approx(np.quantile(bias, 0.25))
    copies = np.bincount(np.concatenate([
        faiss.rev_swig_ptr(index.invlists.get_ids(lst), index.invlists.list_size(lst)) for lst in range(8)
    ]), minlength=1500)  # fmt: skip
    np.testing.assert_array_equal(copies, np.where(bias <= layout.spill_below, 2, 1))
    with pytest.raises(ValueError, match="spill"):
        spill_threshold(corr.bias_columns_, 1.0)
    assert spill_threshold(np.zeros((10, 1)), 0.3) is None  # no bias, nothing promoted


def test_first_copies_keeps_each_id_once_best_first():
    scores = np.array([[5, 4, 4, 3, 2, 1], [9, 9, 8, 8, 7, 7]], np.float32)
    ids = np.array([[7, 3, 3, 9, 7, -1], [1, 1, 2, 2, 3, 3]])
    s, i = _first_copies(scores, ids, 4)
    np.testing.assert_array_equal(i, [[7, 3, 9, -1], [1, 2, 3, -1]])
    np.testing.assert_array_equal(s[:, :3], [[5, 4, 3], [9, 8, 7]])
    assert s[1, 3] == -np.inf


def test_pq_codes_keep_the_bias_apart_from_the_unit_dimensions(data):
    """PQ<m> is built as PQ<m+1>: the bias has a sub-vector of its own, so its decoded value is
    nearly exact, where sharing a code with unit dimensions blurs it."""
    assert plan_layout("IVF64,PQ64", 512, 1) == ("IVF64,PQ65", 520, 512)
    assert plan_layout("IVF64,PQ48x4", 384, 2) == ("IVF64,PQ49x4", 392, 384)
    assert plan_layout("HNSW32", 512, 1) == ("HNSW32", 513, 512)
    rng = np.random.default_rng(0)
    g = rng.standard_normal((1000, 32)).astype(np.float32)
    g /= np.linalg.norm(g, axis=1, keepdims=True)
    bias = (0.5 + 0.1 * rng.standard_normal((1000, 1))).astype(np.float32)
    index, layout = build_faiss("IVF4,PQ8x4", g, np.hstack([g, bias]))
    assert (layout.dim, layout.bias_offset) == (36, 32) and faiss.downcast_index(faiss.extract_index_ivf(index)).pq.M == 9
    ivf = faiss.extract_index_ivf(index)
    ivf.make_direct_map()
    decoded = np.vstack([index.reconstruct(i) for i in range(0, 1000, 10)])[:, 32]
    own = np.abs(decoded - bias[::10, 0]).mean()
    x = np.zeros((1000, 40), np.float32)
    x[:, :33] = np.hstack([g, bias])
    shared = faiss.index_factory(40, "PQ8x4", faiss.METRIC_INNER_PRODUCT)  # the old layout: the bias shares a code
    shared.train(x)
    shared.add(x)
    old = np.abs(shared.reconstruct_n(0, 1000)[::10, 32] - bias[::10, 0]).mean()
    assert own < old / 3, (own, old)


def test_updates_keep_rows_spilled_and_consistent(data, tmp_path):
    index = hubless.Index.build(data.gallery[:1000], data.query_bank, "nnn:alpha=0.75,k=8", "IVF16,Flat", rescore=False)

    def consistent(idx):
        snap = idx._snap  # FAISS holds the base rows (spilled); rows added since are scanned exactly
        n_base = snap.base_rows.shape[0]
        assert snap.faiss.ntotal == stored_rows(snap.bias_buf.view(n_base), idx.config.spill_below)
        scores, ids = idx.search(data.queries[:100], 10, nprobe=16)
        ref_scores, ref_rows = idx.correction.search(data.queries[:100], 10)
        assert_same_ranking(ids, scores, idx.ids[ref_rows], ref_scores, rtol=1e-4)  # rows of the live items -> their ids

    index.add(data.gallery[1000:])  # new items spilled by the stored threshold
    consistent(index)
    index.remove(np.arange(0, 1500, 7))
    consistent(index)
    index.add_query_bank(data.val_queries[:300])  # every bias moves: refilled, threshold recomputed
    consistent(index)
    index.save(tmp_path / "idx")
    loaded = hubless.Index.load(tmp_path / "idx")
    assert loaded.config == index.config
    consistent(loaded)
    mm = hubless.Index.load(tmp_path / "idx", mmap=True)
    mm.add(data.val_gallery[:50])  # memory-mapped lists are rebuilt in memory, with the same spill
    consistent(mm)


def test_indexes_saved_before_the_bias_layout_still_search(data, tmp_path):
    """An index written before spill and PQ bias codes (no such config fields, bias right after
    the unit part) loads and searches as it did."""
    corr = hubless.NNN().fit(data.gallery, data.query_bank)
    old_dim = 32  # padded_dim("IVF16,PQ8x4", 25): 8 sub-vectors of 4, the bias sharing one
    aug = np.zeros((1500, old_dim), np.float32)
    aug[:, :25] = np.hstack([corr.gallery_, corr.bias_columns_])
    old = faiss.index_factory(old_dim, "IVF16,PQ8x4", faiss.METRIC_INNER_PRODUCT)
    old.train(aug)
    old.add(aug)
    legacy = hubless.Index.__new__(hubless.Index)
    config = hubless.IndexConfig("IVF16,PQ8x4", nprobe=16, rescore_factor=20)
    ids = np.arange(corr.n_gallery_, dtype=np.int64)
    legacy._setup(Snapshot.from_correction(corr, config, ids=ids, faiss=old, faiss_dim=old_dim))
    assert legacy._snap.layout == Layout(old_dim, 24)
    _, ids = legacy.search(data.queries[:200], 10)
    ref = corr.search(data.queries[:200], 10)[1]
    assert np.mean([len(set(a) & set(b)) for a, b in zip(ids, ref)]) / 10 >= 0.9
