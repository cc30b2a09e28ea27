"""`hubless search STORE` is a thin layer over :class:`hubless.search.Searcher` (issue 40): its
JSON lines are the Searcher's records of the same store (ids, scores, metadata), the store's own
options (--target-recall, the knob, the weight) reach :func:`hubless.export.search` through
``Searcher.search(..., target_recall=...)``, and a store option is refused on an index."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from hubless import Index
from hubless.cli.main import app
from hubless.errors import InvalidInput
from hubless.search import Searcher

runner = CliRunner()


def _lines(output: str) -> list[dict]:
    return [json.loads(line) for line in output.strip().splitlines()]


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(40)
    g = rng.standard_normal((200, 16)).astype(np.float32)
    b = rng.standard_normal((300, 16)).astype(np.float32)
    q = rng.standard_normal((7, 16)).astype(np.float32)
    return g, b, q


def test_cli_json_equals_the_searchers_records(tmp_path, data):
    pytest.importorskip("lancedb")
    from hubless.export import export

    g, b, q = data
    index = Index.build(g, b, "nnn:alpha=0.5,k=8", "Flat", metadata=[{"caption": f"item {i}"} for i in range(200)])
    uri = f"lancedb://{tmp_path / 'db'}/gallery"
    export(index, uri)
    np.save(tmp_path / "q.npy", q)
    for args, options in (([], {}), (["--weight", "0.2"], {"weight": 0.2}), (["--top-k", "250"], {"top_k": 250})):
        result = runner.invoke(app, ["search", uri, "--queries", str(tmp_path / "q.npy"), "--json", *args])
        assert result.exit_code == 0, result.output
        want = Searcher({"gallery": uri}).search(embeddings=q, **{"top_k": 10, **options}).records()
        got = _lines(result.output)
        assert [line["query"] for line in got] == [r["query"] for r in want]
        assert [line["hits"] for line in got] == [r["hits"] for r in want]
    assert len(got[0]["hits"]) == 200  # top_k beyond the items: the unfilled slots are left out
    assert got[0]["hits"][0]["metadata"] == {"caption": f"item {got[0]['hits'][0]['id']}"}


def test_store_options_reach_the_store_through_the_searcher(tmp_path, data):
    pytest.importorskip("qdrant_client")
    import hubless.export

    g, b, q = data
    index = Index.build(g, b, "dn:lam=0.4", "Flat")
    index.save(tmp_path / "idx")
    np.save(tmp_path / "q.npy", q)
    uri = f"qdrant://{tmp_path}/qd/dn"
    ok = runner.invoke(app, ["export", str(tmp_path / "idx"), "--to", uri, "--ann", "HNSW", "--target-recall", "0.9", "--option", "m=8"])
    assert ok.exit_code == 0, ok.output
    searcher = Searcher(uri)
    for args, options in (
        (["--target-recall", "0.95"], {"target_recall": 0.95}),
        (["--ef-search", "16", "--weight", "0.9"], {"ef_search": 16, "weight": 0.9}),
    ):
        result = runner.invoke(app, ["search", uri, "--queries", str(tmp_path / "q.npy"), "--top-k", "5", "--json", *args])
        assert result.exit_code == 0, result.output
        got = searcher.search(embeddings=q, top_k=5, **options)
        scores, ids = hubless.export.search(uri, q, 5, **options)[:2]
        np.testing.assert_array_equal(got.ids, ids)
        np.testing.assert_array_equal(got.scores, scores)
        assert [[h["id"] for h in line["hits"]] for line in _lines(result.output)] == ids.tolist()
    both = runner.invoke(app, ["search", uri, "--queries", str(tmp_path / "q.npy"), "--target-recall", "0.95", "--ef-search", "8"])
    assert both.exit_code == 2 and "not both" in both.output
    with pytest.raises(InvalidInput, match="target_recall apply to a store.*Index.calibrate"):
        Searcher(tmp_path / "idx").search(embeddings=q, target_recall=0.9)
    on_index = runner.invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--target-recall", "0.9"])
    assert on_index.exit_code == 2 and "target_recall" in on_index.output and "calibrate" in on_index.output
    as_of = runner.invoke(app, ["search", uri, "--queries", str(tmp_path / "q.npy"), "--as-of", "1"])
    assert as_of.exit_code == 2 and "keeps no versions" in as_of.output
