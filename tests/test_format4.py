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


def test_format4_converts_at_its_next_write_keeping_ids_and_types(copy):
    path = copy("nnn_flat")
    queries = np.load(FIXTURES / "queries.npy")
    index = hubless.Index.open(path)
    assert index.storage()["format_version"].startswith("legacy")
    schema = {f.name: str(f.type) for f in index.metadata_schema}
    assert schema == {"name": "string", "year": "int64", "score": "double", "test": "bool", "tags": "list<item: string>"}
    new_ids = index.add(queries[:2], [{"name": "new", "year": 2031, "score": 0.5, "test": False, "tags": ["t9"]}] * 2)
    assert new_ids.tolist() == [60, 61]  # the items of a format-4 index have their positions as ids
    header = json.loads((path / "CURRENT").read_text().splitlines()[0])
    assert header["format_version"] == 5 and not (path / "v000001").exists()  # converted, the old version removed
    loaded = hubless.Index.load(path)
    assert {f.name: str(f.type) for f in loaded.metadata_schema} == schema
    assert loaded.records([7, 61]) == [
        {"name": "item7", "year": 2007, "score": 1.75, "test": False, "tags": ["t3"]},
        {"name": "new", "year": 2031, "score": 0.5, "test": False, "tags": ["t9"]},
    ]
    expected = json.loads((FIXTURES / "expected.json").read_text())["nnn_flat"]
    scores, ids = loaded.search(queries, 5, where={"name": {"ne": "new"}})  # the old items rank as they did
    np.testing.assert_array_equal(ids, expected["ids"])
    np.testing.assert_allclose(scores, expected["scores"], rtol=1e-5, atol=1e-6)
