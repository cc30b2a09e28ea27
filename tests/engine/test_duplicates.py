"""Exact duplicate rows (hubless.engine.duplicates) against plain Python, and every copy scoring
as its first copy wherever scores are made: bank statistics and biases (every method, numpy and
torch), exact search and score() (copies in several column blocks), on data full of copies."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless
from hubless.engine import duplicates as dup
from hubless.engine import stream, use_device
from hubless.engine.duplicates import find_duplicates
from tests.conftest import unit_rows

METHODS = ["nnn:k=4", "csls:k=3", "dn", "is:beta=20.0", "dis:k_activation=2", "dualis", "dualdis:k_activation=2", "gc"]


def plain_firsts(rows: np.ndarray) -> list[int]:
    """The first row equal to each row (by value: -0.0 equals 0.0), by a dictionary of tuples."""
    first: dict[tuple, int] = {}
    return [first.setdefault(tuple(float(v) + 0.0 for v in row), i) for i, row in enumerate(rows)]


def with_copies(rng, n_unique: int, n: int, d: int) -> np.ndarray:
    """``n`` rows drawn from ``n_unique`` distinct unit rows: many exact copies, anywhere."""
    return unit_rows(rng, n_unique, d)[rng.integers(0, n_unique, n)]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), d=st.integers(1, 6), levels=st.integers(1, 3), seed=st.integers(0, 10_000), collide=st.booleans())
def test_find_duplicates_equals_a_dictionary_of_rows(n, d, levels, seed, collide):
    """Few values per coordinate (many equal rows, -0.0 among them); ``collide``: every row
    hashed alike, so the byte comparison alone tells rows apart."""
    rng = np.random.default_rng(seed)
    rows = rng.choice(np.array([-0.0, 0.0, 1.5, -2.25][: levels + 1], dtype=np.float32), size=(n, d))
    saved = dup._MULTIPLIERS
    try:
        if collide:
            dup._MULTIPLIERS = np.zeros_like(saved)  # every hash 0
        found = find_duplicates(rows)
    finally:
        dup._MULTIPLIERS = saved
    firsts = np.array(plain_firsts(rows), dtype=np.int64)
    copies = np.flatnonzero(firsts != np.arange(n))
    np.testing.assert_array_equal(found.copies, copies)
    np.testing.assert_array_equal(found.firsts, firsts[copies])
    np.testing.assert_array_equal(found.first_of(np.arange(n)), firsts)
    assert bool(found) == bool(copies.size) and found.n == n


def test_no_coordinates_no_duplicates():
    assert not find_duplicates(np.zeros((5, 0), np.float32))  # a correction fitted on score matrices


@settings(max_examples=40, deadline=None)
@given(n_unique=st.integers(1, 12), n=st.integers(1, 30), k=st.integers(1, 30), seed=st.integers(0, 10_000))
def test_expand_and_relabel_give_the_top_k_where_each_copy_has_its_first_copy_s_score(n_unique, n, k, seed):
    """``expand_top_k`` (copies left out, then put back) and ``relabel_top_k`` (copies competing
    with last-bit noise) both give the top-k of scores where every copy has its first copy's
    score, ties to the lower id: the order of a stable sort."""
    rng = np.random.default_rng(seed)
    rows = with_copies(rng, n_unique, n, 8)
    found = find_duplicates(rows)
    k = min(k, n)
    scores = unit_rows(rng, 5, 8) @ rows.T
    scores[:, found.copies] = scores[:, found.firsts]
    want = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    masked = scores.copy()
    masked[:, found.copies] = -np.inf
    ids = np.argsort(-masked, axis=1, kind="stable")[:, :k]
    values, got = found.expand_top_k(np.take_along_axis(masked, ids, 1), ids, k)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(values, np.take_along_axis(scores, want, 1))
    noisy = scores + np.float32(1e-7) * rng.standard_normal(scores.shape).astype(np.float32) * (scores != 0)
    noisy[:, found.firsts] = scores[:, found.firsts]  # the first copies' own scores; their copies off by a last bit
    ids = np.argsort(-noisy, axis=1, kind="stable")[:, :k]
    near = np.sort(np.abs(np.diff(np.unique(scores))))  # distinct scores far apart: only copies are "near ties"
    if near.size and near[0] < 1e-5:
        return
    _, relabelled = found.relabel_top_k(np.take_along_axis(noisy, ids, 1), ids)
    np.testing.assert_array_equal(relabelled, want)


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_copies_get_identical_statistics_and_biases_for_every_method(device):
    """A gallery where a third of the rows repeat others, banks with copies too: every copy's
    bank statistics and bias columns are its first copy's, bitwise, for every method."""
    rng = np.random.default_rng(3)
    gallery = with_copies(rng, 80, 120, 24)
    bank, gallery_bank = with_copies(rng, 150, 180, 24), with_copies(rng, 90, 100, 24)
    found = find_duplicates(gallery)
    assert len(found) >= 30
    with use_device(device):
        fitted = hubless.fit_many(METHODS, gallery, bank, gallery_bank, progress=False)
    for corr in fitted:
        stats = corr.statistics_
        for values in (stats.query_topk, stats.query_probes, *stats.query_lse.values(), *stats.gallery_lse.values()):
            if values is not None:
                np.testing.assert_array_equal(values[found.copies], values[found.firsts], err_msg=corr.spec)
        if hasattr(corr, "bias_columns_"):
            np.testing.assert_array_equal(corr.bias_columns_[found.copies], corr.bias_columns_[found.firsts], err_msg=corr.spec)
        for ids in (stats.query_activation, stats.gallery_activation):
            if ids is not None:  # a copy is only listed after its first copy
                listed = set(ids.ravel().tolist())
                assert all(f in listed for c, f in zip(found.copies, found.firsts) if c in listed), corr.spec
    bank_copies = find_duplicates(bank)  # a bank item's copy lists the same gallery items (no near ties in this data)
    stats = hubless.fit_many(["dis:k_activation=2"], gallery, bank, progress=False)[0].statistics_
    assert len(bank_copies) >= 20
    np.testing.assert_array_equal(stats.query_activation[bank_copies.copies], stats.query_activation[bank_copies.firsts])


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_search_and_score_rank_copies_in_index_order_across_column_blocks(device, monkeypatch):
    """Copies that fall into different column blocks of the engine (blocks of 7 columns here)
    score as their first copy in score() and come after it, in index order, in search()."""
    monkeypatch.setattr(stream, "COL_BLOCK", 7)
    rng = np.random.default_rng(8)
    gallery = with_copies(rng, 20, 60, 16)
    found = find_duplicates(gallery)
    queries = unit_rows(rng, 9, 16)
    for spec in ("baseline", "nnn:k=3", "dis:k_activation=2", "gc"):
        corr = hubless.make_correction(spec).fit(gallery, unit_rows(rng, 50, 16), progress=False)
        with use_device(device):
            full = corr.score(queries)
            scores, ids = corr.search(queries, 25)
        np.testing.assert_array_equal(full[:, found.copies], full[:, found.firsts], err_msg=spec)
        want = np.argsort(-full, axis=1, kind="stable")[:, :25]
        np.testing.assert_array_equal(ids, want, err_msg=spec)
        np.testing.assert_array_equal(scores, np.take_along_axis(full, want, 1), err_msg=spec)
