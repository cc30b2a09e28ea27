"""An ANN index that finds fewer than top_k items: the unfilled slots come last with id -1 and
score -inf in the library, and are left out (never given another item's metadata) by the CLI,
whose JSON stays strict JSON; the reranker never sees them."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.rerank import CallableReranker, Pipeline
from tests.conftest import unit_rows

runner = CliRunner()


@pytest.fixture(scope="module")
def sparse_index():
    rng = np.random.default_rng(3)
    gallery, bank, queries = unit_rows(rng, 256, 16), unit_rows(rng, 400, 16), unit_rows(rng, 30, 16)
    index = hubless.Index.build(gallery, bank, "nnn:alpha=0.5,k=8", "IVF64,Flat", nprobe=1, metadata={"n": list(range(256))})
    return index, queries


@pytest.mark.parametrize("rescore", [True, False])
def test_unfilled_slots_are_last_with_id_minus_one(sparse_index, rescore):
    index, queries = sparse_index
    scores, ids = index.search(queries, 20, rescore=rescore)
    missing = ids == -1
    assert missing.any(), "the test needs queries whose probed list holds fewer than 20 items"
    assert np.all(scores[missing] == -np.inf) and np.all(np.isfinite(scores[~missing]))
    for row in range(ids.shape[0]):  # found results first, each once, then only -1
        n = int((~missing[row]).sum())
        assert (ids[row, :n] >= 0).all() and (ids[row, n:] == -1).all() and len(set(ids[row, :n])) == n
        assert np.all(np.diff(scores[row, :n]) <= 1e-6)


def test_cli_leaves_unfilled_slots_out(sparse_index, tmp_path):
    index, queries = sparse_index
    index.save(tmp_path / "idx")
    np.save(tmp_path / "q.npy", queries)
    result = runner.invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--top-k", "20", "--json"])
    assert result.exit_code == 0, result.output
    _, ids = index.search(queries, 20)
    for line, row in zip(result.output.strip().splitlines(), ids):
        hits = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))["hits"]
        assert [h["id"] for h in hits] == [int(j) for j in row if j >= 0]
        assert all(h["metadata"] == {"n": h["id"]} for h in hits)
    table = runner.invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--top-k", "20"])
    body = table.output.split("\n", 1)[1]  # below the title line (which names the index's path)
    assert table.exit_code == 0 and "-1" not in body and "inf" not in body


def test_reranker_never_sees_unfilled_slots(sparse_index):
    index, queries = sparse_index
    seen = []

    def score(qs, cs):
        seen.extend(cs)
        return [float(c) for c in cs]

    pipe = Pipeline(index, CallableReranker(score), k=20, fusion="norm_add", gallery_items=[str(i) for i in range(256)])
    result = pipe.search(queries, [f"q{i}" for i in range(30)], top_k=20)
    _, first = index.search(queries, 20)
    assert len(seen) == int((first >= 0).sum())
    missing = result.ids == -1
    assert missing.any() and np.all(result.scores[missing] == -np.inf) and np.all(np.isfinite(result.scores[~missing]))
    for row in range(result.ids.shape[0]):
        n = int((~missing[row]).sum())
        assert (result.ids[row, n:] == -1).all()
