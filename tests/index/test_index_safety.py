"""The live index keeps every acknowledged write, whatever the handle, the id or the disk does
(issue 38): compaction and save through any handle (mapped or not) of every factory the docs
show write an index that loads, verifies and searches identically; ids up to int64's limit
round-trip; a stale handle's save is a Conflict; a write through a mapped handle never carries
a damaged file into a new base; ``index verify`` reads the FAISS structure as a load does;
metadata keys of empty lists take their type from the first non-empty value."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.errors import Conflict, Corrupt, InvalidInput
from hubless.index import disk, integrity, pointer
from hubless.index.ids import MAX_ID
from tests.conftest import unit_rows

DIM = 16
RNG = np.random.default_rng(38)
GALLERY = unit_rows(RNG, 700, DIM)
BANK = unit_rows(RNG, 120, DIM)
QUERIES = unit_rows(RNG, 9, DIM)
#: every factory form the docs show (hubless.index.factory), at sizes that train in a moment
FACTORIES = ("Flat", "IVF8,Flat", "IVF8,SQ8", "IVF8,PQ4x4", "PQ4x4", "HNSW8")
HANDLES = ("load", "load-mmap", "open", "open-mmap")

runner = CliRunner()


def _handle(path, kind: str) -> hubless.Index:
    mmap = kind.endswith("mmap")
    return hubless.Index.open(path, mmap=mmap) if kind.startswith("open") else hubless.Index.load(path, mmap=mmap)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One saved index per factory (built once), with metadata: copied per test."""
    folder = tmp_path_factory.mktemp("safety")
    out = {}
    for factory in FACTORIES:
        meta = [{"g": int(i % 3)} for i in range(GALLERY.shape[0])]
        path = folder / factory.replace(",", "_")
        hubless.Index.build(GALLERY, BANK, "nnn:alpha=0.5,k=4", factory, metadata=meta, nprobe=8).save(path)
        out[factory] = path
    return out


def _copy(saved, factory, tmp_path):
    path = tmp_path / "idx"
    shutil.copytree(saved[factory], path)
    return path


def _same_search(a: hubless.Index, b: hubless.Index) -> None:
    for where in (None, {"g": 1}):
        sa, ia = a.search(QUERIES, 5, where=where)
        sb, ib = b.search(QUERIES, 5, where=where)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_allclose(sa, sb, rtol=1e-6, atol=1e-6)


def _loads_identically(path, reference: hubless.Index) -> None:
    integrity.verify(path)
    for mmap in (False, True):
        loaded = hubless.Index.load(path, mmap=mmap)
        np.testing.assert_array_equal(loaded.ids, reference.ids)
        _same_search(loaded, reference)


@pytest.mark.slow
@pytest.mark.parametrize("factory", FACTORIES)
@pytest.mark.parametrize("kind", HANDLES)
def test_compaction_and_save_through_any_handle_write_an_index_that_loads_and_searches_identically(saved, factory, kind, tmp_path):
    path = _copy(saved, factory, tmp_path)
    original = hubless.Index.load(path)
    index = _handle(path, kind)
    index.compact()  # nothing pending: the base is written again as it is
    if kind.startswith("load"):
        index.save(path, overwrite=True)
    _loads_identically(path, original)
    index.save(tmp_path / "copy")  # a copy of the (mapped) index, elsewhere
    _loads_identically(tmp_path / "copy", original)
    # with writes pending: a new base of the live items, the FAISS training kept
    index = _handle(path, kind)
    index.add(unit_rows(np.random.default_rng(1), 5, DIM), [{"g": 1}] * 5)
    index.remove(index.ids[:3])
    index.compact()
    index.save(path, overwrite=True)
    _loads_identically(path, index)
    index.save(tmp_path / "copy2")
    _loads_identically(tmp_path / "copy2", index)


