"""hubless.Hits, the one search result: the pair it unpacks to, the validity mask (any int64 is
an id, -1 included), per-query flags and the JSON records the CLI and the service print."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hubless
from hubless.hits import PADDING_ID, Hits


def test_unpacks_and_indexes_as_the_pair_searches_returned():
    scores, ids = np.array([[0.9, 0.5]], np.float32), np.array([[7, 3]], np.int64)
    hits = Hits(scores, ids, np.ones((1, 2), bool))
    s, i = hits
    assert s is hits.scores and i is hits.ids
    assert hits[0] is hits.scores and hits[1] is hits.ids and hits[-1] is hits.ids
    assert len(hits) == 2
    assert hubless.Hits is Hits


def test_minus_one_is_an_id_when_found_says_so():
    hits = Hits.from_found([[0.9, 0.5, 0.1]], [[-1, -5, 4]], [[True, True, False]])
    assert [h["id"] for h in hits.hits(0)] == [-1, -5]
    assert hits.ids[0, 2] == PADDING_ID and hits.scores[0, 2] == -np.inf
    assert hits.counts.tolist() == [2]


def test_padded_reads_minus_one_as_an_empty_slot():
    hits = Hits.padded([[0.9, 0.0]], [[3, -1]])
    assert hits.found.tolist() == [[True, False]]
    assert hits.records() == [{"query": 0, "hits": [{"id": 3, "score": pytest.approx(0.9)}]}]


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="one shape"):
        Hits(np.zeros((2, 3)), np.zeros((2, 2)), np.ones((2, 3), bool))
    with pytest.raises(ValueError, match="one value per query"):
        Hits(np.zeros((2, 3)), np.zeros((2, 3)), np.ones((2, 3), bool), certified=np.ones(3, bool))


def test_records_carry_the_flags_metadata_and_the_uncorrected_ranking():
    plain = Hits.padded([[0.8, 0.7]], [[5, 6]])
    hits = Hits.padded(
        [[0.9, 0.6]],
        [[6, 9]],
        certified=np.array([True]),
        exact=np.array([False]),
        candidates=np.array([80]),
        metadata={6: {"a": 1}, 9: {"a": 2}},
        uncorrected=plain,
        queries=["a cat"],
    )
    (record,) = hits.records()
    assert record["certified"] is True and record["exact"] is False and record["candidates"] == 80
    assert record["text"] == "a cat"
    assert [(h["id"], h["metadata"], h["uncorrected_rank"], h["rank_change"]) for h in record["hits"]] == [
        (6, {"a": 1}, 2, 1),
        (9, {"a": 2}, None, None),
    ]
    assert [h["id"] for h in record["uncorrected"]] == [5, 6]


def test_empty():
    hits = Hits.empty(3, 2)
    assert hits.found.sum() == 0 and [r["hits"] for r in hits.records()] == [[], [], []]


@settings(max_examples=60, deadline=None)
@given(
    ids=hnp.arrays(np.int64, (3, 4), elements=st.integers(-(2**63), 2**63 - 1)),
    found=hnp.arrays(bool, (3, 4)),
)
def test_every_found_id_is_read_back_whatever_its_value(ids, found):
    scores = np.linspace(1, 0, 12, dtype=np.float32).reshape(3, 4)
    hits = Hits.from_found(scores, ids, found)
    for row in range(3):
        assert [h["id"] for h in hits.hits(row)] == ids[row][found[row]].tolist()
    assert (hits.ids[~found] == PADDING_ID).all() and (hits.scores[~found] == -np.inf).all()


def test_widened_pads_every_per_slot_array_and_never_narrows():
    hits = Hits.padded([[0.9, 0.5]], [[3, 8]], first_stage_scores=[[0.4, 0.3]], rerank_scores=[[2.0, 1.0]], reranked=True)
    wide = hits.widened(4)
    assert wide.ids.tolist() == [[3, 8, -1, -1]] and wide.found.tolist() == [[True, True, False, False]]
    assert np.isneginf(wide.scores[0, 2:]).all() and np.isneginf(wide.first_stage_scores[0, 2:]).all()
    assert np.isneginf(wide.rerank_scores[0, 2:]).all() and wide.reranked
    assert hits.widened(1) is hits
    with pytest.raises(ValueError, match="one value per slot"):
        Hits.padded([[0.9]], [[3]], rerank_scores=[[1.0, 2.0]])


def test_shown_ids_are_the_found_ids_with_the_uncorrected_ones():
    plain = Hits.from_found([[0.8, 0.7]], [[-1, 6]], [[True, True]])
    hits = Hits.from_found([[0.9, 0.6]], [[6, 9]], [[True, False]], uncorrected=plain)
    assert hits.shown_ids().tolist() == [-1, 6]  # -1 found in the uncorrected ranking is an id; 9 is not found


def test_seconds_read_the_extra():
    assert Hits.empty(1, 1).seconds is None
    assert Hits.empty(1, 1, extra={"seconds": {"rerank": 0.5}}).seconds == {"rerank": 0.5}


def test_the_engine_s_exact_search_answers_hits_too():
    rng = np.random.default_rng(0)
    gallery, queries = rng.standard_normal((30, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    hits = hubless.exact_search(queries, gallery, 5)
    assert isinstance(hits, Hits) and hits.found.all()
    want = np.argsort(-(queries @ gallery.T), axis=1, kind="stable")[:, :5]
    scores, ids = hits
    assert (ids == want).all() and np.allclose(scores, np.take_along_axis(queries @ gallery.T, want, axis=1), atol=1e-5)
