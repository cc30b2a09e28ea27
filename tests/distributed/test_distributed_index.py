"""Distributed index building (issues 20, 33): the tasks write the index directory (rows, biases,
statistics, inverted lists of their shard), the driver only streams the lists into index.faiss
and commits; the directory loads (memory-mapped or not) and searches exactly as a
single-machine build."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import hubless.distributed as hd
from hubless.index import Index
from tests.conftest import ivf_lists, unit_rows


@pytest.fixture
def shards(tmp_path):
    rng = np.random.default_rng(21)
    gallery, bank, queries = unit_rows(rng, 3000, 16), unit_rows(rng, 2000, 16), unit_rows(rng, 100, 16)
    folder = tmp_path / "gallery"
    folder.mkdir()
    for i, (a, b) in enumerate([(0, 1000), (1000, 2200), (2200, 3000)]):
        np.save(folder / f"part_{i}.npy", gallery[a:b])
    np.save(tmp_path / "bank.npy", bank)
    return gallery, bank, queries, folder, tmp_path / "bank.npy"


@pytest.mark.parametrize(
    ("method", "factory"), [("dis:k_activation=2", "Flat"), ("dis:k_activation=2", "IVF32,Flat"), ("nnn:k=8", "IVF16,PQ4x4")]
)
def test_a_distributed_build_writes_the_index_a_single_machine_build_saves(ray_local, shards, method, factory, tmp_path):
    gallery, bank, queries, folder, bank_file = shards
    records = [{"n": i, "even": i % 2 == 0} for i in range(len(gallery))]
    out = tmp_path / "idx"
    # the default tiles give the in-process statistics bit for bit; 700-row shards cut the rows and lists
    built = hd.build_index(method, folder, bank_file, factory, out=out, metadata=records, shard_rows=700, progress=False)
    single = Index.build(gallery, bank, method, factory, metadata=records)
    want = single.search(queries, 10)
    for index in (built, Index.load(out), Index.load(out, mmap=True)):  # the returned one is mapped; a full load verifies every sha256
        got = index.search(queries, 10)
        np.testing.assert_array_equal(got[1], want[1])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(index.ids, single.ids)
        assert index.records([5, 2999]) == single.records([5, 2999])
        np.testing.assert_array_equal(
            index.search(queries, 10, where={"even": True})[1], single.search(queries, 10, where={"even": True})[1]
        )
    snap, want_snap = Index.load(out)._snap, single._snap
    np.testing.assert_array_equal(snap.base_rows, want_snap.base_rows)  # the rows as written by the tasks
    np.testing.assert_array_equal(snap.bias, want_snap.bias)
    assert snap.stats_base.keys() == want_snap.stats_base.keys()
    for name in snap.stats_base:
        np.testing.assert_array_equal(snap.stats_base[name], want_snap.stats_base[name])
    np.testing.assert_allclose(snap.gallery_sum, want_snap.gallery_sum, rtol=1e-12)
    assert isinstance(built._snap.base_rows, np.memmap)  # the driver maps the gallery, never reads it
    if factory != "Flat":  # every inverted list holds the same codes and ids, in the same order
        assert snap.config.spill_below == want_snap.config.spill_below
        for (codes, ids), (want_codes, want_ids) in zip(ivf_lists(snap.faiss), ivf_lists(want_snap.faiss), strict=True):
            np.testing.assert_array_equal(ids, want_ids)
            np.testing.assert_array_equal(codes, want_codes)
    assert sorted(p.name for p in out.iterdir()) == ["CURRENT", "b000001"]  # no work file left
    from hubless.index.integrity import verify

    assert verify(out)["items"] == len(gallery)
    info = built.info()  # it keeps no banks, but says which bank its biases come from
    assert (info["n_query_bank"], info["banks_kept"]) == (2000, False)
    assert (single.info()["n_query_bank"], single.info()["banks_kept"]) == (2000, True)


def test_without_out_the_index_is_returned_in_memory(ray_local, shards, tmp_path):
    gallery, bank, queries, folder, bank_file = shards
    built = hd.build_index("nnn:k=8", folder, bank_file, "IVF32,Flat", shard_rows=1000, progress=False)
    assert built._path is None and not isinstance(built._snap.base_rows, np.memmap)
    with pytest.raises(ValueError, match="load=False returns the index's directory: pass out="):
        hd.build_index("nnn:k=8", folder, bank_file, "Flat", load=False)
    want = Index.build(gallery, bank, "nnn:k=8", "IVF32,Flat")
    np.testing.assert_array_equal(built.search(queries, 10)[1], want.search(queries, 10)[1])
    again = Index.load(built.save(tmp_path / "idx"))  # it saves and loads like any index
    np.testing.assert_array_equal(again.search(queries, 10)[1], want.search(queries, 10)[1])


def test_overwrite_replaces_an_index_in_one_switch_and_a_failure_leaves_it(ray_local, shards, tmp_path):
    from hubless.errors import AlreadyExists

    gallery, bank, queries, folder, bank_file = shards
    out = tmp_path / "idx"
    Index.build(gallery[:500], bank, "nnn:k=8", "Flat").save(out)
    with pytest.raises(AlreadyExists):
        hd.build_index("nnn:k=8", folder, bank_file, "Flat", out=out, progress=False)
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    rows = np.load(bad / "part_2.npy")
    rows[5] = np.nan
    np.save(bad / "part_2.npy", rows)
    with pytest.raises(ValueError, match="part_2.npy"):  # fails in a task: the old index stays, nothing is left beside it
        hd.build_index("nnn:k=8", bad, bank_file, "Flat", out=out, overwrite=True, progress=False)
    assert Index.load(out).ntotal == 500 and sorted(p.name for p in out.iterdir()) == ["CURRENT", "b000001"]
    assert hd.build_index("nnn:k=8", folder, bank_file, "Flat", out=out, overwrite=True, load=False, progress=False) == out
    built = Index.load(out)
    assert built.ntotal == 3000
    assert sorted(p.name for p in out.iterdir()) == ["CURRENT", "b000001", "b000002"]  # the previous base is kept for its readers
    np.testing.assert_array_equal(built.search(queries, 10)[1], Index.build(gallery, bank, "nnn:k=8", "Flat").search(queries, 10)[1])


def test_hnsw_is_refused_with_the_reason(ray_local, shards):
    _, _, _, folder, bank_file = shards
    with pytest.raises(ValueError, match="HNSW graph cannot be merged"):
        hd.build_index("nnn", folder, bank_file, "HNSW32", progress=False)


def test_index_build_with_ray_from_the_cli(ray_local, shards, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    gallery, bank, queries, folder, bank_file = shards
    out = tmp_path / "idx"
    args = ["index", "build", "--gallery", str(folder), "--query-bank", str(bank_file), "--out", str(out), "--ray"]
    result = CliRunner().invoke(app, [*args, "--method", "nnn:k=8", "--factory", "IVF32,Flat", "--work-dir", str(tmp_path / "w")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "w" / "tiles").is_dir()
    want = Index.build(gallery, bank, "nnn:k=8", "IVF32,Flat")
    np.testing.assert_array_equal(Index.load(out).search(queries, 10)[1], want.search(queries, 10)[1])
