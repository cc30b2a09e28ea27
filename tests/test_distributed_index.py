"""Distributed index building (issue 20): trained once on the driver, shards added in Ray tasks,
merged in gallery order; searches exactly as a single-machine build."""

from __future__ import annotations

import numpy as np
import pytest

import hubless.distributed as hd
from hubless.index import Index
from tests.conftest import unit_rows


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


@pytest.mark.parametrize("factory", ["Flat", "IVF32,Flat", "IVF16,PQ4x4"])
def test_a_distributed_build_searches_as_a_single_machine_build(ray_local, shards, factory, tmp_path):
    gallery, bank, queries, folder, bank_file = shards
    built = hd.build_index(
        "dis:k_activation=2", folder, bank_file, factory, shard_rows=700, gallery_rows=512, bank_cols=700, progress=False
    )
    single = Index.build(gallery, bank, "dis:k_activation=2", factory)
    got, want = built.search(queries, 10), single.search(queries, 10)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-6)
    again = Index.load(built.save(tmp_path / "idx"))  # a distributed build saves and loads like any index
    np.testing.assert_array_equal(again.search(queries, 10)[1], want[1])
    info = again.info()  # it keeps no banks, but says which bank its biases come from
    assert (info["n_query_bank"], info["banks_kept"]) == (2000, False)
    assert (single.info()["n_query_bank"], single.info()["banks_kept"]) == (2000, True)


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
