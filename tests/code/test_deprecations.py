"""Every deprecated name keeps working until 0.2.0, with a DeprecationWarning that names its
replacement and points at the caller's line (the compatibility policy of CONTRIBUTING.md), and
gives what the new name gives."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

import hubless
from hubless._deprecation import REMOVED_IN
from hubless.export.store_hits import StoreHits, store_hits

#: (module, old name, the object the new name gives)
OLD_NAMES = [
    ("hubless.rerank", "RerankResult", lambda: hubless.Hits),
    ("hubless.rerank.pipeline", "RerankResult", lambda: hubless.Hits),
    ("hubless.search", "SearchResult", lambda: hubless.Hits),
]


@pytest.mark.parametrize("module, old, new", OLD_NAMES, ids=[f"{m}.{o}" for m, o, _ in OLD_NAMES])
def test_an_old_name_warns_and_gives_the_new_object(module, old, new):
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use .*removed in {REMOVED_IN}") as caught:
        value = getattr(importlib.import_module(module), old)
    assert value is new()
    assert {w.filename for w in caught} == {__file__}  # the warning points at the caller


def test_an_unknown_name_is_still_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        hubless.rerank.Nothing  # noqa: B018


def test_the_searcher_is_exported():
    from hubless.search import Searcher

    assert hubless.Searcher is Searcher and "Searcher" in hubless.__all__


def test_a_store_search_unpacks_as_the_old_triple_with_a_warning():
    scores = np.array([[0.9, 0.5, -np.inf], [0.7, -np.inf, -np.inf]], np.float32)
    ids = np.array([[4, 9, -1], [9, -1, -1]])
    rows = [[{"id": 4, "caption": "four"}, {"id": 9, "caption": "nine"}], [{"id": 9, "caption": "nine"}]]
    hits = store_hits(scores, ids, rows, metadata=True)
    assert isinstance(hits, StoreHits) and isinstance(hits, hubless.Hits)
    assert hits.metadata == {4: {"caption": "four"}, 9: {"caption": "nine"}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the named fields and the pair's positions: no warning
        assert hits[0] is hits.scores and hits[1] is hits.ids and hits[:2] == (hits.scores, hits.ids)
        assert [[h["id"] for h in r["hits"]] for r in hits.records()] == [[4, 9], [9]]
    with pytest.warns(DeprecationWarning, match="triple is deprecated") as caught:
        got_scores, got_ids, got_rows = hits
    assert got_scores is hits.scores and got_ids is hits.ids and got_rows == rows
    assert {w.filename for w in caught} == {__file__}
    with pytest.warns(DeprecationWarning, match="triple is deprecated"):
        assert hits[2] == rows and hits[-1] == rows and len(hits) == 3
    plain = store_hits(scores, ids, [[{"id": 4}, {"id": 9}], [{"id": 9}]], metadata=False)
    assert plain.metadata is None
    with pytest.warns(DeprecationWarning):
        assert plain[2] == [[{"id": 4}, {"id": 9}], [{"id": 9}]]
