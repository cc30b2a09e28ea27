"""Saved indexes survive faults and concurrent writers: a write adds one segment and switches
CURRENT atomically, nothing existing is rewritten, a write lock serialises writers, the manifest
is checksummed and validated, and no path outside the index is ever opened."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import hubless
from hubless.index import integrity, pointer
from tests.conftest import unit_rows


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(7)
    return {"gallery": unit_rows(rng, 200, 16), "bank": unit_rows(rng, 300, 16), "new": [unit_rows(rng, 5, 16) for _ in range(6)]}


@pytest.fixture()
def saved(arrays, tmp_path):
    index = hubless.Index.build(arrays["gallery"], arrays["bank"], "nnn:alpha=0.5,k=8", "Flat", metadata={"n": list(range(200))})
    return index, index.save(tmp_path / "idx")


def read_current(path):
    header, manifest = (path / "CURRENT").read_text().splitlines()
    return {**json.loads(header), "manifest": json.loads(manifest)}


def write_manifest(path, manifest):
    """Replace CURRENT's manifest, with a matching checksum (as a tamperer with write access could)."""
    text = json.dumps(manifest)
    header = {"format": "hubless-index", "format_version": 5, "manifest_sha256": hashlib.sha256(text.encode()).hexdigest()}
    (path / "CURRENT").write_text(json.dumps(header) + "\n" + text + "\n")


def snapshot_files(path):
    return {str(f.relative_to(path)): (f.stat().st_mtime_ns, f.read_bytes()) for f in sorted(path.rglob("*")) if f.is_file()}


def test_a_write_adds_one_segment_and_changes_no_existing_file(saved, arrays):
    _, path = saved
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "b000001"]
    before = snapshot_files(path)
    live = hubless.Index.open(path)
    ids = live.add(arrays["new"][0], {"n": [1000 + i for i in range(5)]})
    assert ids.tolist() == [200, 201, 202, 203, 204]
    after = snapshot_files(path)
    assert set(after) - set(before) == {"s000002.seg"}
    assert {k for k in before if before[k] != after.get(k)} == {"CURRENT"}  # nothing else rewritten
    assert (path / "s000002.seg").stat().st_size < 8000
    live.remove([3, 200])
    live.upsert([5], arrays["new"][1][:1], [{"n": -5}])
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "b000001", "s000002.seg", "s000003.seg", "s000004.seg"]
    loaded = hubless.Index.load(path)
    assert loaded.ntotal == 203 and 3 not in loaded and 5 in loaded and loaded.records([5, 204]) == [{"n": -5}, {"n": 1004}]
    np.testing.assert_array_equal(loaded.ids, live.ids)
    live.compact()  # the previous version's files stay for one more commit (readers that loaded it)
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "b000001", "b000005", "s000002.seg", "s000003.seg", "s000004.seg"]
    live.add(arrays["new"][2])
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "b000005", "s000006.seg"]
    np.testing.assert_array_equal(hubless.Index.load(path).ids, live.ids)


def test_segments_fold_and_the_index_compacts_past_the_thresholds(saved, arrays, monkeypatch):
    from hubless.index import directory as index_module  # the commit thresholds are the directory's

    _, path = saved
    monkeypatch.setattr(index_module, "MAX_SEGMENTS", 3)
    monkeypatch.setattr(index_module, "COMPACT_MIN_ROWS", 12)
    monkeypatch.setattr(index_module, "COMPACT_FRACTION", 0.0)
    live = hubless.Index.open(path)
    for i in range(3):
        live.add(arrays["new"][i][:1])
    assert [s["name"] for s in pointer.read_manifest(path)[0]["segments"]] == ["s000002.seg", "s000003.seg", "s000004.seg"]
    live.add(arrays["new"][3][:1])  # a 4th segment: the 4 writes folded into one
    manifest = pointer.read_manifest(path)[0]
    assert [s["name"] for s in manifest["segments"]] == ["s000005.seg"] and manifest["segments"][0]["rows"] == 4
    live.add(np.concatenate(arrays["new"][4:]))  # 14 rows since the base > 12: a new base
    manifest = pointer.read_manifest(path)[0]
    assert manifest["segments"] == [] and manifest["base"]["rows"] == 214
    assert hubless.Index.load(path).ntotal == 214


