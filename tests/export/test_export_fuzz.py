"""Export to and search of an embedded store (LanceDB) with generated arguments, good and bad
(hypothesis): ANN types, target recalls, batch sizes and store options on export; queries,
``top_k``, weights and knobs on search. Each call either does its job (an export that lands
whole and searches like the index it came from) or is refused with a
:class:`hubless.errors.HublessError`, and a refused export leaves no table behind."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import hubless
from hubless.errors import HublessError
from tests.conftest import unit_rows

pytest.importorskip("lancedb")
pytestmark = pytest.mark.slow

#: The fuzz's examples: the same every run and in every checkout.
SEED = 20261127
D, N = 8, 60
#: "refused" / "exported" / "searched" / "search refused": the fuzz's outcomes.
SEEN: Counter = Counter()
TABLES = itertools.count()

odd = st.one_of(st.integers(-2, 300), st.floats(allow_nan=True), st.sampled_from([None, "x", True, 2**70, "IVF_FLAT"]))


def one_odd(valid: st.SearchStrategy, fields: list[str]) -> st.SearchStrategy:
    """Valid arguments as they are, or with one of ``fields`` (an unknown one included) given an
    odd value: most examples get past the first check, one bad argument at a time."""
    changed = st.tuples(valid, st.sampled_from([*fields, "nope"]), odd).map(lambda v: {**v[0], v[1]: v[2]})
    return st.one_of(valid, changed)


export_args = one_odd(
    st.fixed_dictionaries(
        {},
        optional={
            "ann": st.sampled_from([None, "IVF_FLAT", "IVF_PQ", "ivf_flat"]),
            "target_recall": st.sampled_from([None, 0.9, 1.0]),
            "batch": st.sampled_from([8, 64, 8192]),
        },
    ),
    ["ann", "target_recall", "batch", "partitions", "sub_vectors"],
)


@pytest.fixture(scope="module")
def index_and_root(tmp_path_factory):
    rng = np.random.default_rng(12)
    index = hubless.Index.build(unit_rows(rng, N, D), unit_rows(rng, 80, D), "nnn:alpha=0.5,k=4", "Flat",
                                metadata=[{"caption": f"c{i}", "year": 2000 + i % 5} for i in range(N)])  # fmt: skip
    return index, tmp_path_factory.mktemp("stores")


@seed(SEED)
@settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(args=export_args)
def test_an_export_lands_whole_or_is_refused_leaving_nothing(index_and_root, args):
    from hubless.export import export, search

    index, root = index_and_root
    uri = f"lancedb://{root}/db/t{next(TABLES)}"
    try:
        export(index, uri, **args)
    except HublessError as exc:
        SEEN["refused"] += 1
        assert str(exc).strip()
        with pytest.raises(HublessError):  # nothing was left behind to search
            search(uri, np.eye(D, dtype=np.float32)[:1], 3)
        return
    SEEN["exported"] += 1
    queries = unit_rows(np.random.default_rng(3), 4, D)
    scores, ids = search(uri, queries, 5, exact=True)[:2]
    want_scores, want_ids = index.search(queries, 5)[:2]
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_allclose(scores, want_scores, atol=1e-5)


queries = st.one_of(
    st.integers(1, 3).map(lambda n: unit_rows(np.random.default_rng(n), n, D)),
    st.integers(1, 3).map(lambda n: unit_rows(np.random.default_rng(n), n, D)),
    st.sampled_from([None, "q", np.zeros((1, D), np.float32), np.full((1, D), np.nan, np.float32), np.ones((2, D + 1), np.float32), np.ones((0, D), np.float32)]),
)  # fmt: skip
search_args = one_odd(
    st.fixed_dictionaries(
        {},
        optional={
            "corrected": st.booleans(),
            "exact": st.booleans(),
            "target_recall": st.sampled_from([0.9, 1.0]),
            "weight": st.sampled_from([0.0, 0.5, 1.0]),
            "nprobe": st.sampled_from([1, 2]),
        },
    ),
    ["corrected", "exact", "target_recall", "weight", "nprobe", "ef_search"],
)


@seed(SEED)
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(q=queries, top_k=st.one_of(st.integers(1, 10), st.integers(1, 10), odd), args=search_args)
def test_a_store_search_answers_or_is_refused(index_and_root, q, top_k, args):
    from hubless.export import export, search

    index, root = index_and_root
    uri = f"lancedb://{root}/db/searched"
    if not (root / "db" / "searched.lance").exists():
        export(index, uri, ann="IVF_FLAT", partitions=2)
    try:
        hits = search(uri, q, top_k, **args)
    except HublessError as exc:
        SEEN["search refused"] += 1
        assert str(exc).strip()
        return
    SEEN["searched"] += 1
    assert hits.scores.shape == hits.ids.shape == hits.found.shape and hits.ids.shape[1] == int(top_k)
    assert np.isin(hits.ids[hits.found], index.ids).all() and (hits.ids[~hits.found] == -1).all()


def test_the_fuzz_exported_searched_and_refused():
    if not SEEN:
        pytest.skip("checks what the fuzz tests of this module did: run with them")
    assert min(SEEN["refused"], SEEN["exported"], SEEN["searched"], SEEN["search refused"]) >= 3, SEEN
