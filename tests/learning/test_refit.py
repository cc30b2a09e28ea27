"""A learned bank's refit equals an offline fit on the same bank (brute force: a fresh
hubless.Index.build on the reservoir's bank; to float rounding, ties aside: a part's products are
other BLAS calls than one pass's), whether its statistics were computed at once or merged from
parts kept between refits; later refits compute only the rows not seen yet, a
write to the items makes the next one full, and a write between making and adopting a refit
supersedes it. The versions it commits are kept, listed and searchable as of."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from hubless.data.synthetic import make_retrieval_data
from hubless.engine import compute_statistics
from hubless.engine.updates import side_request
from hubless.learning import BankLearner, BankReservoir, GuardSettings
from hubless.learning.refit import PartStatistics
from tests.conftest import unit_rows
from tests.index.test_live_index import assert_same_results

METHODS = ["nnn", "csls", "is", "dis", "dn", "dualis", "dualdis"]
OPEN = GuardSettings(max_skewness_increase=1e9, max_hub_share_increase=1e9, max_bias_shift=1e9, min_holdout=5)


@pytest.fixture(scope="module")
def data():
    return make_retrieval_data(200, dim=16, n_query_bank=3000, n_gallery_bank=150, seed=5)


def test_merged_part_statistics_equal_one_pass_over_the_bank(data):
    r = BankReservoir(16, 900, quota=None, holdout=0.0, seed=data.query_bank[:200], random_state=1)
    request = (
        hubless.corrections.make_correction("dualdis:k_activation=3")
        .statistics_request()
        .merge(hubless.corrections.make_correction("nnn:k=8").statistics_request())
    )
    parts = PartStatistics(threads=None)
    items = object()
    for step in range(4):
        r.offer(data.query_bank[200 + 400 * step : 600 + 400 * step], f"c{step}")
        got = parts.merged(items, data.gallery, request, r.parts(), r.lock)
        bank = r.bank()
        np.testing.assert_array_equal(got.bank, bank)
        want = compute_statistics(data.gallery, bank, None, side_request(request, "query"))
        # the merges are exact, but a part's products are other BLAS calls than one pass's: on some
        # CPUs' kernels (OPENBLAS_CORETYPE=Haswell, Zen) a similarity differs in the last bit
        np.testing.assert_allclose(got.statistics.query_topk, want.query_topk, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(got.statistics.query_activation_scores, want.query_activation_scores, rtol=1e-6, atol=1e-7)
        assert (got.statistics.query_activation == want.query_activation).mean() > 0.99  # ties within rounding aside
        for beta, lse in want.query_lse.items():
            np.testing.assert_allclose(got.statistics.query_lse[beta], lse, rtol=1e-6)
        np.testing.assert_allclose(got.statistics.query_bank_mean, want.query_bank_mean, rtol=1e-6, atol=1e-9)
        assert got.computed_rows + got.reused_rows == bank.shape[0]
        if step:
            assert got.computed_rows <= 400  # only the rows added since
    assert parts.merged(object(), data.gallery, request, r.parts(), r.lock).reused_rows == 0  # other items: all computed again


@pytest.mark.parametrize("method", METHODS)
def test_a_refit_equals_an_offline_fit_on_the_same_bank(data, method, tmp_path):
    far = unit_rows(np.random.default_rng(9), 300, 16)
    hubless.Index.build(data.gallery, far, method, gallery_bank=data.gallery_bank).save(tmp_path / "idx")
    index = hubless.Index.open(tmp_path / "idx")
    learner = BankLearner(index, capacity=1500, quota=None, holdout=0.1, every=10**9, interval=None, guard=OPEN)
    assert index.keep_versions == 10  # raised so that every learned version is kept
    for i in range(0, 1200, 50):
        learner.observe(data.query_bank[i : i + 50], f"client{i % 7}")
    learner.admit()
    first = learner.refit()
    assert first["decision"] == "accepted" and first["computed_rows"] == first["bank"]["size"]
    for i in range(1200, 1800, 50):
        learner.observe(data.query_bank[i : i + 50], f"client{i % 7}")
    learner.admit()
    second = learner.refit()
    assert second["decision"] == "accepted" and second["reused_rows"] > 0 and second["computed_rows"] < second["bank"]["size"]
    bank = learner.reservoir.bank()
    offline = hubless.Index.build(data.gallery, bank, method, gallery_bank=data.gallery_bank)
    served = hubless.Index.load(tmp_path / "idx")
    np.testing.assert_array_equal(served.query_bank, bank)
    np.testing.assert_allclose(served._snap.bias, offline._snap.bias, rtol=1e-5, atol=1e-6)
    assert_same_results(*served.search(data.queries, 10), *offline.search(data.queries, 10))  # ties within rounding aside
    versions = [v["version"] for v in hubless.Index.versions(tmp_path / "idx")]
    assert first["version"] in versions and second["version"] == versions[-1]
    as_of = hubless.Index.load(tmp_path / "idx", version=first["from_version"])  # the far bank's version, searchable as of
    np.testing.assert_array_equal(as_of.query_bank, far)


def test_a_write_to_the_items_makes_the_next_refit_full_and_one_in_between_supersedes(data):
    index = hubless.Index.build(data.gallery, data.query_bank[:300], "nnn")
    learner = BankLearner(index, capacity=1000, quota=None, holdout=0.1, every=10**9, interval=None, guard=OPEN)
    learner.observe(data.query_bank[300:900], "a")
    learner.admit()
    assert learner.refit()["decision"] == "accepted"
    index.add(unit_rows(np.random.default_rng(3), 5, 16))
    learner.observe(data.query_bank[900:1000], "a")
    learner.admit()
    full = learner.refit()
    assert full["decision"] == "accepted" and full["reused_rows"] == 0  # other items: every part computed again
    offline = hubless.Index.build(index.get(index.ids).embeddings, learner.reservoir.bank(), "nnn", ids=index.ids)
    assert_same_results(*index.search(data.queries, 10), *offline.search(data.queries, 10))

    def write_meanwhile(change):  # another write lands between making the refit and adopting it
        index.remove([int(index.ids[0])])
        return change(index)

    learner.write = write_meanwhile
    learner.observe(data.query_bank[1000:1100], "a")
    learner.admit()
    superseded = learner.refit()
    assert superseded["decision"] == "superseded" and "changed" in superseded["reasons"][0]
    assert index.query_bank.shape[0] == full["bank"]["size"]  # not adopted


def test_nothing_is_tried_with_too_few_queries(data):
    index = hubless.Index.build(data.gallery, data.query_bank[:300], "nnn")
    learner = BankLearner(index, min_bank=100, guard=GuardSettings(min_holdout=20), quota=None, every=50)
    learner.observe(data.query_bank[300:350], "a")
    assert learner.step() is None and learner.history == type(learner.history)()
