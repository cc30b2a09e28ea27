"""Typed item metadata (a kept pyarrow schema, nullable new keys, clear type conflicts that
change nothing, types that round-trip) and search filters (equality, in, ranges, lists) equal
to brute force over the filtered items, for every correction, on exact and FAISS indexes."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pytest
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.corrections import make_correction
from hubless.errors import InvalidInput
from hubless.index.segments import commit_segments, write_segment
from tests.conftest import unit_rows

runner = CliRunner()
RNG = np.random.default_rng(31)
N, DIM = 6000, 16
GALLERY = unit_rows(RNG, N, DIM)
BANK = unit_rows(RNG, 900, DIM)
GALLERY_BANK = unit_rows(RNG, 400, DIM)
QUERIES = unit_rows(RNG, 25, DIM)
SPLITS = np.array(["train", "val", "test"])[RNG.integers(0, 3, N)]
YEARS = RNG.integers(1990, 2030, N)
META = [
    {"split": str(s), "year": int(y), "score": float(i) / 7, "ok": bool(i % 4 == 0), "tags": [f"t{i % 5}", f"u{i % 3}"]}
    for i, (s, y) in enumerate(zip(SPLITS, YEARS))
]


def matches(record: dict, where: dict) -> bool:
    """The filter semantics, written out plainly (the reference for Metadata.mask)."""
    return all(holds(record.get(key), cond) for key, cond in where.items())


def holds(value, cond) -> bool:
    """Whether one metadata value (a list: any of its elements) meets one key's condition."""
    present = [v for v in (value if isinstance(value, list) else [value]) if v is not None]
    for op, want in (cond if isinstance(cond, dict) else {"eq": cond}).items():
        if op == "eq":
            ok = any(v == want for v in present)
        elif op == "ne":
            ok = value is not None and not any(v == want for v in present)
        elif op == "in":  # as eq does, value by value (NaN equals nothing, not even itself)
            ok = any(v == w for v in present for w in want)
        elif op == "not_in":
            ok = value is not None and not any(v == w for v in present for w in want)
        else:
            compare = {"gt": lambda a, b: a > b, "gte": lambda a, b: a >= b, "lt": lambda a, b: a < b, "lte": lambda a, b: a <= b}[op]
            ok = any(compare(v, want) for v in present)
        if not ok:
            return False
    return True


def brute_force(corr, where, k):
    keep = np.array([matches(m, where) for m in META])
    scores = corr.score(QUERIES).astype(np.float64)
    scores[:, ~keep] = -np.inf
    order = np.lexsort((np.broadcast_to(np.arange(N), scores.shape), -scores), axis=1)[:, :k]
    top = np.take_along_axis(scores, order, axis=1)
    return top, np.where(np.isfinite(top), order, -1)


WHERES = [
    {"split": "test"},
    {"split": "test", "year": {"gte": 2020}},
    {"year": {"gt": 1995, "lte": 2000}},
    {"split": {"in": ["val", "test"]}, "ok": True},
    {"tags": "t3"},
    {"tags": {"in": ["t1", "u2"]}, "split": {"ne": "train"}},
    {"year": 2001, "split": "val"},  # selective: ~50 items
    {"score": {"lt": 3.0}},  # the first 21 items
    {"year": {"not_in": [2000, 2001]}, "score": {"gte": 10}},
]


@pytest.mark.parametrize(
    "method", ["nnn:alpha=0.5,k=8", "csls:k=5", "dn:lam=0.3", "is:beta=20.0", "dis:k_activation=2", "dualis", "dualdis"]
)
@pytest.mark.parametrize("factory", ["Flat", "IVF16,Flat"])
def test_filters_equal_brute_force_over_the_filtered_items(method, factory):
    index = hubless.Index.build(GALLERY, BANK, method, factory, gallery_bank=GALLERY_BANK, metadata=META, nprobe=16)
    corr = make_correction(method).fit(GALLERY, BANK, GALLERY_BANK)
    for where in WHERES:
        ref_scores, ref_ids = brute_force(corr, where, 10)
        scores, ids = index.search(QUERIES, 10, where=where)
        np.testing.assert_array_equal(ids, ref_ids, err_msg=str(where))
        finite = np.isfinite(ref_scores)
        np.testing.assert_allclose(scores[finite], ref_scores[finite], rtol=1e-5, atol=1e-6, err_msg=str(where))
        assert not np.isfinite(scores[~finite]).any()


