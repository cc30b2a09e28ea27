"""Generated ``where`` filters (hypothesis: keys, operators, values, ``$and`` / ``$or`` / ``$not``
nested) over metadata with nulls, empty lists and several parts, against the filter semantics
written out plainly (:func:`tests.index.test_index_features.matches`: the logical keys over
:func:`tests.index.test_metadata_filters.holds`): :meth:`hubless.index.metadata.Metadata.mask`
selects exactly the rows the plain reading selects, by Arrow's compute and by the scalar indexes
(sorted values) alike: numbers compared exactly, as Python compares them (a float32 column's
values against a float64 ``0.1`` or an integer beyond 2^53, NaN equal to nothing, ``in`` as
``eq``), and a value outside its column's type (an integer beyond int64 or int32, a float for
no integer, an integer beyond float64) refused with InvalidInput wherever it is in the filter."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from hubless.errors import InvalidInput
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
        "f32": None if r[0] > 0.9 else F32[i % len(F32)],
        "i32": None if r[1] > 0.9 else I32[i % len(I32)],
    }


#: A float32 column's values (read back as the float64 they are exactly): 0.1 and 1/3 rounded
#: to float32 (neither equals the double 0.1 or 1/3), a float32 above 2^53, both zeros, NaN.
F32 = [float(np.float32(v)) for v in (0.1, 1 / 3, 2.5, 2.0**60, 7.0)] + [0.0, -0.0, math.nan]
#: An int32 column's values, its extremes included.
I32 = [-(2**31), -5, 0, 7, 2**31 - 1]
SCHEMA = pa.schema([("f32", pa.float32()), ("i32", pa.int32())])
RECORDS = [_record(i) for i in range(N)]


VALUES = {
    "split": st.sampled_from(SPLITS + ["absent"]),
    "year": st.one_of(st.integers(1985, 2035), st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64])),
    "score": st.floats(-1, 15, width=32),
    "ok": st.booleans(),
    "tags": st.sampled_from([f"t{i}" for i in range(7)]),
    "f32": st.one_of(
        st.sampled_from([0.1, 1 / 3, math.nan, -0.0, 0.0, 2**60, 2**60 + 1, 7, 10**400, math.inf, -math.inf, *F32]),
        st.floats(-3, 8, width=32),
    ),
    "i32": st.one_of(
        st.sampled_from([*I32, 2**31, -(2**31) - 1, 2**63, 6.5, 7.0, -5.5, math.nan, math.inf, 1e30]),
        st.integers(-8, 8),
    ),
}
ORDERED = ("year", "score", "split", "f32", "i32")
#: The integer columns' ranges: a value outside is refused.
INTEGER_RANGES = {"year": (-(2**63), 2**63 - 1), "i32": (-(2**31), 2**31 - 1)}
FLOAT_KEYS = ("score", "f32")


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
        meta = Metadata.from_records(RECORDS[:200], 200, SCHEMA).appended(RECORDS[200:450], 250).appended(RECORDS[450:], N - 450)
    else:
        meta = Metadata.from_records(RECORDS, N, SCHEMA)
    assert meta.schema.field("f32").type == pa.float32() and meta.schema.field("i32").type == pa.int32()
    yield meta
    filters.SCALAR_INDEX_MIN_ROWS = before


def refused(where: dict) -> bool:
    """Whether some value of the filter lies outside its column's type (the plain reading of
    the rule: such a filter is an InvalidInput, wherever the value is)."""
    for key, cond in where.items():
        if key in ("$or", "$and"):
            bad = any(refused(w) for w in cond)
        elif key == "$not":
            bad = refused(cond)
        else:
            pairs = cond.items() if isinstance(cond, dict) else [("eq", cond)]
            bad = any(_outside(key, op, v) for op, want in pairs for v in (want if op in ("in", "not_in") else [want]))
        if bad:
            return True
    return False


def _outside(key: str, op: str, value) -> bool:
    if key in INTEGER_RANGES and value is not None:
        low, high = INTEGER_RANGES[key]
        if isinstance(value, float) and (not math.isfinite(value) or (op in ("in", "not_in") and not value.is_integer())):
            return True
        return not low <= value <= high
    if key in FLOAT_KEYS and isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return True
    return False


@seed(SEED)
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(where=where)
def test_a_generated_filter_selects_what_its_plain_reading_selects(metadata, where):
    if refused(where):
        with pytest.raises(InvalidInput, match="where"):
            metadata.mask(where)
        return
    expected = np.array([matches(r, where) for r in RECORDS])
    np.testing.assert_array_equal(metadata.mask(where), expected, err_msg=str(where))
    np.testing.assert_array_equal(metadata.mask(where), expected, err_msg=str(where))  # a scalar index is made at the second


@pytest.mark.parametrize("indexed", [False, True], ids=["compared", "scalar index"])
def test_in_compares_a_float32_column_as_eq_does(indexed, monkeypatch):
    """``{"in": [0.1]}`` on float32 used to round 0.1 to float32 (5 hits) until the scalar
    index existed (then compared in float64: 0 hits), and ``in [nan]`` matched NaN rows only
    without the index. One rule now, eq's: exact, in float64; NaN matches nothing."""
    monkeypatch.setattr(filters, "SCALAR_INDEX_MIN_ROWS", 1 if indexed else None)
    values = [float(np.float32(0.1)), 0.5, math.nan, float(np.float32(0.1)), None]
    meta = Metadata.from_records([{"x": v} for v in values], len(values), pa.schema([("x", pa.float32())]))
    for _ in range(2):  # the second filter of a chunk builds its scalar index
        for value, rows in [(0.1, []), (float(np.float32(0.1)), [0, 3]), (math.nan, []), (0.5, [1])]:
            assert np.flatnonzero(meta.mask({"x": {"in": [value]}})).tolist() == rows, value
            assert np.flatnonzero(meta.mask({"x": {"eq": value}})).tolist() == rows, value
            not_in = sorted({0, 1, 2, 3} - set(rows))  # nulls never match; NaN rows do (NaN is not the value)
            assert np.flatnonzero(meta.mask({"x": {"not_in": [value]}})).tolist() == not_in, value