def test_concurrent_writers_never_lose_a_batch(saved, arrays, tmp_path):
    _, path = saved
    files = []
    for i, batch in enumerate(arrays["new"]):
        np.save(tmp_path / f"new{i}.npy", batch)
        files.append(tmp_path / f"new{i}.npy")
    procs = [
        subprocess.Popen([sys.executable, "-m", "hubless", "index", "add", str(path), "--embeddings", str(f), "--no-progress"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for f in files
    ]  # fmt: skip
    given = {}
    for f, p in zip(files, procs):
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0, out
        line = next(line for line in out.splitlines() if line.startswith("added"))
        given[f] = [int(v) for v in line.split("ids ")[1].split(", ")]
    loaded = hubless.Index.load(path)
    assert loaded.ntotal == 200 + 5 * len(files)
    assert sorted(i for ids in given.values() for i in ids) == list(range(200, 200 + 5 * len(files)))  # each id once
    for f, ids in given.items():  # every batch made it in, under the ids its writer printed
        np.testing.assert_allclose(loaded.get(ids).embeddings, np.load(f), atol=1e-6)


def test_a_second_writer_times_out_clearly(saved):
    _, path = saved
    with hubless.Index.update(path):
        with pytest.raises(TimeoutError, match="another process"):
            with hubless.Index.update(path, timeout=0.2):
                pass


def test_update_saves_nothing_when_the_block_fails(saved, arrays):
    _, path = saved
    before = (path / "CURRENT").read_bytes()
    with pytest.raises(RuntimeError):
        with hubless.Index.update(path) as index:
            index.add(arrays["new"][0])
            raise RuntimeError("changed my mind")
    assert (path / "CURRENT").read_bytes() == before
    assert hubless.Index.load(path).ntotal == 200


KILL_SCRIPT = """
import sys, numpy as np, hubless
path, seed = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(seed)
index = hubless.Index.open(path)
for i in range(100000):
    x = rng.standard_normal((3, 16)).astype(np.float32)
    if i % 7 == 6:
        index.compact()
        print("compacted", flush=True)
    elif i % 5 == 4:
        gone = index.remove(index.ids[:1])
        print("removed", int(gone[0]), flush=True)
    else:
        ids = index.add(x / np.linalg.norm(x, axis=1, keepdims=True), {"n": [-1, -1, -1]})
        print("added", " ".join(map(str, ids)), flush=True)
"""


@pytest.mark.slow
def test_kill_at_random_points_loses_no_acknowledged_write(saved, tmp_path):
    """kill -9 a writer at random moments of its writes (segments, removals, compactions): the
    index always loads, holds every write the writer acknowledged (and maybe the one it was
    making), and the next writer proceeds (no stale lock)."""
    _, path = saved
    script = tmp_path / "writer.py"
    script.write_text(KILL_SCRIPT)
    rng = random.Random(0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    present, gone = set(range(200)), set()
    for trial in range(12):
        proc = subprocess.Popen([sys.executable, str(script), str(path), str(trial)], stdout=subprocess.PIPE, text=True, env=env)
        time.sleep(rng.uniform(0.8, 2.5))  # start-up takes ~0.7 s: kills land in loads, writes and compactions
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate()
        for line in out.splitlines(keepends=True):
            if not line.endswith("\n"):  # cut short by the kill: not acknowledged (the write in flight)
                continue
            words = line.split()
            if words and words[0] == "added":
                present |= {int(v) for v in words[1:]}
            elif words and words[0] == "removed":
                present.discard(int(words[1]))
                gone.add(int(words[1]))
        loaded = hubless.Index.load(path)
        ids = set(loaded.ids.tolist())
        # every acknowledged write is there; the one in flight may or may not be (one removal, or one add of 3)
        assert len(present - ids) <= 1 and len(ids - present) <= 3, (trial, sorted(present - ids)[:5], sorted(ids - present)[:5])
        assert not (ids & gone), trial
        assert len(loaded.metadata) == loaded.ntotal and integrity.verify(path)["items"] == loaded.ntotal
        present = ids
    with hubless.Index.update(path, timeout=5):  # the killed writers' locks are gone
        pass
    assert len([p for p in path.iterdir() if p.name.startswith("b")]) <= 2


def test_interrupted_write_leftovers_are_cleaned(saved, arrays):
    index, path = saved
    (path / ".tmp-crashed").mkdir()
    (path / "s000007.seg").write_bytes(b"partial segment of a killed writer")
    shutil.copytree(path / "b000001", path / "b000009")  # written but never made current
    (path / ".CURRENT.abc.tmp").write_text("{")
    assert hubless.Index.load(path).ntotal == 200  # CURRENT still names b000001
    hubless.Index.open(path).add(arrays["new"][0])
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "b000001", "s000010.seg"]  # numbers never reused


def _load_outcome(path):
    try:
        return hubless.Index.load(path).info()
    except ValueError as exc:  # the only acceptable failure: a clear message
        assert "Traceback" not in str(exc) and len(str(exc)) < 400
        return None


@pytest.mark.slow
def test_every_single_bit_flip_of_current_is_caught(saved, arrays):
    index, path = saved
    hubless.Index.open(path).add(arrays["new"][0], {"n": [1, 2, 3, 4, 5]})  # a manifest with a segment
    file = path / "CURRENT"
    original = file.read_bytes()
    expected = hubless.Index.load(path).info()
    for i in range(len(original) * 8):
        raw = bytearray(original)
        raw[i // 8] ^= 1 << (i % 8)
        file.write_bytes(bytes(raw))
        assert _load_outcome(path) is None, i  # the manifest's own checksum refuses every flip
    file.write_bytes(original)
    assert hubless.Index.load(path).info() == expected


def test_manifest_paths_outside_the_index_are_refused(saved):
    _, path = saved
    manifest = read_current(path)["manifest"]
    manifest["base"]["files"]["../../../../etc/passwd"] = {"sha256": "0" * 64, "bytes": 1}
    write_manifest(path, manifest)
    with pytest.raises(ValueError, match="unexpected file name") as err:
        hubless.Index.load(path)
    assert "bytes" not in str(err.value) and "root:" not in str(err.value)
    manifest["base"]["files"].pop("../../../../etc/passwd")
    manifest["segments"] = [{"name": "../s000001.seg", "rows": 1, "sha256": "0" * 64, "bytes": 1}]
    write_manifest(path, manifest)
    with pytest.raises(ValueError, match="segment entry is invalid"):
        hubless.Index.load(path)


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m.update(method="nnn:alpha=-1"), "alpha"),
        (lambda m: m.update(method="gc"), "cannot be served"),
        (lambda m: m.update(dim=-3), "dim"),
        (lambda m: m.update(normalize="yes"), "normalize"),
        (lambda m: m["config"].update(nprobe=0), "nprobe"),
        (lambda m: m["config"].update(rescore_factor=0), "rescore_factor"),
        (lambda m: m["base"].update(files=[]), "files"),
        (lambda m: m["base"]["files"]["gallery.npy"].update(sha256="x"), "gallery.npy"),
        (lambda m: m["base"]["files"].pop("ids.npy"), "ids.npy"),
        (lambda m: m.update(n_items=5), "5 in"),
        (lambda m: m.update(metadata_schema="bm90IGEgc2NoZW1h"), "metadata_schema"),
    ],
)
def test_manifest_fields_are_validated(saved, edit, match):
    _, path = saved
    manifest = read_current(path)["manifest"]
    edit(manifest)
    write_manifest(path, manifest)
    with pytest.raises(ValueError, match=match):
        hubless.Index.load(path)


