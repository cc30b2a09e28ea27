"""FAISS factory strings are checked before any work: the forms hubless serves build and search;
everything else (including strings that used to abort the process) is one clear error line."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import hubless
from hubless.index.factory import check_factory
from tests.conftest import unit_rows


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(11)
    return unit_rows(rng, 700, 16), unit_rows(rng, 400, 16), unit_rows(rng, 20, 16)


@pytest.mark.parametrize(
    "factory, recall",
    [("Flat", 1.0), ("IVF8,Flat", 1.0), ("IVF8,SQ8", 0.9), ("IVF4,PQ8x4", 0.5), ("PQ8x4", 0.5), ("HNSW16", 0.95),
     ("HNSW16,Flat", 0.95), (" IVF8, Flat ", 1.0)],
)  # fmt: skip
def test_supported_forms_build_and_search(data, factory, recall):
    """Every probed list / a wide beam: exact forms find the exact corrected top 5; quantised
    codes (4-bit PQ on 16 dimensions) only need to be of some use after re-scoring."""
    g, b, q = data
    index = hubless.Index.build(g, b, "nnn:alpha=0.5,k=8", factory, nprobe=8, ef_search=200)
    exact = hubless.NNN(alpha=0.5, k=8).fit(g, b).search(q, 5)[1]
    found = index.search(q, 5)[1]
    assert np.mean([len(set(a) & set(e)) for a, e in zip(found, exact)]) / 5 >= recall


@pytest.mark.parametrize(
    "factory, match",
    [
        ("HNSW0", "2 <= M"),
        ("HNSW1000", "2 <= M"),
        ("IDMap,Flat", "IDMap"),
        ("IVF0,Flat", "lists"),
        ("IVF5000,Flat", "lists"),
        ("PQ64", "17 dimensions"),
        ("IVF4,PQ64", "17 dimensions"),
        ("IVF4,PQ8", "need at least 9,984 items"),
        ("PQ8x20", "1 to 16 bits"),
        ("LSH", "unsupported"),
        ("", "factory string"),
        ("IVF4,Flat;rm -rf", "unsupported"),
    ],
)
def test_bad_factories_are_refused_before_the_fit(data, factory, match):
    g, b, _ = data
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        hubless.Index.build(g, b, "nnn", factory)
    assert time.perf_counter() - t0 < 5  # refused up front, not after training


def test_the_message_is_one_line():
    with pytest.raises(ValueError) as err:
        check_factory("IVF4,PQ8", 300, 513)
    assert "\n" not in str(err.value) and "Flat" in str(err.value)


def test_hnsw0_no_longer_aborts_the_cli(data, tmp_path):
    g, b, _ = data
    np.save(tmp_path / "g.npy", g)
    np.save(tmp_path / "b.npy", b)
    done = subprocess.run(
        [sys.executable, "-m", "hubless", "index", "build", "--gallery", str(tmp_path / "g.npy"), "--query-bank", str(tmp_path / "b.npy"),
         "--factory", "HNSW0", "--out", str(tmp_path / "idx")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "2 <= M" in done.stderr and "Traceback" not in done.stderr and not (tmp_path / "idx").exists()
