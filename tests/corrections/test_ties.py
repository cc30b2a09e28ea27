"""score() and search() agree, duplicate gallery rows included: both rank the same bitwise
similarity blocks, so search returns score's top k in score's order, ties to the lower index."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless
from hubless.corrections import Correction
from tests.conftest import unit_rows

METHODS = ["baseline", "nnn:alpha=0.75,k=4", "csls:k=4", "dn", "is:beta=20.0", "dis:beta=20.0", "dualis", "dualdis", "gc"]


def check_agreement(corr, queries, top_k):
    full = corr.score(queries)
    scores, ids = corr.search(queries, top_k)
    np.testing.assert_array_equal(full[np.arange(len(queries))[:, None], ids], scores)  # the very values score() shows
    for row in range(len(queries)):
        expected = np.argsort(-full[row], kind="stable")[:top_k]  # score's order, ties to the lower index
        np.testing.assert_array_equal(full[row, ids[row]], full[row, expected])  # search = score's top k, in order
        if type(corr).method_scores is Correction.method_scores:  # displayed score = ranking score: exact ids
            # (other methods map the ranking through exp or an affine map, which can round two
            # ranking values to one float32; such items then come in ranking order)
            assert ids[row].tolist() == expected.tolist(), (row, ids[row], expected)


@settings(max_examples=25, deadline=None)
@given(
    method=st.sampled_from(METHODS),
    n_unique=st.integers(3, 40),
    copies=st.integers(2, 6),
    seed=st.integers(0, 10_000),
)
def test_search_is_scores_top_k_with_duplicate_rows(method, n_unique, copies, seed):
    rng = np.random.default_rng(seed)
    base = unit_rows(rng, n_unique, 24)
    gallery = base[rng.integers(0, n_unique, size=n_unique * copies)]  # many exact duplicates, anywhere
    bank, gallery_bank, queries = unit_rows(rng, 60, 24), unit_rows(rng, 30, 24), unit_rows(rng, 17, 24)
    corr = hubless.make_correction(method).fit(gallery, bank, gallery_bank)
    check_agreement(corr, queries, min(10, gallery.shape[0]))


@pytest.mark.slow
def test_agreement_on_a_gallery_larger_than_one_block():
    """Duplicates that fall into different column blocks of the engine still agree."""
    rng = np.random.default_rng(5)
    base = unit_rows(rng, 300, 32)
    gallery = np.concatenate([base] * 70)  # 21,000 rows: more than one 16,384-column block
    corr = hubless.NNN(alpha=0.5, k=8).fit(gallery, unit_rows(rng, 500, 32))
    check_agreement(corr, unit_rows(rng, 40, 32), 20)
