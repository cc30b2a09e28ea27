"""address= names where a distributed job runs (issue 33): a process already connected to one
Ray refuses, before any work, a job addressed to another (Ray would silently keep the existing
connection), and runs one addressed to the Ray it is connected to, however it is spelled."""

from __future__ import annotations

import numpy as np
import pytest

import hubless.distributed as hd
from hubless.corrections import make_correction
from hubless.errors import Conflict
from tests.conftest import unit_rows


@pytest.fixture
def inputs(tmp_path):
    rng = np.random.default_rng(2)
    gallery, bank = unit_rows(rng, 300, 8), unit_rows(rng, 500, 8)
    np.save(tmp_path / "g.npy", gallery)
    np.save(tmp_path / "b.npy", bank)
    return gallery, bank, tmp_path / "g.npy", tmp_path / "b.npy"


@pytest.mark.parametrize("address", ["ray://127.0.0.1:1", "10.255.255.1:6379", "127.0.0.1:1"])
def test_another_address_is_refused_before_any_work(ray_local, inputs, tmp_path, address):
    _, _, g, b = inputs
    current = ray_local.get_runtime_context().gcs_address
    request = make_correction("nnn:k=4").statistics_request()
    with pytest.raises(Conflict, match=f"already connected to Ray at {current}, not at address={address!r}"):
        hd.fit_statistics(request, g, b, address=address, work_dir=tmp_path / "work", progress=False)
    assert not (tmp_path / "work").exists()
    for job in (
        lambda: hd.fit("nnn:k=4", g, b, address=address, progress=False),
        lambda: hd.write_augmented("nnn:k=4", g, b, out=tmp_path / "out", address=address, progress=False),
        lambda: hd.build_index("nnn:k=4", g, b, "Flat", address=address, progress=False),
        lambda: hd.connect(address),
    ):
        with pytest.raises(Conflict):
            job()
    assert not (tmp_path / "out").exists()


def test_the_connected_address_however_spelled_runs_there(ray_local, inputs):
    gallery, bank, g, b = inputs
    want = make_correction("nnn:k=4").fit(gallery, bank)
    port = ray_local.get_runtime_context().gcs_address.rsplit(":", 1)[1]
    for address in (ray_local.get_runtime_context().gcs_address, f"127.0.0.1:{port}", f"localhost:{port}", "local"):
        got = hd.fit("nnn:k=4", g, b, address=address, progress=False)
        np.testing.assert_allclose(got.bias_columns_, want.bias_columns_, rtol=1e-6, atol=1e-6)


def test_the_cli_names_the_conflict(ray_local, inputs, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    _, _, g, b = inputs
    args = ["augment", "--gallery", str(g), "--query-bank", str(b), "--out", str(tmp_path / "out"), "--address", "ray://127.0.0.1:1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "error: this process is already connected to Ray at" in result.output and "ray.shutdown()" in result.output
