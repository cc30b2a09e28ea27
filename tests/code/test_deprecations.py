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
    ("hubless.attached", "AttachedResult", lambda: hubless.Hits),
    ("hubless.attached.certified", "AttachedResult", lambda: hubless.Hits),
    ("hubless", "NotFittedError", lambda: hubless.NotFitted),
    ("hubless", "MissingDependencyError", lambda: hubless.MissingDependency),
    ("hubless.errors", "NotFittedError", lambda: hubless.errors.NotFitted),
    ("hubless.errors", "MissingInputError", lambda: hubless.errors.MissingInput),
    ("hubless.errors", "MissingDependencyError", lambda: hubless.errors.MissingDependency),
]


@pytest.mark.parametrize("module, old, new", OLD_NAMES, ids=[f"{m}.{o}" for m, o, _ in OLD_NAMES])
def test_an_old_name_warns_and_gives_the_new_object(module, old, new):
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use .*removed in {REMOVED_IN}") as caught:
        value = getattr(importlib.import_module(module), old)
    assert value is new()
    assert {w.filename for w in caught} == {__file__}  # the warning points at the caller


def test_an_old_name_still_catches_what_the_new_one_raises():
    with pytest.warns(DeprecationWarning):
        old = hubless.NotFittedError
    with pytest.raises(old):
        hubless.NNN().search(np.ones((1, 4), np.float32))


def test_the_old_score_matrix_package_warns_and_gives_the_new_names():
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
        "try:\n    import hubless.scores\nexcept DeprecationWarning as w:\n    print(w)\n"
        "warnings.simplefilter('ignore'); import hubless.scores as old, hubless.score_matrices as new\n"
        "print(old.load_scores is new.load_scores and old.__all__ == new.__all__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "the package hubless.scores is deprecated: use hubless.score_matrices" in done.stdout and "True" in done.stdout


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


def _arrays():
    rng = np.random.default_rng(5)
    g, b, q = (rng.standard_normal((n, 8)).astype(np.float32) for n in (40, 60, 3))
    return g, b, q


def test_the_old_correction_methods_warn_and_do_what_the_functions_do():
    from hubless.corrections import incremental, score_fit

    g, b, q = _arrays()
    calls = [
        ("add_items", lambda c: c.add_items(g[:4], b, b), lambda c: incremental.add_items(c, g[:4], b, b)),
        ("remove_items", lambda c: c.remove_items([0, 5], b, b), lambda c: incremental.remove_items(c, [0, 5], b, b)),
        ("add_query_bank", lambda c: c.add_query_bank(b[:7]), lambda c: incremental.add_query_bank(c, b[:7])),
        ("add_gallery_bank", lambda c: c.add_gallery_bank(b[:7]), lambda c: incremental.add_gallery_bank(c, b[:7])),
        ("fit_from_statistics", lambda c: c.fit_from_statistics(g, c.statistics_), lambda c: c.fit(g, statistics=c.statistics_)),
    ]
    for old, before, now in calls:
        with pytest.warns(DeprecationWarning, match=f"Correction.{old} is deprecated") as caught:
            got = before(hubless.DualIS().fit(g, b, b))
        assert {w.filename for w in caught} == {__file__}
        want = now(hubless.DualIS().fit(g, b, b))
        np.testing.assert_array_equal(got.bias(), want.bias())
    sb, s = b @ g.T, q @ g.T
    with pytest.warns(DeprecationWarning, match="Correction.fit_scores is deprecated"):
        old = hubless.NNN(k=4).fit_scores(sb)
    new = score_fit.fit_scores(hubless.NNN(k=4), sb)
    with pytest.warns(DeprecationWarning, match="Correction.correct is deprecated"):
        np.testing.assert_array_equal(old.correct(s), score_fit.correct_rows(new, s))
    with pytest.warns(DeprecationWarning, match="Correction.fitted_on_scores is deprecated"):
        assert old.fitted_on_scores and score_fit.fitted_on_scores(new)
    with pytest.warns(DeprecationWarning, match="Correction.score_queries is deprecated"):
        assert len(old.score_queries(s)) == len(score_fit.rows_batch(new, s)) == 3
