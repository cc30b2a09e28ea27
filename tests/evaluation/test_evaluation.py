"""Evaluation metrics against direct loops; evaluate() against search; bootstrap; truth files."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless
from hubless.errors import InvalidInput
from hubless.evaluation import evaluate
from hubless.metrics import (
    PerQuery,
    Truth,
    bootstrap_ci,
    captions_per_item,
    hubness_statistics,
    load_truth,
    per_query_metrics,
    relevant_ranks,
    summarize,
)


# ---------------------------------------------------------------- direct loop references
def loop_ranking(scores_row):
    """Gallery ids best first: score descending, then lower id (a plain Python sort)."""
    return sorted(range(len(scores_row)), key=lambda j: (-scores_row[j], j))


def loop_metrics(scores, lists, ks):
    firsts, aps = [], []
    for row, rel in zip(scores, lists):
        order = loop_ranking(list(row))
        positions = sorted(order.index(j) + 1 for j in rel)
        firsts.append(positions[0])
        r = len(rel)
        top_r = order[:r]
        hits, ap = 0, 0.0
        for i, j in enumerate(top_r, start=1):
            if j in rel:
                hits += 1
                ap += hits / i
        aps.append(ap / r)
    firsts = np.array(firsts)
    out = {f"R@{k}": 100 * np.mean(firsts <= k) for k in ks}
    out.update(MdR=float(np.median(firsts)), MnR=float(firsts.mean()), MRR=float(np.mean(1 / firsts)))
    out["mAP@R"] = 100 * float(np.mean(aps))
    return out


@st.composite
def ranking_case(draw):
    n_q = draw(st.integers(1, 8))
    n_g = draw(st.integers(1, 12))
    # Few distinct values so ties are frequent.
    scores = np.array(draw(st.lists(st.integers(0, 3), min_size=n_q * n_g, max_size=n_q * n_g)), dtype=np.float32)
    scores = scores.reshape(n_q, n_g)
    lists = [sorted(draw(st.sets(st.integers(0, n_g - 1), min_size=1, max_size=min(4, n_g)))) for _ in range(n_q)]
    return scores, lists


@settings(max_examples=150, deadline=None)
@given(ranking_case())
def test_metrics_equal_direct_loops_with_ties_and_several_relevant(case):
    scores, lists = case
    truth = Truth.from_lists(lists, scores.shape[1])
    ks = (1, 2, 5)
    got = summarize(per_query_metrics(PerQuery(relevant_ranks(scores, truth), truth), ks))
    want = loop_metrics(scores, lists, ks)
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == pytest.approx(want[name], abs=1e-9), name


def test_ranks_break_ties_by_lower_index():
    scores = np.array([[1.0, 2.0, 2.0, 0.0]], dtype=np.float32)
    truth = Truth.from_lists([[1, 2, 3, 0]], 4)
    # order: 1, 2, 0, 3
    assert relevant_ranks(scores, truth).tolist() == [3, 1, 2, 4]


def test_image_to_text_hit_when_any_caption_is_in_top_k():
    _, i2t = captions_per_item(2, per=3)
    # image 0's captions are 0..2; it ranks caption 4 first, then caption 2.
    scores = np.array([[0.1, 0.2, 0.8, 0.3, 0.9, 0.0], [0.0] * 6], dtype=np.float32)
    scores[1, 5] = 1.0
    pq = PerQuery(relevant_ranks(scores, i2t), i2t)
    assert pq.first_rank.tolist() == [2, 1]
    values = summarize(per_query_metrics(pq, (1, 2)))
    assert values["R@1"] == 50.0 and values["R@2"] == 100.0


def test_captions_per_item_layout():
    t2i, i2t = captions_per_item(3, per=5)
    assert t2i.n_queries == 15 and t2i.n_gallery == 3
    assert t2i.indices.tolist() == [j // 5 for j in range(15)]
    assert i2t.n_queries == 3 and i2t.n_gallery == 15
    assert i2t.to_json()[1] == [5, 6, 7, 8, 9]
    assert (t2i.expected_occurrence() == 5).all()


def test_truth_files_and_errors(tmp_path):
    np.save(tmp_path / "labels.npy", np.array([0, 2, 1]))
    assert load_truth(tmp_path / "labels.npy", 3, 3).indices.tolist() == [0, 2, 1]
    np.save(tmp_path / "padded.npy", np.array([[0, 1], [2, -1]]))
    assert load_truth(tmp_path / "padded.npy", 2, 3).to_json() == [[0, 1], [2]]
    (tmp_path / "lists.json").write_text(json.dumps([[1], [0, 2]]))
    assert load_truth(tmp_path / "lists.json", 2, 3).to_json() == [[1], [0, 2]]
    assert load_truth("t2i:5", 10, 2).indices.tolist() == [0] * 5 + [1] * 5
    with pytest.raises(ValueError, match="covers 3 queries"):
        load_truth(tmp_path / "labels.npy", 4, 3)
    with pytest.raises(ValueError, match=r"in \[0, 2\)"):
        load_truth(tmp_path / "labels.npy", 3, 2)
    with pytest.raises(ValueError, match="no relevant"):
        Truth.from_lists([[0], []], 2)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_truth(tmp_path / "bad.json", 1, 1)
    np.save(tmp_path / "float.npy", np.array([0.5]))
    with pytest.raises(ValueError, match="integers"):
        load_truth(tmp_path / "float.npy", 1, 1)
    for lists in ([[1.7], [0]], [["1"], [0]], [[float("nan")], [0]], [[True], [0]]):  # never truncated or parsed to an id
        with pytest.raises(InvalidInput, match="integers"):
            load_truth(lists, 2, 3)
    assert load_truth([[np.int64(1)], [0, 2]], 2, 3).to_json() == [[1], [0, 2]]
    with pytest.raises(FileNotFoundError):
        load_truth(tmp_path / "missing.npy", 1, 1)


def test_truth_subset_keeps_lists():
    truth = Truth.from_lists([[0], [1, 2], [3], [0, 3]], 4)
    assert truth.subset(np.array([3, 1])).to_json() == [[0, 3], [1, 2]]


# ---------------------------------------------------------------- hubness
def test_hubness_statistics_by_hand():
    ids = np.array([[0, 1], [0, 2], [0, 1], [3, 0]])
    stats = hubness_statistics(ids, 5, ks=(1, 2), expected=np.ones(5))
    # N_1 = [3, 0, 0, 1, 0]
    assert stats["N1_max"] == 3
    assert stats["N1_antihub_share"] == pytest.approx(3 / 5)
    assert stats["N1_mean_abs_excess"] == pytest.approx((2 + 1 + 1 + 0 + 1) / 5)
    mean = 4 / 5
    assert stats["N1_robin_hood"] == pytest.approx(0.5 * (abs(3 - mean) + 3 * mean + abs(1 - mean)) / 4)
    assert stats["N1_top1pct_share"] == pytest.approx(3 / 4)  # the 1% most frequent: one item, N_1 = 3
    assert stats["N1_hub_occurrence"] == pytest.approx(3 / 4)  # scikit-hubness: hubs have N_1 >= 2
    assert stats["N2_hub_occurrence"] == pytest.approx(4 / 8)  # N_2 >= 4: item 0 alone
    assert hubness_statistics(ids, 5, ks=(2,), hub_size=1)["N2_hub_occurrence"] == pytest.approx((4 + 2) / 8)
    # N_2 = [4, 2, 1, 1, 0]
    assert stats["N2_max"] == 4
    from scipy import stats as sps

    assert stats["N2_kurtosis"] == pytest.approx(sps.kurtosis([4, 2, 1, 1, 0]))
    assert stats["N2_skewness"] == pytest.approx(sps.skew([4, 2, 1, 1, 0]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=2, max_size=200))
def test_numpy_skewness_and_kurtosis_equal_scipy(counts):
    from scipy import stats as sps

    from hubless.metrics.hubness import kurtosis, skewness

    x = np.asarray(counts, dtype=np.float64)
    if x.min() == x.max():
        assert skewness(x) == kurtosis(x) == 0.0
    else:
        assert skewness(x) == pytest.approx(sps.skew(x), rel=1e-9, abs=1e-9)
        assert kurtosis(x) == pytest.approx(sps.kurtosis(x, fisher=True), rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------- bootstrap
def test_bootstrap_known_answer_and_determinism():
    rng = np.random.default_rng(3)
    hits = 100.0 * (rng.random(4000) < 0.3)
    ci = bootstrap_ci({"R@1": hits}, 500, seed=1)["R@1"]
    # The normal approximation: 30 +- 1.96 * sqrt(.3 * .7 / 4000) * 100 = 30 +- 1.42
    assert ci[0] == pytest.approx(hits.mean() - 1.42, abs=0.3)
    assert ci[1] == pytest.approx(hits.mean() + 1.42, abs=0.3)
    assert bootstrap_ci({"R@1": hits}, 500, seed=1)["R@1"] == ci
    constant = bootstrap_ci({"MdR": np.full(10, 3.0)}, 50)["MdR"]
    assert constant == (3.0, 3.0)
    with pytest.raises(ValueError):
        bootstrap_ci({"R@1": np.array([])}, 10)


# ---------------------------------------------------------------- evaluate()
@pytest.fixture(scope="module")
def data():
    from hubless.data.synthetic import make_retrieval_data

    return make_retrieval_data(n_items=300, dim=32, n_query_bank=3000, n_gallery_bank=600, seed=0)


def test_evaluate_agrees_with_search_for_every_method(data):
    methods = ["nnn:alpha=0.5,k=8", "csls", "dn", "is", "dis", "dualis", "dualdis", "gc"]
    ev = evaluate(data.gallery, data.queries, data.query_item, data.query_bank, methods, gallery_bank=data.gallery_bank, bootstrap=50)
    assert [r.method for r in ev.results][0] == "baseline"
    for r in ev.results:
        corr = hubless.make_correction(r.spec).fit(data.gallery, data.query_bank, data.gallery_bank)
        _, ids = corr.search(data.queries, top_k=10)
        hit_rank = np.where(ids == data.query_item[:, None], np.arange(1, 11), 99).min(axis=1)
        for k in (1, 5, 10):
            assert r.metrics[f"R@{k}"] == pytest.approx(100 * np.mean(hit_rank <= k)), (r.spec, k)
        assert r.hubness["N1_max"] == np.bincount(ids[:, 0]).max()
        lo, hi = r.ci95["R@1"]
        assert lo <= r.metrics["R@1"] <= hi
    nnn = ev["nnn:alpha=0.5,k=8"]
    assert nnn.delta["R@1"] == pytest.approx(nnn.metrics["R@1"] - ev["baseline"].metrics["R@1"])
    assert nnn.delta["R@1"] > 0 and nnn.hubness["N1_max"] < ev["baseline"].hubness["N1_max"]


def test_evaluate_image_to_text_with_several_captions(data):
    n_items = data.gallery.shape[0]
    _, i2t = captions_per_item(n_items, data.captions_per_item)
    ev = evaluate(data.queries, data.gallery, i2t, data.gallery_bank, ["baseline"], bootstrap=0)
    sims = data.gallery @ data.queries.T
    want = loop_metrics(sims[:40], i2t.to_json()[:40], (1, 5, 10))
    sub = evaluate(data.queries, data.gallery[:40], i2t.subset(np.arange(40)), None, ["baseline"], bootstrap=0)
    assert sub["baseline"].metrics == pytest.approx(want)
    assert ev["baseline"].ci95 == {}


def test_evaluate_rejects_bad_input(data):
    with pytest.raises(ValueError, match="larger than the gallery"):
        evaluate(data.gallery, data.queries, data.query_item, data.query_bank, ["baseline"], ks=(1, 10_000))
    with pytest.raises(ValueError, match="covers"):
        evaluate(data.gallery, data.queries[:10], data.query_item, data.query_bank, ["baseline"])
    with pytest.raises(ValueError, match="unknown method"):
        evaluate(data.gallery, data.queries, data.query_item, data.query_bank, ["nope"])


@pytest.mark.parametrize("fractional", [False, True])
def test_per_query_values_with_one_relevant_item_each_follow_the_definitions(fractional):
    """One relevant item per query (the fast path): the first rank is its rank and AP@R (R = 1)
    is 1 at rank 1, else 0; "average" tie ranks (halves) included."""
    rng = np.random.default_rng(4)
    ranks = rng.integers(1, 6, size=200).astype(np.float64 if fractional else np.int64)
    if fractional:
        ranks += rng.integers(0, 2, size=200) * 0.5
    truth = Truth.from_labels(rng.integers(0, 50, size=200), 50)
    pq = PerQuery(ranks, truth)
    np.testing.assert_array_equal(pq.first_rank, ranks)
    np.testing.assert_array_equal(pq.ap_at_r, [1.0 if r == 1 else 0.0 for r in ranks])
    ranks[0] = 99  # the values are the query's own, not a view of the caller's array
    assert pq.first_rank[0] != 99
