"""The guard of a learned bank's refits (hubless.learning.guard): its hubness figures equal a
brute-force count, a shift common to every item is no move, a refit that follows a change of
domain is accepted, one that makes the held-out queries' hubness worse is rejected saying so,
and one crafted to demote an item is rejected naming the item."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import skew

import hubless
from hubless.data.synthetic import make_retrieval_data
from hubless.errors import InvalidInput
from hubless.index import bank_swap
from hubless.learning import GuardSettings, judge
from hubless.learning.guard import bias_shift, hubness_figures
from tests.conftest import unit_rows


@pytest.fixture(scope="module")
def world():
    data = make_retrieval_data(600, dim=32, n_query_bank=6000, seed=2)
    far = make_retrieval_data(200, dim=32, n_query_bank=2000, seed=8).query_bank  # captions of other topics
    return data, far


def test_hubness_figures_equal_a_brute_force_count(world):
    data, _ = world
    index = hubless.Index.build(data.gallery, data.query_bank[:2000], "nnn")
    queries = data.queries[:400]
    got = hubness_figures(index, queries)
    top = np.argsort(-(queries @ data.gallery.T - 0.75 * index.correction.bias_columns_[:, 0]), axis=1, kind="stable")[:, :10]
    n10 = np.bincount(top.ravel(), minlength=600)
    n1 = np.bincount(top[:, 0], minlength=600)
    assert got["n10_skewness"] == pytest.approx(skew(n10), rel=1e-9) and got["n1_skewness"] == pytest.approx(skew(n1), rel=1e-9)
    assert got["top_hub_share"] == n10.max() / top.size and got["hubs"][0] == {"id": int(np.argmax(n10)), "n10": int(n10.max())}


def test_a_shift_common_to_every_item_is_no_move():
    rng = np.random.default_rng(0)
    before = rng.standard_normal((100, 2)).astype(np.float32)
    assert bias_shift(before, before + 0.5, 0.75)[0] == pytest.approx(0.0, abs=1e-6)
    after = before + 0.5
    after[17, 1] += 0.4
    moved, where, spread = bias_shift(before, after, 0.75)
    assert where == 17 and moved == pytest.approx(0.3, rel=1e-5) and spread == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(InvalidInput):
        bias_shift(before, after[:5], 1.0)


def test_a_change_of_domain_is_accepted(world):
    data, far = world
    current = hubless.Index.build(data.gallery, far, "nnn")
    made = bank_swap.candidate(current, data.query_bank[:3000])
    verdict = judge(current, made.index, data.query_bank[5000:5500], made.origin_bias, made.bias, GuardSettings())
    assert verdict.accepted, verdict.reasons
    assert verdict.after["n10_skewness"] < verdict.before["n10_skewness"]  # the in-domain bank reduces the held-out hubness


def test_worse_hubness_is_rejected_saying_so(world):
    data, far = world
    current = hubless.Index.build(data.gallery, data.query_bank[:3000], "nnn")
    made = bank_swap.candidate(current, far)
    verdict = judge(current, made.index, data.query_bank[5000:5500], made.origin_bias, made.bias, GuardSettings(max_bias_shift=10.0))
    assert not verdict.accepted and "N10 skewness" in verdict.reasons[0] and len(verdict.reasons) >= 1


def test_a_bank_crafted_to_demote_one_item_is_rejected_naming_it(world):
    data, _ = world
    current = hubless.Index.build(data.gallery, data.query_bank[:3000], "nnn")
    target = 17
    attack = data.gallery[target] + 0.3 * unit_rows(np.random.default_rng(1), 250, 32)  # 250 queries aimed at item 17
    attack = (attack / np.linalg.norm(attack, axis=1, keepdims=True)).astype(np.float32)
    made = bank_swap.candidate(current, np.concatenate([data.query_bank[250:3000], attack]))
    verdict = judge(current, made.index, data.query_bank[5000:5500], made.origin_bias, made.bias, GuardSettings())
    assert not verdict.accepted and verdict.moved_item == target
    assert any(f"item {target}'s corrected score moved" in r for r in verdict.reasons)
    honest = bank_swap.candidate(current, data.query_bank[250:3250])  # the same change without the attack
    assert judge(current, honest.index, data.query_bank[5000:5500], honest.origin_bias, honest.bias, GuardSettings()).accepted