def test_filters_after_writes_and_on_hnsw_and_pq(tmp_path):
    index = hubless.Index.build(GALLERY, BANK, "dis:k_activation=1", "HNSW16", metadata=META, ef_search=256)
    selective, broad = {"year": 2001, "split": "val"}, {"split": {"ne": "train"}}
    corr = make_correction("dis:k_activation=1").fit(GALLERY, BANK)
    _, ref_ids = brute_force(corr, selective, 10)
    np.testing.assert_array_equal(index.search(QUERIES, 10, where=selective)[1], ref_ids)  # selective: exact over its rows
    _, ref_ids = brute_force(corr, broad, 10)
    ids = index.search(QUERIES, 10, where=broad)[1]  # broad: HNSW with a FAISS IDSelector
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, ref_ids)]) >= 0.97
    assert all(matches(META[j], broad) for j in ids.ravel())
    pq = hubless.Index.build(GALLERY, BANK, "nnn:k=8", "PQ4x4", metadata=META)  # a plain PQ index cannot select: exact
    _, ref_ids = brute_force(make_correction("nnn:k=8").fit(GALLERY, BANK), broad, 10)
    np.testing.assert_array_equal(pq.search(QUERIES, 10, where=broad)[1], ref_ids)
    live = hubless.Index.build(GALLERY[:5000], BANK, "nnn:k=8", "IVF16,Flat", metadata=META[:5000], nprobe=16)
    live.save(tmp_path / "idx")
    live = hubless.Index.open(tmp_path / "idx")
    live.add(GALLERY[5000:], META[5000:])
    live.remove(np.arange(0, 200))
    live.upsert([300], GALLERY[300:301], [{**META[300], "split": "nowhere"}])
    kept = np.r_[np.arange(200, 300), np.arange(301, N), 300]
    meta = [META[i] for i in kept[:-1]] + [{**META[300], "split": "nowhere"}]
    corr = make_correction("nnn:k=8").fit(GALLERY[kept], BANK)
    for where in ({"split": "test"}, {"split": "nowhere"}, {"year": {"lt": 1992}}):
        keep = np.array([matches(m, where) for m in meta])
        scores = corr.score(QUERIES)
        scores[:, ~keep] = -np.inf
        order = np.argsort(-scores, axis=1, kind="stable")[:, :5]
        ref_ids = np.where(np.isfinite(np.take_along_axis(scores, order, axis=1)), kept[order], -1)
        np.testing.assert_array_equal(live.search(QUERIES, 5, where=where)[1], ref_ids)


def test_schema_is_kept_new_keys_are_nullable_and_types_round_trip(tmp_path):
    rng = np.random.default_rng(2)
    meta = [{"i": 1, "f": 0.5, "b": True, "s": "a", "tags": ["x"], "none": None}, {"i": 2, "f": 1.5, "b": False, "s": "b", "tags": []}]
    index = hubless.Index.build(unit_rows(rng, 2, DIM), BANK, "nnn:k=4", "Flat", metadata=meta)
    schema = index.metadata_schema
    assert [str(t) for t in schema.types] == ["int64", "double", "bool", "string", "list<item: string>", "null"]
    index.save(tmp_path / "idx")
    live = hubless.Index.open(tmp_path / "idx")
    live.add(unit_rows(rng, 1, DIM), [{"i": 3, "f": 2, "new": "yes", "none": 7}])  # an int for a float column; a new key
    live.add(unit_rows(rng, 1, DIM))  # no metadata at all
    loaded = hubless.Index.load(tmp_path / "idx")
    assert [(f.name, str(f.type)) for f in loaded.metadata_schema] == [
        ("i", "int64"), ("f", "double"), ("b", "bool"), ("s", "string"), ("tags", "list<item: string>"), ("none", "int64"),
        ("new", "string"),
    ]  # fmt: skip
    records = loaded.records(loaded.ids)
    assert records[0] == {"i": 1, "f": 0.5, "b": True, "s": "a", "tags": ["x"], "none": None, "new": None}
    assert records[2] == {"i": 3, "f": 2.0, "b": None, "s": None, "tags": None, "none": 7, "new": "yes"}
    assert type(records[2]["i"]) is int and type(records[2]["f"]) is float and records[3] == dict.fromkeys(records[3])
    loaded.compact()
    loaded.save(tmp_path / "copy")
    assert hubless.Index.load(tmp_path / "copy").records(loaded.ids) == records
    table = loaded.metadata_table()
    assert table.column_names[0] == "id" and table.column("id").to_pylist() == loaded.ids.tolist()


