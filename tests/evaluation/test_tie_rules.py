"""The tie rules keep every metric in its range, and ties among relevant items never cost a hit
(issue 51): ``ties="optimistic"`` once gave mAP@R 150 for two tied relevant items, and
``ties="average"`` turned two relevant items tied at the top into a miss at R@1. Each rule's
ranks are checked against the orderings it describes in tests/evaluation/test_scores.py
(``test_tie_conventions_against_orderings``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless
from hubless.engine import use_device
from hubless.metrics import PerQuery, Truth, per_query_metrics, relevant_ranks, summarize
from hubless.metrics.retrieval import TIES
from tests.conftest import unit_rows


@st.composite
def tie_patterns(draw):
    """Score rows of few distinct values (ties everywhere, exact copies' columns included) and
    one to five relevant items per query, some of them forced to tie with each other."""
    n_queries, n_gallery = draw(st.integers(1, 6)), draw(st.integers(1, 14))
    levels = draw(st.integers(1, 4))
    scores = np.array(draw(st.lists(st.integers(0, levels - 1), min_size=n_queries * n_gallery, max_size=n_queries * n_gallery)))
    scores = scores.reshape(n_queries, n_gallery).astype(np.float32)
    lists = [sorted(draw(st.sets(st.integers(0, n_gallery - 1), min_size=1, max_size=min(5, n_gallery)))) for _ in range(n_queries)]
    for q, items in enumerate(lists):
        if draw(st.booleans()):  # the relevant items tie with each other, at the top or anywhere
            scores[q, items] = draw(st.sampled_from([float(levels), float(levels // 2)]))
    return scores, lists


@settings(max_examples=200, deadline=None)
@given(case=tie_patterns(), ties=st.sampled_from(TIES))
def test_every_metric_stays_in_its_range_under_every_tie_rule(case, ties):
    scores, lists = case
    n_gallery = scores.shape[1]
    truth = Truth.from_lists(lists, n_gallery)
    ranks = relevant_ranks(scores, truth, ties)
    assert (ranks >= 1).all() and (ranks <= n_gallery).all()
    ks = tuple(k for k in (1, 2, 5, 10) if k <= n_gallery)
    per_query = PerQuery(ranks, truth)
    assert ((per_query.ap_at_r >= 0) & (per_query.ap_at_r <= 1)).all()
    values = per_query_metrics(per_query, ks)
    metrics = summarize(values)
    for k in ks:
        assert set(np.unique(values[f"R@{k}"])) <= {0.0, 100.0}
        assert 0 <= metrics[f"R@{k}"] <= 100
    assert all(metrics[f"R@{a}"] <= metrics[f"R@{b}"] for a, b in zip(ks, ks[1:]))  # R@K never falls as K grows
    assert 0 <= metrics["mAP@R"] <= 100
    assert 1 <= metrics["MdR"] <= n_gallery and 1 <= metrics["MnR"] <= n_gallery
    assert 0 < metrics["MRR"] <= 1
    for q, items in enumerate(lists):  # relevant items alone at the top: a hit, and every one found in time
        top = scores[q].max()
        if set(np.flatnonzero(scores[q] == top)) == set(items):
            assert values["R@1"][q] == 100 and values["mAP@R"][q] == pytest.approx(100), (ties, scores[q], items)


@pytest.mark.parametrize("ties", TIES)
@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_relevant_copies_tied_at_the_top_are_a_hit(ties, device):
    """Queries equal to a gallery item that has exact copies, all of them relevant: the copies
    tie at the top, so R@1 and mAP@R are 100 under every tie rule, on numpy and on torch."""
    rng = np.random.default_rng(5)
    items = unit_rows(rng, 50, 16)
    gallery = np.concatenate([items, items[:10], items[:10]])  # items 0-9 have two copies each
    queries = items[:10]
    truth = [[i, 50 + i, 60 + i] for i in range(10)]
    with use_device(device):
        ev = hubless.evaluate(
            gallery, queries, truth, unit_rows(rng, 80, 16), ["nnn:k=3", "is:beta=20.0"], ties=ties, bootstrap=0, progress=False
        )
    for result in ev.results:
        assert result.metrics["R@1"] == 100 and result.metrics["mAP@R"] == 100 and result.metrics["MnR"] == 1, (
            result.method,
            result.metrics,
        )
