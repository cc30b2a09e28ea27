"""The everyday operations of a vector database on the live index (issue 38, build item 4):
OR / NOT / AND filters and dotted keys into struct columns (each equal to a plain evaluation over
the records), removal by a filter (O(matches) written), metadata-only updates (by ids or by a
filter; types checked; embeddings and biases kept), in the library, the CLI and the service."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.corrections import make_correction
from hubless.errors import InvalidInput, MissingFile, NotFound
from hubless.index.metadata import Metadata
from tests.conftest import unit_rows
from tests.index.test_metadata_filters import holds

runner = CliRunner()
RNG = np.random.default_rng(38)
N, DIM = 400, 16
GALLERY = unit_rows(RNG, N, DIM)
BANK = unit_rows(RNG, 300, DIM)
QUERIES = unit_rows(RNG, 12, DIM)
WORDS = ["a", "b", "c", "zz"]


def _record(i: int) -> dict:
    r = np.random.default_rng(i)
    pick = lambda values: values[int(r.integers(len(values)))]  # noqa: E731
    return {
        "s": pick(["a", "b", "c", None]),
        "y": pick([1990, 2000, 2010, 2020, None]),
        "f": float(r.integers(0, 8)) / 2,
        "ok": bool(i % 3 == 0),
        "tags": pick([["a"], ["b", "c"], [], None, ["zz", "a"]]),
        "info": pick([{"src": "web", "n": 1}, {"src": "print", "n": 2}, {"src": None, "n": 3}, None]),
        "objs": pick([[{"l": "a"}, {"l": "b"}], [{"l": None}], [], None, [{"l": "c"}]]),
    }


META = [_record(i) for i in range(N)]


# ---------------------------------------------------------------------------------- the reference
def _get(value, path: list[str]):
    """A dotted path read plainly: a struct's field, mapped over the elements of a list."""
    for name in path:
        if value is None:
            return None
        if isinstance(value, list):
            value = [None if e is None else e.get(name) for e in value]
        else:
            value = value.get(name)
    return value


def _holds(value, cond) -> bool:
    """A key's condition, as tests/index/test_metadata_filters.py evaluates it; None: the key is missing."""
    return value is None if cond is None else holds(value, cond)


def matches(record: dict, where: dict) -> bool:
    """The filter semantics written out plainly: the reference for ``Metadata.mask``."""
    for key, cond in where.items():
        if key == "$or":
            ok = any(matches(record, w) for w in cond)
        elif key == "$and":
            ok = all(matches(record, w) for w in cond)
        elif key == "$not":
            ok = not matches(record, cond)
        else:
            ok = _holds(_get(record, key.split(".")), cond)
        if not ok:
            return False
    return True


# ---------------------------------------------------------------------------------- filters
_strings = st.sampled_from(WORDS)
LEAVES = st.one_of(
    st.builds(lambda v: {"s": v}, st.one_of(_strings, st.none())),
    st.builds(lambda op, v: {"s": {op: v}}, st.sampled_from(["eq", "ne"]), _strings),
    st.builds(lambda op, v: {"s": {op: v}}, st.sampled_from(["in", "not_in"]), st.lists(_strings, max_size=3)),
    st.builds(lambda op, v: {"y": {op: v}}, st.sampled_from(["eq", "ne", "gt", "gte", "lt", "lte"]), st.sampled_from([1990, 2005, 2010])),
    st.builds(lambda v: {"y": v}, st.none()),
    st.builds(lambda op, v: {"f": {op: v}}, st.sampled_from(["gt", "lte"]), st.sampled_from([0.5, 1.0, 2.5])),
    st.builds(lambda v: {"ok": v}, st.booleans()),
    st.builds(lambda op, v: {"tags": {op: v}}, st.sampled_from(["eq", "ne"]), _strings),
    st.builds(lambda v: {"tags": {"in": v}}, st.lists(_strings, max_size=2)),
    st.builds(lambda v: {"info.src": v}, st.one_of(st.sampled_from(["web", "print"]), st.none())),
    st.builds(lambda op, v: {"info.src": {op: v}}, st.sampled_from(["ne", "not_in"]), st.sampled_from(["web", ["print"]])).filter(
        lambda w: isinstance(w["info.src"].get("ne", ""), str) and isinstance(w["info.src"].get("not_in", []), list)
    ),
    st.builds(lambda op, v: {"info.n": {op: v}}, st.sampled_from(["gt", "lt", "eq"]), st.integers(0, 3)),
    st.builds(lambda v: {"objs.l": v}, st.one_of(_strings, st.none())),
    st.builds(lambda op, v: {"objs.l": {op: v}}, st.sampled_from(["ne", "in"]), st.sampled_from(["a", ["b", "c"]])).filter(
        lambda w: ("ne" in w["objs.l"]) == isinstance(w["objs.l"].get("ne", w["objs.l"].get("in")), str)
    ),
)