@pytest.mark.parametrize(
    "record, message",
    [
        ({"i": "3"}, "metadata key 'i' holds int64 (int) values; got string (str) ('3')"),
        ({"i": 2.5}, "'i' holds int64 (int) values; got float64 (float) (2.5)"),
        ({"i": True}, "'i' holds int64 (int) values; got bool (True)"),
        ({"s": 4}, "'s' holds string (str) values; got int64 (int) (4)"),
        ({"tags": "x"}, "'tags' holds list<string> (list of str) values; got string (str) ('x')"),
    ],
)
def test_a_value_of_another_type_is_refused_and_nothing_is_written(tmp_path, record, message):
    rng = np.random.default_rng(3)
    meta = [{"i": 1, "s": "a", "tags": ["x"]}] * 3
    hubless.Index.build(unit_rows(rng, 3, DIM), BANK, "nnn:k=4", "Flat", metadata=meta).save(tmp_path / "idx")
    before = {f.name: f.read_bytes() for f in (tmp_path / "idx").rglob("*") if f.is_file()}
    live = hubless.Index.open(tmp_path / "idx")
    with pytest.raises(InvalidInput) as err:
        live.add(unit_rows(rng, 2, DIM), [{"i": 5}, record])
    assert message in str(err.value)
    assert live.ntotal == 3 and {f.name: f.read_bytes() for f in (tmp_path / "idx").rglob("*") if f.is_file()} == before
    with pytest.raises(InvalidInput, match="mixes values of types int, str"):
        live.add(unit_rows(rng, 2, DIM), [{"new": 1}, {"new": "one"}])


def test_a_number_its_key_s_type_cannot_hold_is_refused():
    """1e300 into a float32 key became inf (Arrow's cast does not check); an integer beyond the
    key's integer type was already refused."""
    rng = np.random.default_rng(5)
    schema = pa.schema([("x", pa.float32()), ("n", pa.int32())])
    index = hubless.Index.build(unit_rows(rng, 3, DIM), BANK, "nnn:k=4", "Flat", metadata=[{"x": 0.5, "n": 1}] * 3, metadata_schema=schema)
    for record, message in [
        ({"x": 1e300}, "'x' holds float values, at most 3.402823e+38 in size; got 1e+300"),
        ({"n": 2**40}, "'n' holds int32"),
    ]:
        with pytest.raises(InvalidInput, match=re.escape(message)):
            index.add(unit_rows(rng, 1, DIM), [record])
        with pytest.raises(InvalidInput, match=re.escape(message)):
            index.update_metadata(where={"n": 1}, values=record)
    assert index.ntotal == 3 and index.records(index.ids) == [{"x": 0.5, "n": 1}] * 3
    index.add(unit_rows(rng, 1, DIM), [{"x": float("inf"), "n": 2}])  # an infinity is a float32 value
    assert index.records(index.ids[-1:]) == [{"x": float("inf"), "n": 2}]


def test_a_schema_given_at_build_is_enforced():
    rng = np.random.default_rng(4)
    schema = pa.schema([("year", pa.int64()), ("split", pa.string())])
    index = hubless.Index.build(unit_rows(rng, 3, DIM), BANK, "nnn:k=4", "Flat", metadata=[{"year": 2020}] * 3, metadata_schema=schema)
    assert index.metadata_schema.field("split").type == pa.string()
    with pytest.raises(InvalidInput, match="'split' holds string"):
        index.add(unit_rows(rng, 1, DIM), [{"split": 3}])


@pytest.mark.parametrize(
    "where, message",
    [
        ({"yr": 1}, "no metadata key 'yr'"),
        ({"year": "2020"}, "'year': the key holds int64"),
        ({"year": [2020]}, "a list is ambiguous"),
        ({"year": {"between": [1, 2]}}, "unknown operator 'between'"),
        ({"split": {"gt": 3}}, "'split': the key holds string"),
        ({"year": {"in": 2020}}, "takes a list"),
        ({}, "non-empty dict"),
    ],
)
def test_bad_filters_are_clear_errors(where, message):
    index = hubless.Index.build(GALLERY[:100], BANK, "nnn:k=4", "Flat", metadata=META[:100])
    with pytest.raises(InvalidInput, match=message):
        index.search(QUERIES, 5, where=where)
    plain = hubless.Index.build(GALLERY[:100], BANK, "nnn:k=4", "Flat")
    with pytest.raises(InvalidInput, match="no item metadata"):
        plain.search(QUERIES, 5, where={"split": "test"})