@pytest.mark.parametrize(
    "content", [b"", b"[]", b'{"format": "hubless-index", "format_version": 5, "manifest_sha256": "0"}\n{}', b"\xff\xfe"]
)
def test_corrupt_pointer(saved, content):
    _, path = saved
    (path / "CURRENT").write_bytes(content)
    with pytest.raises(ValueError, match="CURRENT"):
        hubless.Index.load(path)


def test_a_missing_base_or_segment(saved, arrays):
    _, path = saved
    hubless.Index.open(path).add(arrays["new"][0])
    (path / "s000002.seg").unlink()
    with pytest.raises(ValueError, match="missing"):
        hubless.Index.load(path)
    shutil.rmtree(path / "b000001")
    with pytest.raises(ValueError, match="missing"):
        hubless.Index.load(path)


def test_only_a_hubless_index_is_ever_replaced(saved, arrays, tmp_path):
    index, _ = saved
    precious = tmp_path / "photos"
    precious.mkdir()
    (precious / "a.jpg").write_bytes(b"family photo")
    with pytest.raises(FileExistsError, match="not a hubless index"):
        index.save(precious, overwrite=True)
    assert (precious / "a.jpg").read_bytes() == b"family photo"
    plain = tmp_path / "notes.txt"
    plain.write_text("keep me")
    with pytest.raises(FileExistsError, match="not a directory"):
        index.save(plain, overwrite=True)
    assert plain.read_text() == "keep me"
    (tmp_path / "empty").mkdir()
    index.save(tmp_path / "empty", overwrite=True)
    assert hubless.Index.load(tmp_path / "empty").ntotal == 200


