"""Indexes written in format 4 (the committed fixtures, written by hubless at commit bcbd699)
still load and search as they did when they were written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import hubless

FIXTURES = Path(__file__).parent / "fixtures" / "format4"


@pytest.fixture()
def copy(tmp_path):
    def make(name: str) -> Path:
        return Path(shutil.copytree(FIXTURES / name, tmp_path / name))

    return make


@pytest.mark.parametrize("name", ["nnn_flat", "dis_ivf"])
def test_format4_fixture_loads_and_searches_as_written(copy, name):
    expected = json.loads((FIXTURES / "expected.json").read_text())[name]
    queries = np.load(FIXTURES / "queries.npy")
    index = hubless.Index.load(copy(name))
    scores, ids = index.search(queries, 5)
    np.testing.assert_array_equal(ids, expected["ids"])
    np.testing.assert_allclose(scores, expected["scores"], rtol=1e-5, atol=1e-6)
