"""Another query bank as a version (hubless.index.bank_swap): the candidate equals a fresh
build on the new bank (to float rounding, ties aside), adopting it is one new version, a
rejected one is kept but never current."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from hubless.data.synthetic import make_retrieval_data
from hubless.errors import Conflict, InvalidInput
from hubless.index import bank_swap
from tests.index.test_live_index import assert_same_results


@pytest.fixture(scope="module")
def data():
    return make_retrieval_data(300, dim=24, n_query_bank=1200, n_gallery_bank=200, seed=3)


@pytest.mark.parametrize("method", ["nnn", "csls", "is", "dis", "dn", "dualis", "dualdis"])
def test_a_candidate_equals_a_fresh_build_on_the_new_bank(data, method):
    index = hubless.Index.build(data.gallery, data.query_bank[:500], method, gallery_bank=data.gallery_bank)
    index.remove([3, 7])  # dead rows and a tail: the candidate is over the live items, in order
    index.add(data.gallery[:5] * -1.0)
    new_bank = data.query_bank[500:]
    made = bank_swap.candidate(index, new_bank)
    live = index.get(index.ids).embeddings
    fresh = hubless.Index.build(live, new_bank, method, gallery_bank=data.gallery_bank, ids=index.ids)
    # to float rounding: the kept gallery-bank statistics of the rows written since the base came
    # from other BLAS calls than a fresh build's one pass (the last bit may differ on some CPUs)
    np.testing.assert_allclose(made.bias, fresh._snap.bias, rtol=1e-6, atol=1e-7)
    assert_same_results(*made.index.search(data.queries, 10), *fresh.search(data.queries, 10))
    np.testing.assert_array_equal(made.origin_bias, index._snap.bias[index._snap.live_rows])
    np.testing.assert_array_equal(made.index.query_bank, new_bank)
    assert index.query_bank.shape[0] == 500  # the index itself is not changed


def test_adopt_and_keep_rejected_on_disk(data, tmp_path):
    hubless.Index.build(data.gallery, data.query_bank[:500], "nnn").save(tmp_path / "idx")
    index = hubless.Index.open(tmp_path / "idx")
    index.set_keep_versions(4)
    before = index.search(data.queries, 5)[1]
    rejected = bank_swap.keep_rejected(index, bank_swap.candidate(index, data.query_bank[500:900]))
    listed = {v["version"]: v for v in hubless.Index.versions(tmp_path / "idx")}
    assert listed[rejected]["current"] is False
    np.testing.assert_array_equal(hubless.Index.load(tmp_path / "idx").search(data.queries, 5)[1], before)  # never served
    offline = hubless.Index.build(data.gallery, data.query_bank[500:900], "nnn")
    np.testing.assert_array_equal(
        hubless.Index.load(tmp_path / "idx", version=rejected).search(data.queries, 5)[1], offline.search(data.queries, 5)[1]
    )
    made = bank_swap.candidate(index, data.query_bank[900:])
    version = bank_swap.adopt(index, made)
    newest = hubless.Index.versions(tmp_path / "idx")[-1]
    assert version > rejected and (newest["version"], newest["current"]) == (version, True)
    np.testing.assert_array_equal(hubless.Index.load(tmp_path / "idx").query_bank, data.query_bank[900:])
    with pytest.raises(Conflict):  # made from a version that is no longer current
        bank_swap.adopt(index, made)
    assert hubless.Index.restore(tmp_path / "idx", rejected) > version  # a person may still choose it


def test_a_method_without_a_query_bank_is_refused(data):
    index = hubless.Index.build(data.gallery, data.query_bank[:100], "baseline")
    with pytest.raises(InvalidInput, match="no query bank"):
        bank_swap.candidate(index, data.query_bank[100:200])
