"""The torch engine (issue 20): block products on a torch device give the numpy engine's fits
and searches (here on CPU torch); half precision stays within its documented error; the default
path never imports torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import hubless
from hubless.corrections import make_correction
from hubless.engine import use_device
from hubless.engine.device import resolve
from tests.conftest import unit_rows

METHODS = ["nnn:k=5", "csls:k=4", "dn", "is:beta=20.0", "dis:k_activation=3", "dualis", "dualdis:k_activation=2", "gc"]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(8)
    return {name: unit_rows(rng, n, 32) for name, n in (("gallery", 300), ("query_bank", 1200), ("gallery_bank", 500), ("queries", 80))}


@pytest.mark.parametrize("spec", METHODS)
def test_torch_cpu_fit_and_search_equal_the_numpy_engine(spec, data):
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    want = make_correction(spec).fit(g, qb, gb)
    got = make_correction(spec).fit(g, qb, gb, device="cpu")
    ws, gs = want.statistics_, got.statistics_
    # torch's and numpy's BLAS may round a dot product differently in the last bit: statistics
    # agree to float32 rounding, and the rankings are the same
    if ws.query_topk is not None:
        np.testing.assert_allclose(gs.query_topk, ws.query_topk, rtol=1e-6, atol=1e-6)
    for beta, values in ws.query_lse.items():
        np.testing.assert_allclose(gs.query_lse[beta], values, rtol=1e-6)
    for name in ("query_activation", "gallery_activation"):
        if getattr(ws, name) is not None:
            np.testing.assert_array_equal(getattr(gs, name), getattr(ws, name))
    want_scores, want_ids = want.search(q, 10)
    got_scores, got_ids = got.search(q, 10, device="cpu")
    np.testing.assert_array_equal(got_ids, want_ids)
    np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5, atol=1e-5)


def test_the_environment_variable_selects_the_device(data, monkeypatch):
    monkeypatch.setenv("HUBLESS_DEVICE", "cpu")
    assert resolve() == ("cpu", "float32")
    got = hubless.NNN(k=5).fit(data["gallery"], data["query_bank"])
    monkeypatch.delenv("HUBLESS_DEVICE")
    assert resolve() == ("numpy", "float32")
    want = hubless.NNN(k=5).fit(data["gallery"], data["query_bank"])
    np.testing.assert_allclose(got.bias_, want.bias_, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("dtype", "bound"), [("bfloat16", 2e-2), ("float16", 2e-3)])
def test_half_precision_products_stay_within_their_documented_error(dtype, bound, data):
    g, qb, q = data["gallery"], data["query_bank"], data["queries"]
    want = hubless.NNN(k=5).fit(g, qb)
    with use_device("cpu", dtype):
        got = hubless.NNN(k=5).fit(g, qb)
        _, ids = got.search(q, 10)
    assert np.abs(got.bias_ - want.bias_).max() < bound
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, want.search(q, 10)[1])])
    assert overlap >= (0.9 if dtype == "bfloat16" else 0.98)


def test_bad_devices_and_dtypes_are_refused_clearly():
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve("gpu0")
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        resolve("cpu", "float8")
    with pytest.raises(ValueError, match="dtype float16 needs a torch device"):
        resolve("numpy", "float16")
    import torch

    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve("cuda")


def test_the_default_path_never_imports_torch(tmp_path):
    code = (
        "import sys, numpy as np, hubless\n"
        "x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)\n"
        "hubless.NNN(k=3).fit(x, x).search(x[:5], 3)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
