"""Work files that say what they hold and prove it (issue 33): every kept tile of a distributed
fit and every [r, bias] part records its key and a sha256; a rerun checks both, recomputes a
truncated, emptied, altered or swapped file with one warning line naming it, and never lets a
BadZipFile or EOFError reach the caller. A finished output's parts are checked on every rerun."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless.distributed as hd
from hubless.corrections import make_correction
from hubless.storage.workfiles import RecomputedWarning, job_id, load_arrays, save_arrays
from tests.conftest import unit_rows

# ---------------------------------------------------------------- the file format, without Ray


def _arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {"query_topk": rng.standard_normal((50, 4)).astype(np.float32), "sizes": np.array([50, 900, -1])}


def test_a_work_file_round_trips_and_names_what_it_is(tmp_path):
    path = tmp_path / "t.npz"
    save_arrays(path, _arrays(), {"tile": "query-g0-50-b0-900", "fit": "abc"})
    got, why = load_arrays(path, {"tile": "query-g0-50-b0-900", "fit": "abc"})
    assert why is None and got.keys() == _arrays().keys()
    np.testing.assert_array_equal(got["query_topk"], _arrays()["query_topk"])
    assert load_arrays(tmp_path / "none.npz", {"tile": "x"}) == (None, None)  # missing: computed, nothing to say
    _, why = load_arrays(path, {"tile": "query-g50-100-b0-900", "fit": "abc"})
    assert why == "holds tile query-g0-50-b0-900, fit abc, not tile query-g50-100-b0-900, fit abc"
    _, why = load_arrays(path, {"tile": "query-g0-50-b0-900", "fit": "other"})
    assert why.startswith("holds tile query-g0-50-b0-900, fit abc, not")


@settings(max_examples=60, deadline=None)
@given(cut=st.integers(0, 3000), flips=st.lists(st.integers(0, 10**6), max_size=3), bit=st.integers(0, 7))
def test_a_damaged_work_file_is_refused_never_raised_never_read(tmp_path_factory, cut, flips, bit):
    """Truncated anywhere or with bits flipped anywhere: load says why (or, for a flip in the
    zip's slack, returns the intact arrays), and never raises."""
    path = tmp_path_factory.mktemp("w") / "t.npz"
    key = {"tile": "t", "fit": "f"}
    save_arrays(path, _arrays(), key)
    raw = bytearray(path.read_bytes())
    raw = raw[: min(cut, len(raw))] if cut < len(raw) else raw
    for f in flips:
        if raw:
            raw[f % len(raw)] ^= 1 << bit
    path.write_bytes(bytes(raw))
    got, why = load_arrays(path, key)
    if got is not None:  # only if every array is exactly as written
        assert why is None
        for name, values in _arrays().items():
            np.testing.assert_array_equal(got[name], values)
    else:
        assert why


def test_a_plain_npz_without_a_record_is_not_taken(tmp_path):
    np.savez(tmp_path / "t.npz", **_arrays())
    _, why = load_arrays(tmp_path / "t.npz", {"tile": "t"})
    assert "no record" in why


# ---------------------------------------------------------------- tiles of a fit, on Ray


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(13)
    data = {"gallery": unit_rows(rng, 700, 16), "bank": unit_rows(rng, 2500, 16), "queries": unit_rows(rng, 40, 16)}
    for name, cuts in (("gallery", [250, 600]), ("bank", [1000])):
        folder = tmp_path / name
        folder.mkdir()
        bounds = [0, *cuts, len(data[name])]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            np.save(folder / f"part_{i}.npy", data[name][a:b])
        data[f"{name}_dir"] = folder
    return data


def _flip(path, offset_from_end=200):
    raw = bytearray(path.read_bytes())
    raw[len(raw) - offset_from_end] ^= 0x10
    path.write_bytes(bytes(raw))


def _recomputed(record) -> dict[str, str]:
    """{file name: reason} of the RecomputedWarnings caught."""
    out = {}
    for w in record:
        if issubclass(w.category, RecomputedWarning):
            text = str(w.message)
            name = text.split()[2].rsplit("/", 1)[-1]
            assert name not in out, f"two lines for {name}"
            out[name] = text
    return out


def test_damaged_or_swapped_tiles_are_recomputed_saying_so(ray_local, shards, tmp_path):
    d, work = shards, tmp_path / "work"
    args = ("dis:k_activation=2", d["gallery_dir"], d["bank_dir"])
    options = {"gallery_rows": 256, "bank_cols": 1000, "work_dir": work, "progress": False}
    first = hd.fit(*args, **options)
    tiles = sorted((work / "tiles").glob("*.npz"))
    assert len(tiles) == 9
    truncated, emptied, flipped, swapped, foreign = tiles[0], tiles[2], tiles[4], tiles[5], tiles[7]
    truncated.write_bytes(truncated.read_bytes()[:-500])
    emptied.write_bytes(b"")
    _flip(flipped)
    shutil.copy(tiles[3], swapped)  # another tile's valid file, same shapes
    other_data = shutil.copytree(d["gallery_dir"], tmp_path / "other_gallery")  # the same tile of a fit on other data
    np.save(other_data / "part_2.npy", unit_rows(np.random.default_rng(1), 100, 16))
    hd.fit(args[0], other_data, args[2], **{**options, "work_dir": tmp_path / "other"})
    shutil.copy(tmp_path / "other" / "tiles" / foreign.name, foreign)
    kept = {t.name: t.stat().st_mtime_ns for t in tiles if t not in (truncated, emptied, flipped, swapped, foreign)}
    (work / "plan.json").write_text('{"format": 2, "requ')  # damaged too: rewritten, tiles checked one by one
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = hd.fit(*args, **options)
    lines = _recomputed(record)
    assert set(lines) == {"plan.json", truncated.name, emptied.name, flipped.name, swapped.name, foreign.name}, lines
    assert "is damaged (truncated or unreadable" in lines[truncated.name] and "is damaged" in lines[emptied.name]
    assert "damaged" in lines[flipped.name] or "checksum" in lines[flipped.name]
    assert f"holds tile {tiles[3].stem}" in lines[swapped.name] and "not tile " + swapped.stem in lines[swapped.name]
    assert f"holds tile {foreign.stem}, fit " in lines[foreign.name]  # the same tile, of another fit
    assert all(line.endswith("recomputing it") for line in lines.values())
    assert {t.name: t.stat().st_mtime_ns for t in tiles if t.name in kept} == kept  # intact tiles were reused
    np.testing.assert_array_equal(again.bias_columns_, first.bias_columns_)
    np.testing.assert_array_equal(again.statistics_.query_activation, first.statistics_.query_activation)
    with warnings.catch_warnings(record=True) as record:  # now every file is intact: nothing to say
        warnings.simplefilter("always")
        hd.fit(*args, **options)
    assert not _recomputed(record)


def test_a_work_dir_of_an_older_format_is_recomputed_saying_so(ray_local, shards, tmp_path):
    """Format 2 kept each tile's log-sum-exps as logs; format 3 keeps per-block sums: no old tile
    is reused (plan.json rewritten, each tile recomputed with its own line), none refused."""
    d, work = shards, tmp_path / "work"
    args = ("is:beta=20.0", d["gallery_dir"], d["bank_dir"])
    options = {"gallery_rows": 256, "bank_cols": 1000, "work_dir": work, "progress": False}
    first = hd.fit(*args, **options)
    old_plan = {**json.loads((work / "plan.json").read_text()), "format": 2}
    (work / "plan.json").write_text(json.dumps(old_plan))
    for tile in (work / "tiles").glob("*.npz"):  # as format 2 kept them: the fit's id was of its plan
        arrays, _ = load_arrays(tile, {"tile": tile.stem, "fit": job_id({**old_plan, "format": 3})})
        save_arrays(tile, arrays, {"tile": tile.stem, "fit": job_id(old_plan)})
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        again = hd.fit(*args, **options)
    lines = _recomputed(record)
    assert "is of work format 2, not 3" in lines.pop("plan.json")
    assert set(lines) == {t.name for t in (work / "tiles").glob("*.npz")} and all("holds tile" in v for v in lines.values())
    np.testing.assert_array_equal(again.bias_columns_, first.bias_columns_)


# ---------------------------------------------------------------- [r, bias] parts


def _parts(out):
    info = json.loads((out / "hubless.json").read_text())
    return np.concatenate([np.load(out / p["file"]) for p in info["parts"]])


def test_a_finished_output_is_checked_on_rerun_and_damaged_parts_rewritten(ray_local, shards, tmp_path):
    d, out = shards, tmp_path / "out"
    args = ("nnn:k=4", d["gallery_dir"], d["bank_dir"], None, out)
    hd.write_augmented(*args, shard_rows=150, progress=False)
    want = _parts(out)
    info = json.loads((out / "hubless.json").read_text())
    assert info["complete"] and all(len(p["sha256"]) == 64 for p in info["parts"])
    assert not list(out.glob("*.npy.json"))  # the records moved into hubless.json
    files = [out / p["file"] for p in info["parts"]]
    assert len(files) == 5
    _flip(files[0], 100)  # a value altered (an exponent bit: off by orders of magnitude), header intact
    files[1].write_bytes(files[1].read_bytes()[:-64])  # truncated
    files[2].write_bytes(files[2].read_bytes().replace(files[2].read_bytes(), files[3].read_bytes()))  # another part's rows
    kept = files[4].stat().st_mtime_ns
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hd.write_augmented(*args, shard_rows=150, progress=False)
    lines = _recomputed(record)
    assert set(lines) == {files[0].name, files[1].name, files[2].name}, lines
    assert all("does not match its recorded checksum" in line for line in lines.values())
    assert files[4].stat().st_mtime_ns == kept
    np.testing.assert_array_equal(_parts(out), want)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hd.write_augmented(*args, shard_rows=150, progress=False)
    assert not _recomputed(record)


def test_an_interrupted_output_keeps_the_parts_its_records_vouch_for(ray_local, shards, tmp_path):
    """A run that stops at its last part leaves the others with their own records (key +
    sha256) and no finished hubless.json; the rerun keeps the parts those records vouch for."""
    import cloudpickle

    import tests._dying_source as sources
    from hubless.storage.sources import open_source

    cloudpickle.register_pickle_by_value(sources)  # the workers get the class by value
    d, out = shards, tmp_path / "out"
    g = open_source(d["gallery_dir"])
    failing = sources.FailsOnRows(g.shards, g.dim, g.kind, fail_start=600, fail_stop=700)
    with pytest.raises(OSError, match=r"rows \[600, 700\) could not be read"):
        hd.write_augmented("is:beta=20.0", failing, d["bank_dir"], None, out, shard_rows=150, progress=False)
    info = json.loads((out / "hubless.json").read_text())
    files = [out / p["file"] for p in info["parts"]]
    assert not info["complete"] and not files[4].exists()
    assert all((out / f"{f.name}.json").exists() for f in files[:4])  # each written part has its record
    (out / f"{files[1].name}.json").unlink()  # as if the run had died between a part and its record
    shutil.copy(out / f"{files[0].name}.json", out / f"{files[2].name}.json")  # another part's record
    kept = {f.name: f.stat().st_mtime_ns for f in (files[0], files[3])}
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        hd.write_augmented("is:beta=20.0", d["gallery_dir"], d["bank_dir"], None, out, shard_rows=150, progress=False)
    lines = _recomputed(record)
    assert set(lines) == {files[1].name, files[2].name}, lines
    assert "has no recorded checksum" in lines[files[1].name]
    assert "is recorded as part part_00000.npy, rows [0, 150]" in lines[files[2].name]
    assert {f.name: f.stat().st_mtime_ns for f in (files[0], files[3])} == kept
    want = make_correction("is:beta=20.0").fit(d["gallery"], d["bank"])
    np.testing.assert_allclose(_parts(out), np.hstack([want.gallery_, want.bias_columns_]), rtol=1e-6, atol=1e-6)
    info = json.loads((out / "hubless.json").read_text())
    assert info["complete"] and not list(out.glob("*.npy.json"))


def test_the_cli_reports_each_recomputed_part_and_succeeds(ray_local, shards, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    d, out = shards, tmp_path / "out"
    args = ["augment", "--gallery", str(d["gallery_dir"]), "--query-bank", str(d["bank_dir"]), "--out", str(out)]
    args += ["--method", "nnn:k=4", "--shard-rows", "400", "--no-progress"]
    assert CliRunner().invoke(app, args).exit_code == 0
    part = out / "part_00001.npy"
    part.write_bytes(part.read_bytes()[:-10])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert f"warning: work file {part} does not match its recorded checksum (truncated or altered): recomputing it" in result.output
    want = make_correction("nnn:k=4").fit(d["gallery"], d["bank"])
    np.testing.assert_allclose(_parts(out), np.hstack([want.gallery_, want.bias_columns_]), rtol=1e-6, atol=1e-6)
