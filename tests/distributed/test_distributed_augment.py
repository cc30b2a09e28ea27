"""[r, bias(r)] parts written by Ray tasks (the driver never reads the gallery): they equal the
rows of a single-machine fit, [q, -W(q)] ranks them as the correction does, a rerun keeps the
finished parts, and what cannot be served this way is refused with the reason."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hubless.distributed as hd
from hubless.corrections import make_correction
from hubless.engine.updates import gallery_rows
from tests.conftest import unit_rows

SERVED = ["nnn:alpha=0.75,k=5", "dn:lam=0.4", "is:beta=20.0", "dualis", "baseline"]


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(31)
    data = {"gallery": unit_rows(rng, 900, 20), "query_bank": unit_rows(rng, 1500, 20), "gallery_bank": unit_rows(rng, 700, 20)}
    data["queries"] = unit_rows(rng, 60, 20)
    for name, cuts in (("gallery", [300, 310, 640]), ("query_bank", [800]), ("gallery_bank", [200])):
        folder = tmp_path / name
        folder.mkdir()
        bounds = [0, *cuts, len(data[name])]
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            np.save(folder / f"part_{i}.npy", data[name][a:b])
        data[f"{name}_dir"] = folder
    return data


def _parts(out) -> np.ndarray:
    info = json.loads((out / "hubless.json").read_text())
    return np.concatenate([np.load(out / p["file"]) for p in info["parts"]])


@pytest.mark.parametrize("spec", SERVED)
def test_parts_equal_the_rows_of_a_single_machine_fit_and_rank_as_it_does(ray_local, shards, spec, tmp_path):
    d = shards
    out = hd.write_augmented(
        spec, d["gallery_dir"], d["query_bank_dir"], d["gallery_bank_dir"], tmp_path / "out", shard_rows=250, bank_cols=600, progress=False
    )
    want = make_correction(spec).fit(d["gallery"], d["query_bank"], d["gallery_bank"])
    rows = _parts(out)
    np.testing.assert_allclose(rows, np.hstack([want.gallery_, want.bias_columns_]), rtol=1e-6, atol=1e-6)
    info = json.loads((out / "hubless.json").read_text())
    assert info["complete"] and [p["stop"] - p["start"] for p in info["parts"]] == [250, 250, 250, 150]
    xq = hd.augmented_queries(out, d["queries"])
    ids = np.argsort(-(xq @ rows.T), axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(ids, want.search(d["queries"], 10)[1])
    if want.weight_param:  # the weight can change per call, as with Index.search
        xq = hd.augmented_queries(out, d["queries"], weight=0.2)
        ids = np.argsort(-(xq @ rows.T), axis=1, kind="stable")[:, :10]
        np.testing.assert_array_equal(ids, want.search(d["queries"], 10, weight=0.2)[1])


def test_a_rerun_keeps_the_finished_parts(ray_local, shards, tmp_path):
    d, out = shards, tmp_path / "out"
    args = ("nnn:k=4", d["gallery_dir"], d["query_bank_dir"], None, out)
    hd.write_augmented(*args, shard_rows=300, progress=False)
    first = _parts(out)
    (out / "part_00001.npy").unlink()  # as if the run had died before this part
    info = json.loads((out / "hubless.json").read_text())
    (out / "hubless.json").write_text(json.dumps({**info, "complete": False}))
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("part_*.npy")}
    hd.write_augmented(*args, shard_rows=300, progress=False)
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("part_*.npy") if p.name in kept} == kept
    np.testing.assert_array_equal(_parts(out), first)
    with pytest.raises(ValueError, match="holds parts of another fit"):
        hd.write_augmented(*args, shard_rows=200, progress=False)


def test_what_cannot_be_served_as_rows_is_refused_before_any_work(shards, tmp_path):
    d = shards
    for spec in ("dis", "csls", "gc", "dualdis"):
        with pytest.raises(ValueError, match="cannot be served as \\[r, bias\\] rows"):
            hd.write_augmented(spec, d["gallery_dir"], d["query_bank_dir"], d["gallery_bank_dir"], tmp_path / spec)
        assert not (tmp_path / spec).exists()
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not written by write_augmented"):
        hd.write_augmented("nnn", d["gallery_dir"], d["query_bank_dir"], None, tmp_path / "busy")
    with pytest.raises(ValueError, match="no complete output"):
        hd.augmented_queries(tmp_path / "busy", d["queries"])


def test_a_slice_of_the_statistics_keeps_the_global_values(shards):
    d = shards
    stats = make_correction("dn").fit(d["gallery"], d["query_bank"]).statistics_
    part = gallery_rows(stats, 100, 250)
    assert part.n_gallery == 150 and part.n_query_bank == stats.n_query_bank
    np.testing.assert_array_equal(part.gallery_mean, stats.gallery_mean)  # the whole gallery's, as DN needs
    with pytest.raises(ValueError, match="not within"):
        gallery_rows(stats, 100, 901)


def test_augment_from_the_cli(ray_local, shards, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    d, out = shards, tmp_path / "out"
    args = ["augment", "--gallery", str(d["gallery_dir"]), "--query-bank", str(d["query_bank_dir"]), "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--method", "is:beta=20.0", "--shard-rows", "400", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "wrote 900 items (is:beta=20.0" in result.output and "3 part(s) of 20 + 1 columns" in result.output
    want = make_correction("is:beta=20.0").fit(d["gallery"], d["query_bank"])
    np.testing.assert_allclose(_parts(out), np.hstack([want.gallery_, want.bias_columns_]), rtol=1e-6, atol=1e-6)
    refused = CliRunner().invoke(app, [*args, "--method", "csls"])
    assert refused.exit_code == 2 and "cannot be served as [r, bias] rows" in refused.output