def _combine(children):
    return st.one_of(
        st.builds(lambda fs: {"$or": fs}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda fs: {"$and": fs}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda f: {"$not": f}, children),
        st.builds(lambda a, b: {**b, **a}, children, children),  # several keys: a conjunction
    )


FILTERS = st.recursive(LEAVES, _combine, max_leaves=8)
STORED = Metadata.from_records(META, N)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=FILTERS)
def test_or_not_and_nested_filters_equal_a_plain_evaluation(where):
    expected = np.array([matches(r, where) for r in META])
    np.testing.assert_array_equal(STORED.mask(where), expected, err_msg=json.dumps(where))


@pytest.mark.parametrize("factory", ["Flat", "IVF8,Flat"])
def test_searches_with_combined_filters_equal_brute_force(tmp_path, factory):
    method = "nnn:alpha=0.5,k=8"
    index = hubless.Index.build(GALLERY, BANK, method, factory, metadata=META, nprobe=8)
    index.save(tmp_path / "idx")
    loaded = hubless.Index.load(tmp_path / "idx")  # metadata of nested types round-trips through parquet
    scores_all = make_correction(method).fit(GALLERY, BANK).score(QUERIES).astype(np.float64)
    wheres = [
        {"$or": [{"s": "a"}, {"info.src": "web"}]},
        {"$not": {"tags": "a"}},
        {"$and": [{"objs.l": {"in": ["a", "c"]}}, {"$not": {"y": None}}], "f": {"gte": 1.0}},
        {"$or": [{"$not": {"ok": True}}, {"info.n": {"gt": 2}}]},
    ]
    for where in wheres:
        keep = np.array([matches(r, where) for r in META])
        scores = scores_all.copy()
        scores[:, ~keep] = -np.inf
        order = np.lexsort((np.broadcast_to(np.arange(N), scores.shape), -scores), axis=1)[:, :10]
        ref = np.where(np.isfinite(np.take_along_axis(scores, order, axis=1)), order, -1)
        for idx in (index, loaded):
            np.testing.assert_array_equal(idx.search(QUERIES, 10, where=where)[1], ref, err_msg=json.dumps(where))


