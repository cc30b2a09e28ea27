"""Generated ``where`` filters (hypothesis: keys, operators, values, ``$and`` / ``$or`` / ``$not``
nested) over metadata with nulls, empty lists and several parts, against the filter semantics
written out plainly (:func:`tests.index.test_index_features.matches`: the logical keys over
:func:`tests.index.test_metadata_filters.holds`): :meth:`hubless.index.metadata.Metadata.mask`
selects exactly the rows the plain reading selects, by Arrow's compute and by the scalar indexes
(sorted values) alike."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from hubless.index import filters
from hubless.index.metadata import Metadata
from tests.index.test_index_features import matches

#: The fuzz's examples: the same every run and in every checkout (derandomize's seed depends
#: on the test file's path).
SEED = 20261127

N = 600
rng = np.random.default_rng(17)
SPLITS = ["train", "val", "test", "déjà vu", ""]


def _record(i: int) -> dict:
    r = rng.random(5)
    return {
        "split": None if r[0] < 0.1 else SPLITS[i % len(SPLITS)],
        "year": None if r[1] < 0.1 else int(1990 + (i * 7) % 40),
        "score": None if r[2] < 0.1 else -0.0 if i % 194 == 97 else float(np.float32((i % 97) / 7)),  # -0.0 equals 0.0
        "ok": None if r[3] < 0.1 else bool(i % 3 == 0),
        "tags": None if r[4] < 0.1 else [f"t{(i + j) % 6}" for j in range(i % 3)],
    }


RECORDS = [_record(i) for i in range(N)]


VALUES = {
    "split": st.sampled_from(SPLITS + ["absent"]),
    "year": st.integers(1985, 2035),
    "score": st.floats(-1, 15, width=32),
    "ok": st.booleans(),
    "tags": st.sampled_from([f"t{i}" for i in range(7)]),
}
ORDERED = ("year", "score", "split")


def condition(key: str) -> st.SearchStrategy:
    value = VALUES[key]
    ops = st.sampled_from(["eq", "ne", "gt", "gte", "lt", "lte"] if key in ORDERED else ["eq", "ne"])
    return st.one_of(
        value,
        st.dictionaries(ops, value, min_size=1, max_size=2),
        st.builds(lambda op, vs: {op: vs}, st.sampled_from(["in", "not_in"]), st.lists(value, min_size=1, max_size=3)),
    )


leaf = st.sampled_from(sorted(VALUES)).flatmap(lambda k: condition(k).map(lambda c, k=k: {k: c}))
where = st.recursive(
    st.lists(leaf, min_size=1, max_size=2).map(lambda fs: {k: v for f in fs for k, v in f.items()}),
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$or": fs}),
        st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$and": fs}),
        inner.map(lambda f: {"$not": f}),
        st.tuples(inner, leaf).map(lambda fl: {"$or": [fl[0]], **fl[1]}),  # a logical key beside a plain one
    ),
    max_leaves=5,
)


@pytest.fixture(scope="module", params=["one part", "parts", "scalar indexes"])
def metadata(request):
    before = filters.SCALAR_INDEX_MIN_ROWS
    if request.param == "scalar indexes":  # every chunk answered by its sorted values
        filters.SCALAR_INDEX_MIN_ROWS = 1
    if request.param == "parts":  # as a live index holds it: appended batches, the last without metadata
        meta = Metadata.from_records(RECORDS[:200], 200).appended(RECORDS[200:450], 250).appended(RECORDS[450:], N - 450)
    else:
        meta = Metadata.from_records(RECORDS, N)
    yield meta
    filters.SCALAR_INDEX_MIN_ROWS = before


@seed(SEED)
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(where=where)
def test_a_generated_filter_selects_what_its_plain_reading_selects(metadata, where):
    expected = np.array([matches(r, where) for r in RECORDS])
    np.testing.assert_array_equal(metadata.mask(where), expected, err_msg=str(where))
