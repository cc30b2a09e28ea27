"""``Index.info()`` is typed (issue 40 item 5): an :class:`hubless.index.IndexInfo` whose fields a
type checker sees, that still reads as the dict it was (keys, order, values, equality), and
whose ``to_dict()`` is that dict (what the CLI, the JSON and the HTTP answer show)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hubless
from hubless.index import IndexConfig, IndexInfo
from tests.conftest import unit_rows

KEYS = ["method", "n_items", "dim", "bias_columns", "normalize", "n_query_bank", "n_gallery_bank", "banks_kept",
        "metadata_columns", "next_id", "factory", "model", "nprobe", "ef_search", "rescore", "rescore_factor",
        "build_seconds", "bias_error", "spill", "spill_below", "bias_offset", "tuning"]  # fmt: skip


def test_info_is_typed_and_reads_as_the_dict_it_was():
    rng = np.random.default_rng(0)
    index = hubless.Index.build(unit_rows(rng, 40, 6), unit_rows(rng, 70, 6), "nnn:k=4", "Flat")
    info = index.info()
    assert isinstance(info, IndexInfo) and isinstance(info.config, IndexConfig)
    assert (info.dim, info.n_items, info.method, info.config.factory) == (6, 40, index.info()["method"], "Flat")
    plain = info.to_dict()
    assert type(plain) is dict and list(plain) == KEYS and list(info) == KEYS and len(info) == len(KEYS)
    assert dict(info) == plain == {**info} and info == plain and info == index.info()
    assert [info[k] for k in KEYS] == [plain[k] for k in KEYS] and info.get("nope") is None and "dim" in info
    assert json.loads(json.dumps(plain)) == json.loads(json.dumps(dict(info)))
    assert IndexInfo.from_dict(plain) == info
    with pytest.raises(KeyError):
        info["config"]  # the config's fields are keys, not the config itself
    tuning = info["bias_error"]
    if isinstance(tuning, dict):  # a copy, as the dict held: changing it changes nothing
        tuning["x"] = 1.0
        assert "x" not in (index.info()["bias_error"] or {})
    with pytest.raises(AttributeError):
        info.dim = 3  # type: ignore[misc]


def test_a_stores_description_is_typed_and_reads_as_the_dict_it_was(tmp_path):
    pytest.importorskip("lancedb", reason="the lancedb extra: an embedded store")
    from hubless.export import describe, export, open_store
    from hubless.export.info import StoreInfo

    rng = np.random.default_rng(1)
    index = hubless.Index.build(unit_rows(rng, 30, 6), unit_rows(rng, 50, 6), "nnn:k=4", "Flat", metadata=[{"n": i} for i in range(30)])
    uri = f"lancedb://{tmp_path / 'db'}/gallery"
    export(index, uri)
    info = describe(uri)
    stored = dict(open_store(uri).read_info())
    assert isinstance(info, StoreInfo) and info.to_dict() == stored == dict(info) and info == stored
    assert list(info) == list(stored) and type(info.to_dict()) is dict
    assert (info.spec, info.dim, info.n_items, info.metric, info.ann) == (index.correction.spec, 6, 30, "dot", None)
    assert info.metadata_columns == stored["metadata_columns"] and info["spec"] == info.spec
    info["layout"]["x"] = 1  # a copy: the description does not change
    assert "x" not in info["layout"]