def write_earlier_format(path, version):
    """The files an index of format 3 or 4 (before live indexes, never released) started with."""
    path.mkdir()
    manifest = json.dumps({"format": "hubless-index", "version": version, "method": "nnn", "n_items": 3}, indent=2)
    folder = path if version == 3 else path / "v000001"
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(manifest)
    (folder / "index.faiss").write_bytes(b"old")
    if version == 4:
        sha = hashlib.sha256(manifest.encode()).hexdigest()
        (path / "CURRENT").write_text(json.dumps({"format": "hubless-index", "version": "v000001", "manifest_sha256": sha}, indent=2))


@pytest.mark.parametrize("version", [3, 4])
def test_an_index_of_an_earlier_format_is_refused_saying_to_rebuild_it(saved, tmp_path, version):
    from typer.testing import CliRunner

    from hubless.cli.main import app
    from hubless.errors import AlreadyExists, Corrupt

    index, _ = saved
    path = tmp_path / "old"
    write_earlier_format(path, version)
    before = snapshot_files(path)
    message = f"index of format {version}, written by an earlier format of hubless; .* rebuild the index"
    for read in (hubless.Index.load, hubless.Index.open, integrity.verify, hubless.Index.versions):
        with pytest.raises(Corrupt, match=message):
            read(path)
    with pytest.raises(Corrupt, match=message), hubless.Index.update(path):
        pass
    result = CliRunner().invoke(app, ["index", "info", str(path)])
    assert result.exit_code == 2 and "rebuild the index" in " ".join(result.output.split())
    with pytest.raises(AlreadyExists, match="overwrite"):
        index.save(path)
    assert snapshot_files(path) == before  # nothing read, nothing written
    index.save(path, overwrite=True)  # the rebuild replaces it, leaving none of its files
    assert sorted(p.name for p in path.iterdir()) == ["CURRENT", "b000001"]
    assert hubless.Index.load(path).ntotal == 200


def test_an_unknown_format_version_is_refused(saved):
    _, path = saved
    header, manifest = (path / "CURRENT").read_text().splitlines()
    (path / "CURRENT").write_text(header.replace('"format_version": 5', '"format_version": 6') + "\n" + manifest + "\n")
    with pytest.raises(ValueError, match="format version 6; this hubless reads version 5"):
        hubless.Index.load(path)


def test_a_part_with_a_matching_checksum_that_cannot_be_read(saved):
    _, path = saved
    (path / "b000001" / "state.npz").write_bytes(b"not an npz at all")
    manifest = read_current(path)["manifest"]
    manifest["base"]["files"]["state.npz"] = {"sha256": hashlib.sha256(b"not an npz at all").hexdigest(), "bytes": 17}
    write_manifest(path, manifest)
    with pytest.raises(ValueError, match="state.npz cannot be read"):
        hubless.Index.load(path)


@pytest.mark.parametrize("target", ["b000001/gallery.npy", "b000001/bias.npy", "s000002.seg", "b000001/metadata.parquet"])
def test_what_a_plain_load_a_mapped_load_and_verify_detect(saved, arrays, target):
    """A plain load verifies the sha256 of every file; a memory-mapped load checks the sizes of
    the mapped files (gallery, statistics, banks, IVF lists) and the checksum of the rest;
    ``verify`` checks every file."""
    _, path = saved
    hubless.Index.open(path).add(arrays["new"][0], {"n": [1, 2, 3, 4, 5]})
    file = path / target
    raw = bytearray(file.read_bytes())
    raw[-3] ^= 0x40  # a flip in the data (not the header)
    file.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="corrupt"):
        hubless.Index.load(path)
    with pytest.raises(ValueError, match="corrupt"):
        integrity.verify(path)
    if target == "b000001/gallery.npy":
        assert hubless.Index.load(path, mmap=True).ntotal == 205  # mapped: read lazily, not hashed
        file.write_bytes(bytes(raw[:-4]))
        with pytest.raises(ValueError, match="truncated"):
            hubless.Index.load(path, mmap=True)  # sizes are always checked
    else:
        with pytest.raises(ValueError, match="corrupt"):
            hubless.Index.load(path, mmap=True)