def test_cli_where_get_compact_verify(tmp_path):
    np.save(tmp_path / "g.npy", GALLERY[:300])
    np.save(tmp_path / "qb.npy", BANK)
    np.save(tmp_path / "q.npy", QUERIES[:2])
    np.save(tmp_path / "new.npy", GALLERY[300:303])
    (tmp_path / "meta.json").write_text(json.dumps(META[:300]))
    (tmp_path / "new.json").write_text(json.dumps(META[300:303]))
    idx = str(tmp_path / "idx")
    ids = ",".join(str(1000 + 2 * i) for i in range(300))
    r = runner.invoke(app, ["index", "build", "--gallery", str(tmp_path / "g.npy"), "--query-bank", str(tmp_path / "qb.npy"),
                            "--metadata", str(tmp_path / "meta.json"), "--ids", ids, "--out", idx, "--no-progress"])  # fmt: skip
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["index", "add", idx, "--embeddings", str(tmp_path / "new.npy"), "--metadata", str(tmp_path / "new.json")])
    assert r.exit_code == 0 and "ids 1599, 1600, 1601" in r.output, r.output
    r = runner.invoke(
        app, ["search", idx, "--queries", str(tmp_path / "q.npy"), "--where", '{"split": "test", "year": {"gte": 2010}}', "--json"]
    )
    assert r.exit_code == 0, r.output
    hits = [h for line in r.output.strip().splitlines() for h in json.loads(line)["hits"]]
    assert hits and all(h["metadata"]["split"] == "test" and h["metadata"]["year"] >= 2010 for h in hits)
    index = hubless.Index.load(idx)
    expected = index.search(QUERIES[:2], 10, where={"split": "test", "year": {"gte": 2010}})[1]
    assert [h["id"] for h in json.loads(r.output.splitlines()[0])["hits"]] == [i for i in expected[0] if i >= 0]
    r = runner.invoke(app, ["index", "get", idx, "--ids", "1000,1601"])
    assert r.exit_code == 0 and [json.loads(x)["metadata"]["year"] for x in r.output.splitlines()] == [META[0]["year"], META[302]["year"]]
    r = runner.invoke(app, ["index", "add", idx, "--embeddings", str(tmp_path / "new.npy"), "--ids", "1000,1,2", "--upsert"])
    assert r.exit_code == 0 and "upserted 3 items" in r.output, r.output
    r = runner.invoke(app, ["index", "remove", idx, "--ids", "1002,77777"])
    assert r.exit_code == 2 and "no item with id 77777" in r.output
    r = runner.invoke(app, ["index", "compact", idx])
    assert r.exit_code == 0 and "-> 305 rows" in r.output, r.output
    r = runner.invoke(app, ["index", "verify", idx])
    assert r.exit_code == 0 and "ok:" in r.output, r.output
    r = runner.invoke(app, ["search", idx, "--queries", str(tmp_path / "q.npy"), "--where", "{bad json"])
    assert r.exit_code == 2 and "--where must be a JSON object" in r.output
    r = runner.invoke(app, ["search", idx, "--queries", str(tmp_path / "q.npy"), "--where", '{"year": "x"}'])
    assert r.exit_code == 2 and "the key holds int64" in r.output


def test_segments_written_elsewhere_are_committed_together_or_not_at_all(tmp_path):
    """The distributed writers' API: pending segments from several processes, one commit."""
    hubless.Index.build(GALLERY[:200], BANK, "dis:k_activation=2", "Flat", metadata=META[:200]).save(tmp_path / "idx")
    from hubless.engine import compute_statistics

    stats = compute_statistics(GALLERY[250:260], BANK, None, make_correction("dis:k_activation=2").statistics_request())
    a = write_segment(tmp_path / "idx", GALLERY[200:250], metadata=META[200:250])  # ids left to the commit
    b = write_segment(tmp_path / "idx", GALLERY[250:260], ids=np.arange(5000, 5010), statistics=stats, metadata=META[250:260])
    assert hubless.Index.load(tmp_path / "idx").ntotal == 200  # pending: nothing changed yet
    bad = write_segment(tmp_path / "idx", GALLERY[260:262], ids=[5000, 5001])  # ids that b adds
    with pytest.raises(ValueError, match="ids the index holds already"):
        commit_segments(tmp_path / "idx", [a, b, bad])
    assert hubless.Index.load(tmp_path / "idx").ntotal == 200 and a.exists()
    result = commit_segments(tmp_path / "idx", [a, b])
    np.testing.assert_array_equal(result["ids"], np.r_[np.arange(200, 250), np.arange(5000, 5010)])
    loaded = hubless.Index.load(tmp_path / "idx")
    fresh = hubless.Index.build(GALLERY[:260], BANK, "dis:k_activation=2", "Flat", ids=loaded.ids)
    np.testing.assert_array_equal(loaded.search(QUERIES, 10)[1], fresh.search(QUERIES, 10)[1])
    np.testing.assert_array_equal(loaded.correction.activation_mask_, fresh.correction.activation_mask_)
    assert loaded.records([5003]) == [META[253]]