def test_a_mapped_index_maps_its_faiss_structure_as_one_self_contained_index(saved, tmp_path):
    from hubless.index.faiss_build import self_contained

    path = _copy(saved, "IVF8,Flat", tmp_path)
    mapped = hubless.Index.load(path, mmap=True)
    assert self_contained(mapped._snap.faiss)
    assert mapped.storage()["memory_mapped"]


# ---------------------------------------------------------------------------------- ids
@pytest.mark.parametrize("big", [2**40, 2**62, MAX_ID])
def test_ids_up_to_int64s_limit_are_kept_across_loads(saved, big, tmp_path):
    path = _copy(saved, "Flat", tmp_path)
    live = hubless.Index.open(path)
    assert live.add(QUERIES[:1], ids=[big]).tolist() == [big]
    loaded = hubless.Index.load(path)
    assert big in loaded and loaded.info()["next_id"] == big + 1
    assert loaded.search(QUERIES[:1], 1)[1].dtype == np.int64
    if big < MAX_ID:
        assert hubless.Index.open(path).add(QUERIES[:1]).tolist() == [big + 1]
    else:  # no id left to assign: a clear error naming the limit, nothing written
        with pytest.raises(InvalidInput, match=r"2\*\*63 - 2"):
            hubless.Index.open(path).add(QUERIES[:1])
        assert hubless.Index.load(path).ntotal == GALLERY.shape[0] + 1
    built = hubless.Index.build(GALLERY[:40], BANK, "nnn:k=4", "Flat", ids=np.arange(40) + big - 39)
    built.save(tmp_path / "built")
    np.testing.assert_array_equal(hubless.Index.load(tmp_path / "built").ids, np.arange(40) + big - 39)


def test_ids_past_int64s_limit_are_refused_naming_it(saved, tmp_path):
    path = _copy(saved, "Flat", tmp_path)
    for bad in (2**63 - 1, 2**63):
        with pytest.raises(InvalidInput, match=r"at most 2\*\*63 - 2"):
            hubless.Index.open(path).add(QUERIES[:1], ids=np.array([bad], dtype=np.uint64))
        with pytest.raises(InvalidInput, match=r"at most 2\*\*63 - 2"):
            hubless.Index.build(GALLERY[:10], BANK, "nnn:k=4", "Flat", ids=np.arange(10, dtype=np.uint64) + np.uint64(bad - 9))
    assert hubless.Index.load(path).ntotal == GALLERY.shape[0]


# ---------------------------------------------------------------------------------- stale handles
@pytest.mark.parametrize("mmap", [False, True])
def test_a_stale_handles_save_over_a_changed_directory_is_a_conflict(saved, mmap, tmp_path):
    path = _copy(saved, "Flat", tmp_path)
    stale = hubless.Index.load(path, mmap=mmap)
    written = hubless.Index.open(path).add(QUERIES[:1])
    mine = stale.add(QUERIES[1:2])
    assert mine.tolist() == written.tolist()  # the same id, assigned on both sides
    with pytest.raises(Conflict, match="changed since this index was loaded"):
        stale.save(path, overwrite=True)
    after = hubless.Index.load(path)
    np.testing.assert_allclose(after.get(written).embeddings, QUERIES[:1], atol=1e-6)  # the other writer's item is kept
    fresh = hubless.Index.load(path)  # loading again and redoing the change works
    fresh.add(QUERIES[1:2])
    fresh.save(path, overwrite=True)
    assert hubless.Index.load(path).ntotal == GALLERY.shape[0] + 2


def test_a_handle_saved_back_unchanged_elsewhere_still_commits(saved, tmp_path):
    path = _copy(saved, "IVF8,Flat", tmp_path)
    index = hubless.Index.load(path)
    index.add(QUERIES[:2])
    index.save(path, overwrite=True)
    index.remove(index.ids[-1:])
    index.save(path, overwrite=True)  # its own commit moved CURRENT: not a conflict
    assert hubless.Index.load(path).ntotal == GALLERY.shape[0] + 1