@pytest.mark.parametrize(
    "where, message",
    [
        ({"$or": {"s": "a"}}, "takes a non-empty list of filters"),
        ({"$or": []}, "takes a non-empty list"),
        ({"$and": [{}]}, "non-empty dict"),
        ({"$not": "a"}, "non-empty dict"),
        ({"$xor": [{"s": "a"}]}, "unknown logical operator '\\$xor'"),
        ({"info.nope": 1}, "'info' holds struct.*without a field 'nope'"),
        ({"s.x": "a"}, "'s' holds string"),
        ({"nope.x": "a"}, "no metadata key 'nope.x'"),
        ({"info": {"src": "web"}}, "filtered by its fields, e.g. 'info.src'"),
        ({"info.src": 3}, "'info.src': the key holds string"),
        (
            {
                "$not": {
                    "$not": {
                        "$not": {
                            "$not": {
                                "$not": {
                                    "$not": {
                                        "$not": {
                                            "$not": {
                                                "$not": {
                                                    "$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"s": "a"}}}}}}}}
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            },
            "nest deeper",
        ),  # fmt: skip
    ],
)
def test_bad_combined_filters_are_clear_errors(where, message):
    with pytest.raises(InvalidInput, match=message):
        STORED.mask(where)


# ---------------------------------------------------------------------------------- writes by filter
def _files(path):
    return {f.relative_to(path): f.read_bytes() for f in path.rglob("*") if f.is_file()}


@pytest.mark.parametrize("method", ["nnn:k=8", "dis:k_activation=2"])
def test_remove_where_removes_what_brute_force_matches_and_writes_only_tombstones(tmp_path, method):
    hubless.Index.build(GALLERY, BANK, method, "IVF8,Flat", metadata=META, nprobe=8).save(tmp_path / "idx")
    live = hubless.Index.open(tmp_path / "idx")
    before = _files(tmp_path / "idx")
    where = {"$or": [{"s": "a", "y": {"gte": 2010}}, {"objs.l": "c"}]}
    expected = np.array([i for i, r in enumerate(META) if matches(r, where)])
    removed = live.remove(where=where)
    np.testing.assert_array_equal(removed, expected)
    after = _files(tmp_path / "idx")
    written = {name: raw for name, raw in after.items() if before.get(name) != raw}
    assert {str(n) for n in written} - {"CURRENT"} and all(str(n) == "CURRENT" or str(n).endswith(".seg") for n in written)
    segment = next(raw for name, raw in written.items() if str(name).endswith(".seg"))
    assert len(segment) < 4096 + 8 * expected.size + 300 * 2 * 16  # the dead rows (+ replaced activation lists), no rows
    assert live.remove(where={"y": 1234}).size == 0  # nothing matches: nothing removed
    kept = np.setdiff1d(np.arange(N), expected)
    fresh = hubless.Index.build(GALLERY[kept], BANK, method, "Flat", ids=kept)
    for index in (live, hubless.Index.load(tmp_path / "idx")):
        np.testing.assert_array_equal(index.ids, kept)
        np.testing.assert_array_equal(index.search(QUERIES, 10, nprobe=8)[1], fresh.search(QUERIES, 10)[1])
    with pytest.raises(InvalidInput, match="ids or where"):
        live.remove([1], where={"s": "a"})
    with pytest.raises(InvalidInput, match="cannot remove every item"):
        live.remove(where={"f": {"gte": 0}})
    assert live.ntotal == kept.size


def test_update_metadata_by_ids_and_by_filter(tmp_path):
    method = "dis:k_activation=2"
    meta = [{"s": r["s"], "y": r["y"], "info": r["info"]} for r in META]
    hubless.Index.build(GALLERY, BANK, method, "IVF8,Flat", metadata=meta, nprobe=8).save(tmp_path / "idx")
    live = hubless.Index.open(tmp_path / "idx")
    model = {i: dict(m) for i, m in enumerate(meta)}
    changed = live.update_metadata(where={"s": "a"}, values={"y": 1, "label": "A"}, unset=["info"])
    expected = [i for i in range(N) if meta[i]["s"] == "a"]
    np.testing.assert_array_equal(changed, expected)
    for i in expected:
        model[i].update(y=1, label="A", info=None)
    np.testing.assert_array_equal(live.update_metadata([7, 3], values=[{"s": "q"}, {"y": 5}]), [7, 3])
    model[7]["s"], model[3]["y"] = "q", 5
    live.update_metadata([11], unset=["s", "y"])
    model[11].update(s=None, y=None)
    before = _files(tmp_path / "idx")
    for bad, error in (
        (dict(ids=[5], values={"y": "x"}), InvalidInput),  # a string for an int column
        (dict(ids=[5], values={"s": 1}), InvalidInput),
        (dict(ids=[5, 99999], values={"y": 1}), NotFound),
        (dict(ids=[5], unset=["nope"]), InvalidInput),
        (dict(ids=[5], values={"y": 1}, unset=["y"]), InvalidInput),
        (dict(where={"s": "a"}, values=[{"y": 1}]), InvalidInput),
        (dict(ids=[5]), InvalidInput),
    ):
        with pytest.raises(error):
            live.update_metadata(**bad)
    assert _files(tmp_path / "idx") == before  # refused: nothing written
    order = list(range(N))
    for moved in (expected, [7, 3], [11]):  # each update moves its items to the end, in the order given
        order = [i for i in order if i not in moved] + list(moved)
    fresh = hubless.Index.build(GALLERY[order], BANK, method, "Flat", ids=order, metadata=[{**{"label": None}, **model[i]} for i in order])
    for index in (live, hubless.Index.load(tmp_path / "idx")):
        np.testing.assert_array_equal(index.ids, order)  # moved to the end, as an upsert
        assert index.records(list(range(N))) == [{"label": None, **model[i]} for i in range(N)]
        np.testing.assert_array_equal(index.get([3, 7]).embeddings, GALLERY[[3, 7]])  # embeddings kept
        for where in (None, {"label": "A"}, {"$or": [{"s": "q"}, {"y": 5}]}, {"$not": {"info.src": "web"}}):
            np.testing.assert_array_equal(index.search(QUERIES, 10, where=where, nprobe=8)[1], fresh.search(QUERIES, 10, where=where)[1])
        np.testing.assert_array_equal(index.correction.activation_mask_, fresh.correction.activation_mask_)
        np.testing.assert_allclose(index.correction.bias_, fresh.correction.bias_, rtol=1e-6, atol=1e-6)
    live.compact()
    assert hubless.Index.load(tmp_path / "idx").records([3, 7, 11]) == [{"label": None, **model[i]} for i in (3, 7, 11)]


def test_update_metadata_of_an_index_without_metadata_adds_it(tmp_path):
    index = hubless.Index.build(GALLERY[:50], BANK, "nnn:k=4", "Flat")
    index.update_metadata([2, 4], values={"split": "test"})
    assert index.records([2, 3]) == [{"split": "test"}, {"split": None}]
    np.testing.assert_array_equal(np.sort(index.search(QUERIES, 5, where={"split": "test"})[1][:, :2], axis=1), [[2, 4]] * 12)


# ---------------------------------------------------------------------------------- CLI and service
def test_cli_remove_where_update_metadata_and_combined_filters(tmp_path):
    meta = [{"s": r["s"], "y": r["y"], "info": r["info"]} for r in META[:200]]
    hubless.Index.build(GALLERY[:200], BANK, "nnn:k=8", "Flat", metadata=meta).save(tmp_path / "idx")
    np.save(tmp_path / "q.npy", QUERIES[:2])
    idx = str(tmp_path / "idx")
    r = runner.invoke(app, ["index", "update-metadata", idx, "--where", '{"s": "b"}', "--set", '{"label": "B"}', "--unset", "y"])
    assert r.exit_code == 0 and f"updated the metadata of {sum(m['s'] == 'b' for m in meta)} items" in r.output, r.output
    r = runner.invoke(app, ["index", "update-metadata", idx, "--ids", "0,1", "--set", '{"y": "x"}'])
    assert r.exit_code == 2 and "'y' holds int64" in r.output, r.output
    where = '{"$or": [{"label": "B"}, {"info.src": "web"}]}'
    r = runner.invoke(app, ["search", idx, "--queries", str(tmp_path / "q.npy"), "--where", where, "--json"])
    assert r.exit_code == 0, r.output
    hits = [h for line in r.output.strip().splitlines() for h in json.loads(line)["hits"]]
    assert hits and all(h["metadata"]["label"] == "B" or (h["metadata"]["info"] or {}).get("src") == "web" for h in hits)
    gone = [i for i, m in enumerate(meta) if m["s"] == "c"]
    r = runner.invoke(app, ["index", "remove", idx, "--where", '{"s": "c"}'])
    assert r.exit_code == 0 and f"removed {len(gone)} items" in r.output, r.output
    r = runner.invoke(app, ["index", "remove", idx, "--ids", "1", "--where", '{"s": "c"}'])
    assert r.exit_code == 2 and "one of them" in r.output
    loaded = hubless.Index.load(idx)
    assert loaded.ntotal == 200 - len(gone) and not set(gone) & set(loaded.ids.tolist())
    assert all(rec["label"] == "B" and rec["y"] is None for rec in loaded.records([i for i, m in enumerate(meta) if m["s"] == "b"]))


def test_service_delete_by_filter_and_metadata_updates(tmp_path):
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from hubless.service import create_app

    key = {"Authorization": "Bearer secret-key-of-20-chars"}
    meta = [{"s": r["s"], "y": r["y"]} for r in META[:200]]
    hubless.Index.build(GALLERY[:200], BANK, "nnn:k=8", "Flat", metadata=meta).save(tmp_path / "idx")
    app_ = create_app({"idx": tmp_path / "idx"}, api_key="secret-key-of-20-chars")
    with TestClient(base_url="http://localhost", app=app_) as c:
        assert c.post("/items/idx/delete", json={"where": {"s": "c"}}).status_code == 401
        gone = [i for i, m in enumerate(meta) if m["s"] == "c"]
        answer = c.post("/items/idx/delete", json={"where": {"$or": [{"s": "c"}, {"y": 1990}]}}, headers=key)
        also = [i for i, m in enumerate(meta) if m["s"] == "c" or m["y"] == 1990]
        assert answer.status_code == 200 and answer.json()["removed"] == also and answer.json()["n_items"] == 200 - len(also)
        assert c.post("/items/idx/delete", json={"ids": [gone[0]]}, headers=key).status_code == 404
        assert c.post("/items/idx/delete", json={"ids": [], "where": {"s": "a"}}, headers=key).status_code == 422
        left = [i for i in range(200) if i not in also]
        assert c.post("/items/idx/delete", json={"ids": left[:2]}, headers=key).json()["removed"] == left[:2]
        up = c.post("/items/idx/metadata", json={"where": {"s": "a"}, "set": {"label": "A"}, "unset": ["y"]}, headers=key)
        changed = [i for i in left[2:] if meta[i]["s"] == "a"]
        assert up.status_code == 200 and up.json()["updated"] == changed
        one = c.post("/items/idx/metadata", json={"ids": [left[3]], "set": [{"y": 7}]}, headers=key)
        assert one.status_code == 200 and c.get(f"/items/idx/{left[3]}", headers=key).json()["metadata"]["y"] == 7
        bad = c.post("/items/idx/metadata", json={"ids": [left[3]], "set": {"y": "seven"}}, headers=key)
        assert bad.status_code == 422 and "'y' holds int64" in bad.json()["detail"]
        assert c.post("/items/idx/metadata", json={"ids": [left[3]]}, headers=key).status_code == 422
        found = c.post("/search", json={"embeddings": QUERIES[:2].tolist(), "where": {"label": "A"}}, headers=key).json()
        assert all(h["metadata"]["label"] == "A" for r in found["results"] for h in r["hits"])
    saved = hubless.Index.load(tmp_path / "idx")
    assert saved.ntotal == 200 - len(also) - 2 and all(r["label"] == "A" and r["y"] is None for r in saved.records(changed[1:]))


# ---------------------------------------------------------------------------------- scalar indexes
@pytest.fixture()
def scalar_indexes_on_small_chunks():
    from hubless.index import filters

    before = filters.SCALAR_INDEX_MIN_ROWS
    filters.SCALAR_INDEX_MIN_ROWS = 1
    filters._scalar_cache.clear()
    yield filters
    filters.SCALAR_INDEX_MIN_ROWS = before
    filters._scalar_cache.clear()


def test_filters_through_scalar_indexes_equal_a_plain_evaluation(scalar_indexes_on_small_chunks):
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(where=FILTERS)
    def check(where):
        expected = np.array([matches(r, where) for r in META])
        np.testing.assert_array_equal(STORED.mask(where), expected, err_msg=json.dumps(where))

    check()
    assert any(entry[1] is not None for entry in scalar_indexes_on_small_chunks._scalar_cache.values())  # indexes were used


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(["int", "float", "string", "bool"]),
    seed=st.integers(0, 10_000),
    op=st.sampled_from(["eq", "ne", "in", "not_in", "gt", "gte", "lt", "lte"]),
    value=st.one_of(
        st.integers(-5, 5),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(["", "a", "b", "ba", "é", "z"]),
        st.booleans(),
        st.sampled_from([2**70, -(2**70), 2.5, -0.5, 1e300]),
    ),
)
def test_a_scalar_index_answers_as_arrow_compares(scalar_indexes_on_small_chunks, kind, seed, op, value):
    """Every operator, against every type a scalar index serves, with nulls, NaN, infinities,
    floats against integers and values beyond int64: the same rows as Arrow's comparisons."""
    from hubless.errors import InvalidType

    filters = scalar_indexes_on_small_chunks
    rng = np.random.default_rng(seed)
    n = 60
    pools = {"int": [-3, 0, 1, 2, 5, None], "float": [-1.5, 0.0, 2.5, float("nan"), float("inf"), None],
             "string": ["", "a", "b", "ba", "é", None], "bool": [True, False, None]}  # fmt: skip
    pool = pools[kind]
    values = [pool[i] for i in rng.integers(0, len(pool), n)]
    meta = Metadata.from_records({"c": values}, n)
    where = {"c": {op: [value, pool[0]] if op in ("in", "not_in") else value}}
    filters.SCALAR_INDEX_MIN_ROWS = None
    try:
        expected = meta.mask(where)
    except (InvalidType, InvalidInput, OverflowError, ValueError) as exc:  # refused (or not comparable) without an index
        expected = exc
    filters.SCALAR_INDEX_MIN_ROWS = 1
    for _ in range(2):  # the second filter of a chunk goes through its index
        if isinstance(expected, InvalidType | InvalidInput):
            with pytest.raises(type(expected)):
                meta.mask(where)
        elif isinstance(expected, np.ndarray):
            np.testing.assert_array_equal(meta.mask(where), expected, err_msg=f"{kind} {values} {where}")


def test_scalar_indexes_over_a_base_and_its_writes_equal_brute_force(tmp_path, scalar_indexes_on_small_chunks):
    hubless.Index.build(GALLERY[:300], BANK, "nnn:k=8", "Flat", metadata=META[:300]).save(tmp_path / "idx")
    live = hubless.Index.open(tmp_path / "idx")
    for start in (300, 330, 360):  # one metadata part per write after the base
        live.add(GALLERY[start : start + 30], META[start : start + 30])
    live.remove(where={"y": 2000})
    live.update_metadata(where={"s": "c"}, values={"f": 9.5})
    records = {i: dict(META[i]) for i in range(390) if META[i]["y"] != 2000}
    for r in records.values():
        if r["s"] == "c":
            r["f"] = 9.5
    reloaded = hubless.Index.load(tmp_path / "idx")
    for where in ({"y": {"gte": 2010}}, {"s": {"in": ["a", "zz"]}}, {"f": {"gt": 2.0}}, {"$or": [{"ok": True}, {"s": {"lt": "b"}}]}):
        for index in (live, reloaded, live, reloaded):  # the second time through each chunk's scalar index
            keep = np.array([matches(records[i], where) for i in index.ids])
            found = index.search(GALLERY[:1], 400, where=where)[1][0]  # top 400: every matching item
            assert sorted(i for i in found.tolist() if i >= 0) == sorted(index.ids[keep].tolist()), where
    assert any(entry[1] is not None for entry in scalar_indexes_on_small_chunks._scalar_cache.values())


# ---------------------------------------------------------------------------------- versions
def test_versions_are_kept_searched_as_of_restored_and_pruned(tmp_path):
    path = tmp_path / "idx"
    index = hubless.Index.build(GALLERY[:300], BANK, "dis:k_activation=2", "IVF8,Flat", metadata=META[:300], nprobe=8)
    index.set_keep_versions(4)
    index.save(path)
    live = hubless.Index.open(path)
    seen = {live.storage()["version"]: (live.ids.copy(), live.search(QUERIES, 10))}
    writes = [
        lambda: live.add(GALLERY[300:340], META[300:340]),
        lambda: live.remove(where={"s": "a"}),
        lambda: live.update_metadata(where={"s": "b"}, values={"y": 1}),
        lambda: live.compact(),
        lambda: live.add(GALLERY[340:350], META[340:350]),
    ]
    for write in writes:
        write()
        seen[live.storage()["version"]] = (live.ids.copy(), live.search(QUERIES, 10))
    listed = hubless.Index.versions(path)
    numbers = [v["version"] for v in listed]
    assert numbers == sorted(seen)[-4:] and listed[-1]["current"] and not any(v["current"] for v in listed[:-1])
    for number in numbers:  # each kept version reads back as it was committed, after later writes and a compaction
        old = hubless.Index.load(path, version=number)
        np.testing.assert_array_equal(old.ids, seen[number][0])
        np.testing.assert_array_equal(old.search(QUERIES, 10)[1], seen[number][1][1])
        np.testing.assert_allclose(old.search(QUERIES, 10)[0], seen[number][1][0], rtol=1e-6)
    with pytest.raises(MissingFile, match="keeps no version"):
        hubless.Index.load(path, version=min(seen))  # pruned: beyond the newest 4
    before_restore = live.info()["next_id"]
    new = hubless.Index.restore(path, numbers[0])
    restored = hubless.Index.load(path)
    np.testing.assert_array_equal(restored.ids, seen[numbers[0]][0])
    np.testing.assert_array_equal(restored.search(QUERIES, 10)[1], seen[numbers[0]][1][1])
    assert restored.info()["next_id"] == before_restore and restored.keep_versions == 4
    assert hubless.Index.versions(path)[-1]["version"] == new
    assert live.add(GALLERY[350:351])[0] == before_restore  # the live handle catches up; assigned ids are never reused
    from hubless.index.integrity import verify

    assert verify(path)["items"] == restored.ntotal + 1
    live.set_keep_versions(0)  # keeps none any more: the records and their files go
    assert not (path / "versions").exists() and [v["version"] for v in hubless.Index.versions(path)] == [live.storage()["version"]]
    live.add(GALLERY[351:352])  # the next write removes what only the pruned versions named
    names = {live._dir.manifest["base"]["name"], *(seg["name"] for seg in live._dir.manifest["segments"])}
    assert len([p for p in path.iterdir() if p.name.startswith(("b0", "s0"))]) <= len(names) + 2  # + the previous version's


def test_cli_and_service_versions(tmp_path):
    idx = str(tmp_path / "idx")
    hubless.Index.build(GALLERY[:200], BANK, "nnn:k=8", "Flat", metadata=[{"s": r["s"]} for r in META[:200]]).save(idx)
    np.save(tmp_path / "q.npy", QUERIES[:2])
    np.save(tmp_path / "new.npy", GALLERY[200:210])
    r = runner.invoke(app, ["index", "versions", idx, "--keep", "3"])
    assert r.exit_code == 0 and "keeps 3 versions" in r.output, r.output
    first = hubless.Index.load(idx).storage()["version"]
    before = hubless.Index.load(idx).search(QUERIES[:2], 5)[1]
    assert runner.invoke(app, ["index", "add", idx, "--embeddings", str(tmp_path / "new.npy")]).exit_code == 0
    r = runner.invoke(app, ["search", idx, "--queries", str(tmp_path / "q.npy"), "--as-of", str(first), "--top-k", "5", "--json"])
    assert r.exit_code == 0, r.output
    assert [[h["id"] for h in json.loads(line)["hits"]] for line in r.output.strip().splitlines()] == before.tolist()
    r = runner.invoke(app, ["index", "versions", idx])
    assert r.exit_code == 0 and "current" in r.output and str(first) in r.output
    r = runner.invoke(app, ["search", idx, "--queries", str(tmp_path / "q.npy"), "--as-of", "999"])
    assert r.exit_code == 2 and "keeps no version 999" in r.output
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from hubless.service import create_app

    with TestClient(base_url="http://localhost", app=create_app({"idx": idx})) as c:
        listed = c.get("/versions/idx").json()
        assert listed["keep_versions"] == 3 and [v["version"] for v in listed["versions"]][0] == first
        old = c.post("/search", json={"embeddings": QUERIES[:2].tolist(), "top_k": 5, "version": first}).json()
        assert [[h["id"] for h in q["hits"]] for q in old["results"]] == before.tolist()
        assert c.post("/search", json={"embeddings": QUERIES[:2].tolist(), "version": 999}).status_code == 404
    key = {"Authorization": "Bearer secret-key-of-20-chars"}
    with TestClient(base_url="http://localhost", app=create_app({"idx": idx}, api_key="secret-key-of-20-chars")) as c:
        assert c.post(f"/versions/idx/{first}/restore").status_code == 401
        done = c.post(f"/versions/idx/{first}/restore", headers=key)
        assert done.status_code == 200 and done.json()["restored"] == first and done.json()["n_items"] == 200
        assert c.post("/versions/idx/999/restore", headers=key).status_code == 404
    assert hubless.Index.load(idx).ntotal == 200
    assert runner.invoke(app, ["index", "add", idx, "--embeddings", str(tmp_path / "new.npy")]).exit_code == 0
    oldest = hubless.Index.versions(idx)[0]
    r = runner.invoke(app, ["index", "restore", idx, "--version", str(oldest["version"])])
    assert r.exit_code == 0 and f"restored version {oldest['version']}" in r.output, r.output
    assert hubless.Index.load(idx).ntotal == oldest["items"]


# ---------------------------------------------------------------------------------- random sequences
_WRITE = st.one_of(
    st.tuples(st.just("add"), st.integers(1, 6)),
    st.tuples(st.just("remove_where"), LEAVES),
    st.tuples(st.just("update_where"), LEAVES, st.sampled_from(["a", "b", "zz"])),
    st.tuples(st.just("update_ids"), st.integers(0, 10_000), st.sampled_from([1990, 2020, None])),
    st.tuples(st.just("reopen")),
    st.tuples(st.just("restore")),
)


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_WRITE, min_size=3, max_size=10))
@example(steps=[("add", 3), ("remove_where", {"s": "a"}), ("restore",), ("add", 2), ("update_where", {"s": "b"}, "zz"), ("restore",)])
def test_random_sequences_of_filtered_writes_equal_a_model_and_a_fresh_build(tmp_path_factory, steps):
    """Adds, removals by filter, metadata updates by filter and by id, reopening and restoring a
    kept version, in any order: the saved index holds the model's items, in the model's order,
    with the model's records, and searches (filtered or not) as a fresh build over them; every
    kept version reads back as the model was then."""
    path = tmp_path_factory.mktemp("seq") / "idx"
    method = "dis:k_activation=2"
    start = 120
    hubless.Index.build(GALLERY[:start], BANK, method, "Flat", metadata=META[:start]).set_keep_versions(4).save(path)
    live = hubless.Index.open(path)
    order = list(range(start))  # the model: ids in the index's order, and their records
    records = {i: dict(META[i]) for i in order}
    nxt = start
    states = {}  # version -> the model then
    for step in steps:
        states[live.storage()["version"]] = (list(order), {i: dict(r) for i, r in records.items()})
        kind = step[0]
        if kind == "restore":
            kept = [v["version"] for v in hubless.Index.versions(path) if not v["current"]]
            if kept:
                hubless.Index.restore(path, kept[0])
                order, records = list(states[kept[0]][0]), {i: dict(r) for i, r in states[kept[0]][1].items()}
                live.refresh()
            continue
        if kind == "add":
            new = list(range(nxt, min(nxt + step[1], N)))
            if not new:
                continue
            assert live.add(GALLERY[new], [META[i] for i in new]).tolist() == new
            order += new
            records.update({i: dict(META[i]) for i in new})
            nxt = new[-1] + 1
        elif kind == "remove_where":
            hit = [i for i in order if matches(records[i], step[1])]
            if len(hit) >= len(order) - 10:  # keep a few items (DIS needs some; every item is refused)
                continue
            assert live.remove(where=step[1]).tolist() == sorted(hit)
            order = [i for i in order if i not in hit]
        elif kind == "update_where":
            hit = [i for i in order if matches(records[i], step[1])]
            assert live.update_metadata(where=step[1], values={"s": step[2]}, unset=["tags"]).tolist() == hit
            for i in hit:
                records[i].update(s=step[2], tags=None)
            order = [i for i in order if i not in hit] + hit
        elif kind == "update_ids":
            target = order[step[1] % len(order)]
            live.update_metadata([target], values=[{"y": step[2]}])
            records[target]["y"] = step[2]
            order = [i for i in order if i != target] + [target]
        else:
            live = hubless.Index.open(path)
    states[live.storage()["version"]] = (list(order), {i: dict(r) for i, r in records.items()})
    for v in hubless.Index.versions(path):  # every kept version reads back as the model was then
        as_of = hubless.Index.load(path, version=v["version"])
        assert as_of.ids.tolist() == states[v["version"]][0]
        assert as_of.records(as_of.ids) == [states[v["version"]][1][i] for i in as_of.ids.tolist()]
    loaded = hubless.Index.load(path)
    fresh = hubless.Index.build(GALLERY[order], BANK, method, "Flat", ids=order, metadata=[records[i] for i in order],
                                metadata_schema=loaded.metadata_schema)  # fmt: skip
    for index in (live, loaded):
        np.testing.assert_array_equal(index.ids, order)
        assert index.records(order) == [records[i] for i in order]
        for where in (None, {"s": "a"}, {"$or": [{"y": 2020}, {"$not": {"info.src": "web"}}]}):
            np.testing.assert_array_equal(index.search(QUERIES, 10, where=where)[1], fresh.search(QUERIES, 10, where=where)[1])


def test_a_struct_with_a_null_field_fits_its_column_and_a_wrong_field_type_is_refused():
    meta = Metadata.from_records([{"info": {"src": "web", "n": 1}, "objs": [{"l": "a"}]}], 1)
    more = meta.appended([{"info": {"src": None, "n": 3}, "objs": [{"l": None}]}], 1)  # inferred struct<src: null>
    assert more.schema == meta.schema and more.table.to_pylist()[1] == {"info": {"src": None, "n": 3}, "objs": [{"l": None}]}
    with pytest.raises(InvalidInput, match="'info' holds struct<src: string, n: int64>"):
        meta.appended([{"info": {"src": 3, "n": 3}}], 1)
    with pytest.raises(InvalidInput, match="'info' holds struct"):
        meta.appended([{"info": {"src": "x"}}], 1)  # a field missing: another struct type