@pytest.mark.parametrize(
    ("schema", "where"),
    [
        (pa.int64(), {"x": {"eq": 2**63}}),
        (pa.int64(), {"x": {"in": [1, 2**63]}}),
        (pa.int64(), {"x": {"gt": -(2**63) - 1}}),
        (pa.int32(), {"x": {"in": [2**31]}}),
        (pa.int32(), {"x": {"not_in": [-(2**31) - 1]}}),
        (pa.int32(), {"x": {"lte": 1e30}}),
        (pa.uint8(), {"x": -1}),
        (pa.int64(), {"x": {"lt": math.inf}}),
        (pa.int64(), {"$or": [{"x": 1}, {"$not": {"x": {"eq": math.nan}}}]}),
        (pa.float32(), {"x": 10**400}),
        (pa.list_(pa.int32()), {"x": {"in": [2**40]}}),
    ],
)
@pytest.mark.parametrize("indexed", [False, True], ids=["compared", "scalar index"])
def test_a_value_outside_the_column_s_type_is_refused(schema, where, indexed, monkeypatch):
    """It was an OverflowError or ArrowInvalid (a 500 over HTTP)."""
    monkeypatch.setattr(filters, "SCALAR_INDEX_MIN_ROWS", 1 if indexed else None)
    value = [1, 2] if pa.types.is_list(schema) else 1
    meta = Metadata.from_records([{"x": value}] * 3, 3, pa.schema([("x", schema)]))
    for _ in range(2):
        with pytest.raises(InvalidInput, match="where 'x'"):
            meta.mask(where)