# ---------------------------------------------------------------------------------- damaged files
def _damage(file, offset: int = -8) -> None:
    raw = bytearray(file.read_bytes())
    raw[offset] ^= 0x5A
    file.write_bytes(bytes(raw))


@pytest.mark.parametrize("name", ["gallery.npy", "stat.query_topk.npy", "index.faiss", "query_bank.npy"])
def test_cli_writes_never_carry_a_damaged_mapped_file_into_a_new_base(saved, name, tmp_path):
    path = _copy(saved, "IVF8,Flat", tmp_path)
    base = pointer.read_manifest(path)[0]["base"]["name"]
    _damage(path / base / name)
    with pytest.raises(Corrupt, match=name):
        integrity.verify(path)
    np.save(tmp_path / "new.npy", QUERIES[:2])
    added = runner.invoke(app, ["index", "add", str(path), "--embeddings", str(tmp_path / "new.npy")])
    if name == "query_bank.npy":  # an add computes the new items' statistics from the bank: verified first
        assert added.exit_code != 0 and name in added.output, added.output
    else:  # a segment carries only the new rows: written (the damaged file stays as it is, verify still fails)
        assert added.exit_code == 0, added.output
    compacted = runner.invoke(app, ["index", "compact", str(path)])  # a new base would carry the damaged file
    assert compacted.exit_code != 0, compacted.output
    assert name in compacted.output and "corrupt" in compacted.output.lower(), compacted.output
    assert pointer.read_manifest(path)[0]["base"]["name"] == base  # no new base
    with pytest.raises(Corrupt, match=name):
        integrity.verify(path)
    # in the library: a mapped handle's compaction or copy refuses the same way
    with pytest.raises(Corrupt, match=name):
        hubless.Index.open(path, mmap=True).compact()
    with pytest.raises(Corrupt, match=name):
        hubless.Index.load(path, mmap=True).save(tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_cli_compact_with_nothing_pending_writes_a_new_base(saved, tmp_path):
    path = _copy(saved, "IVF8,Flat", tmp_path)
    before = pointer.read_manifest(path)[0]["base"]["name"]
    result = runner.invoke(app, ["index", "compact", str(path)])
    assert result.exit_code == 0, result.output
    assert pointer.read_manifest(path)[0]["base"]["name"] != before
    _loads_identically(path, hubless.Index.load(saved["IVF8,Flat"]))


def test_cli_remove_through_a_mapped_handle_recomputing_lists_verifies_the_gallery(tmp_path):
    index = hubless.Index.build(GALLERY[:60], BANK, "dis:k_activation=1", "Flat")
    index.save(tmp_path / "idx")
    path = tmp_path / "idx"
    base = pointer.read_manifest(path)[0]["base"]["name"]
    _damage(path / base / "gallery.npy")
    lists = index.correction.statistics_.query_activation
    victim = int(index.ids[int(lists[0, 0])])
    result = runner.invoke(app, ["index", "remove", str(path), "--ids", str(victim)])
    assert result.exit_code != 0 and "gallery.npy" in result.output, result.output


# ---------------------------------------------------------------------------------- metadata
def test_an_empty_list_key_takes_its_element_type_from_the_first_non_empty_value(tmp_path):
    meta = [{"tags": []} for _ in range(20)]
    index = hubless.Index.build(GALLERY[:20], BANK, "nnn:k=4", "Flat", metadata=meta)
    index.save(tmp_path / "idx")
    live = hubless.Index.open(tmp_path / "idx")
    ids = live.add(QUERIES[:3], [{"tags": ["cat"]}, {"tags": []}, {"tags": ["dog", "cat"]}])
    assert str(live.metadata_schema.field("tags").type) == "list<item: string>"
    with pytest.raises(InvalidInput, match="'tags' holds list<string>"):
        live.add(QUERIES[:1], [{"tags": [3]}])
    for loaded in (hubless.Index.load(tmp_path / "idx"), hubless.Index.load(tmp_path / "idx", mmap=True)):
        assert loaded.records(ids) == [{"tags": ["cat"]}, {"tags": []}, {"tags": ["dog", "cat"]}]
        assert loaded.records([0]) == [{"tags": []}]
        assert sorted(loaded.search(QUERIES, 30, where={"tags": "cat"})[1][0][:2].tolist()) == sorted([ids[0], ids[2]])
    live.compact()
    assert hubless.Index.load(tmp_path / "idx").records(ids[:1]) == [{"tags": ["cat"]}]
    with pytest.raises(InvalidInput, match="holds list"):
        hubless.Index.open(tmp_path / "idx").add(QUERIES[:1], [{"tags": 3}])


def test_a_metadata_key_named_id_is_refused_clearly(monkeypatch):
    import pyarrow as pa

    from hubless.corrections import NNN

    def no_fit(*args, **kwargs):  # the key is refused before the correction is fitted
        raise AssertionError("fitted")

    with monkeypatch.context() as patch:
        patch.setattr(NNN, "fit", no_fit)
        for metadata in ([{"id": i} for i in range(20)], {"id": list(range(20))}, pa.table({"id": list(range(20))})):
            with pytest.raises(InvalidInput, match="'id' is reserved"):
                hubless.Index.build(GALLERY[:20], BANK, "nnn:k=4", "Flat", metadata=metadata)
        with pytest.raises(InvalidInput, match="'id' is reserved"):
            hubless.Index.build(GALLERY[:20], BANK, "nnn:k=4", "Flat", metadata_schema=pa.schema([("id", pa.int64())]))
    index = hubless.Index.build(GALLERY[:20], BANK, "nnn:k=4", "Flat", metadata=[{"g": 1}] * 20)
    with pytest.raises(InvalidInput, match="'id' is reserved"):
        index.add(QUERIES[:1], [{"id": 3}])
    table = index.metadata_table()
    assert table.column_names == ["id", "g"]


# ---------------------------------------------------------------------------------- verify
def _replace_base_file(path, name: str, raw: bytes) -> None:
    """Replace a base file and record its checksum in the manifest (what a writer with the bug
    did: the damage is in a file whose checksum matches)."""
    import hashlib

    manifest, _ = pointer.read_manifest(path)
    base = manifest["base"]
    (path / base["name"] / name).write_bytes(raw)
    base["files"][name] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
    disk.commit(path, manifest, keep=pointer.names_in(manifest))


def test_verify_reads_the_faiss_lists_as_a_load_and_a_search_do(saved, tmp_path):
    import faiss

    path = _copy(saved, "IVF8,Flat", tmp_path)
    ok = runner.invoke(app, ["index", "verify", str(path)])
    assert ok.exit_code == 0 and "FAISS IVF: 8 lists" in ok.output, ok.output
    file = path / pointer.read_manifest(path)[0]["base"]["name"] / "index.faiss"
    # lists that name another file (an index written from FAISS's IO_FLAG_MMAP load before the fix)
    elsewhere = faiss.read_index(str(file), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
    good = file.read_bytes()
    _replace_base_file(path, "index.faiss", faiss.serialize_index(elsewhere).tobytes())
    result = runner.invoke(app, ["index", "verify", str(path)])
    assert result.exit_code != 0 and "index.faiss keeps its inverted lists in another file" in result.output, result.output
    with pytest.raises(Corrupt, match="another file"):
        hubless.Index.load(path)
    # a list entry naming a row the base does not have
    index = faiss.deserialize_index(np.frombuffer(good, dtype=np.uint8))
    ivf = faiss.extract_index_ivf(index)
    first = next(i for i in range(ivf.nlist) if ivf.invlists.list_size(i))
    code = faiss.rev_swig_ptr(ivf.invlists.get_single_code(first, 0), ivf.invlists.code_size).copy()
    ivf.invlists.update_entry(first, 0, GALLERY.shape[0] + 5, faiss.swig_ptr(code))
    _replace_base_file(path, "index.faiss", faiss.serialize_index(index).tobytes())
    with pytest.raises(Corrupt, match=f"inverted list {first} holds id {GALLERY.shape[0] + 5}"):
        integrity.verify(path)


# ---------------------------------------------------------------------------------- write cost
def test_one_row_adds_with_metadata_never_rebuild_the_metadata_table(saved, tmp_path):
    from hubless.index.metadata import MAX_PARTS

    path = _copy(saved, "Flat", tmp_path)
    live = hubless.Index.open(path)
    rows = unit_rows(np.random.default_rng(2), 3 * MAX_PARTS, DIM)
    for i in range(rows.shape[0]):
        live.add(rows[i : i + 1], [{"g": i % 3, "note": f"n{i}"} if i % 2 else {"g": 1}])
        meta = live._snap.metadata
        assert "table" not in meta.__dict__  # the write built its segment from its own part only
        assert len(meta.parts) <= MAX_PARTS + 1
    loaded = hubless.Index.load(path)
    assert len(loaded._snap.metadata.parts) <= MAX_PARTS + 1
    new_ids = live.ids[-rows.shape[0] :]
    expected = [{"g": i % 3, "note": f"n{i}"} if i % 2 else {"g": 1, "note": None} for i in range(rows.shape[0])]
    assert loaded.records(new_ids) == expected == live.records(new_ids)
    assert loaded.records([0]) == [{"g": 0, "note": None}]
    got = loaded.search(QUERIES, 400, where={"note": "n5"})[1][:, 0]
    assert (got == new_ids[5]).all()


def test_compaction_triggers_on_segment_bytes(saved, tmp_path, monkeypatch):
    import hubless.index.directory as index_module  # the commit thresholds are the directory's

    path = _copy(saved, "Flat", tmp_path)
    live = hubless.Index.open(path)
    live.add(QUERIES[:1], [{"g": 1, "text": "x" * 2000}])
    assert live.storage()["segments"] == 1
    monkeypatch.setattr(index_module, "COMPACT_MIN_BYTES", 1000)
    monkeypatch.setattr(index_module, "COMPACT_FRACTION", 0.0)
    live.add(QUERIES[1:2], [{"g": 1}])  # the segments hold more bytes than allowed: a new base
    assert live.storage()["segments"] == 0 and live.storage()["rows_since_base"] == 0
    assert hubless.Index.load(path).records(live.ids[-2:])[0]["text"] == "x" * 2000


def test_a_mapped_faiss_index_is_known_as_a_view_even_with_empty_lists(tmp_path):
    """A view of a mapped file cannot be changed (FAISS aborts the process): a compaction must
    copy it, so it must be recognised, also when its first lists are empty (never views)."""
    import faiss

    from hubless.index.faiss_build import owns_data

    rows = unit_rows(np.random.default_rng(3), 2000, DIM)
    index = faiss.index_factory(DIM, "IVF8,Flat", faiss.METRIC_INNER_PRODUCT)
    index.train(rows)
    _, lists = faiss.extract_index_ivf(index).quantizer.search(rows, 1)
    index.add(rows[lists[:, 0] > 1])  # lists 0 and 1 stay empty
    faiss.write_index(index, str(tmp_path / "ivf.faiss"))
    mapped = faiss.read_index(str(tmp_path / "ivf.faiss"), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY)
    assert owns_data(index) and not owns_data(mapped)
    hnsw = faiss.index_factory(DIM, "HNSW8", faiss.METRIC_INNER_PRODUCT)
    hnsw.add(rows[:100])
    faiss.write_index(hnsw, str(tmp_path / "hnsw.faiss"))
    assert not owns_data(faiss.read_index(str(tmp_path / "hnsw.faiss"), faiss.IO_FLAG_MMAP_IFC | faiss.IO_FLAG_READ_ONLY))
