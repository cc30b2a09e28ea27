"""``hubless eval --attached SIDECAR``: an attached collection measured against exact corrected
search (issue 42 item 4), a thin layer over AttachedCollection.evaluate_at; and a sidecar finds
its collection from its own folder, not from the working folder. Real FAISS files."""

from __future__ import annotations

import json
import os
import shutil

import faiss
import numpy as np
import pytest
from typer.testing import CliRunner

from hubless import Hits
from hubless.attached import AttachedCollection, attach, read_sidecar, update
from hubless.attached.certified import recall_at_k
from hubless.attached.sources.base import open_source
from hubless.cli.main import app
from hubless.search import Searcher
from tests.attached.test_attach import D, brute_force_nnn, exact_top, hub_prone

SPEC = "nnn:alpha=0.75,k=8"
runner = CliRunner()


@pytest.fixture
def hnsw_file(tmp_path):
    """A FAISS HNSW file with the user's ids (a narrow beam: not every answer is exact)."""
    rng = np.random.default_rng(11)
    x, bank, queries = hub_prone(rng, 400), hub_prone(rng, 300), hub_prone(rng, 25)
    ids = (np.arange(400, dtype=np.int64) * 3 + 7)[rng.permutation(400)]
    index = faiss.IndexIDMap2(faiss.IndexHNSWFlat(D, 4, faiss.METRIC_INNER_PRODUCT))
    index.add_with_ids(x, ids)
    path = tmp_path / "c.faiss"
    faiss.write_index(index, str(path))
    np.save(tmp_path / "q.npy", queries)
    return path, x, ids, bank, queries


def test_eval_attached_measures_the_attached_search_against_exact_search(hnsw_file, tmp_path):
    path, x, ids, bank, queries = hnsw_file
    side = tmp_path / "side"
    attached = attach(str(path), bank, SPEC, out=side)
    want = exact_top(brute_force_nnn(x, bank, queries, 0.75, 8), ids, 10)[0]
    rows = attached.evaluate_at(queries, [1, 10], candidates=10, max_candidates=10, ef_search=10)
    for row in rows:  # against the brute force, computed here
        k = row["top_k"]
        got = attached.search_certified(queries, k, candidates=10, max_candidates=10, ef_search=10)
        exact = Hits.from_found(np.zeros(want[:, :k].shape), want[:, :k], np.ones(want[:, :k].shape, bool))
        assert row["recall"] == pytest.approx(recall_at_k(got, exact))
        assert row["exact"] == pytest.approx(got.exact.mean()) and row["wrong_exact"] == 0
        assert row["certified"] == pytest.approx(got.certified.mean()) and row["queries"] == len(queries)
        assert row == attached.evaluate(queries, k, candidates=10, max_candidates=10, ef_search=10)
    assert rows[1]["recall"] < 1.0  # a narrow beam misses some: the measure is not vacuous
    out = tmp_path / "r.json"
    args = ["eval", "--attached", str(side), "--queries", str(tmp_path / "q.npy"), "--ks", "1,10", "--candidates", "10"]
    result = runner.invoke(app, [*args, "--max-candidates", "10", "--ef-search", "10", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "recall@k" in result.output and f"results: {out}" in result.output
    written = json.loads(out.read_text())
    assert written["results"] == rows and written["attached"]["method"] == SPEC and written["attached"]["n_items"] == 400
    # the default widening certifies every answer: exact against the store's plain ranking
    result = runner.invoke(app, ["eval", "--attached", str(side), "--queries", str(tmp_path / "q.npy"), "--ks", "5"])
    assert result.exit_code == 0, result.output
    # refused, clearly: options of the other modes, and a missing --queries
    result = runner.invoke(app, ["eval", "--attached", str(side), "--queries", str(tmp_path / "q.npy"), "--truth", "t2i:5"])
    assert result.exit_code == 2 and "--truth does not apply to an attached collection" in result.output
    assert runner.invoke(app, ["eval", "--attached", str(side)]).exit_code == 2
    result = runner.invoke(
        app, ["eval", "--gallery", str(tmp_path / "q.npy"), "--queries", str(tmp_path / "q.npy"), "--truth", "t2i:1", "--candidates", "5"]
    )
    assert result.exit_code == 2 and "--candidates does not apply to embeddings; it belongs to an attached collection" in result.output


def test_a_sidecar_finds_its_collection_from_its_own_folder(hnsw_file, tmp_path, monkeypatch):
    path, x, ids, bank, queries = hnsw_file
    monkeypatch.chdir(tmp_path)
    attach("c.faiss", bank, SPEC, out="side")  # a relative path, from the working folder
    source = read_sidecar(tmp_path / "side").info["source"]
    assert open_source(f"faiss://{path}").count() == open_source("c.faiss").count() == 400  # faiss:// names the same file
    assert source["uri"] == "c.faiss" and source["location_from_sidecar"] == os.path.join("..", "c.faiss")
    want = AttachedCollection.from_sidecar(tmp_path / "side").search(queries, 5)[1]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the server's working folder is not the one attach ran in
    np.testing.assert_array_equal(AttachedCollection.from_sidecar(tmp_path / "side").search(queries, 5)[1], want)
    served = Searcher({"mine": tmp_path / "side"}).search("mine", embeddings=queries, top_k=5)  # as hubless serve opens it
    np.testing.assert_array_equal(served.ids, want)
    # moved together: found beside the sidecar, not at the old absolute path
    moved = tmp_path / "moved"
    moved.mkdir()
    shutil.move(tmp_path / "c.faiss", moved / "c.faiss")
    shutil.move(tmp_path / "side", moved / "side")
    opened = AttachedCollection.from_sidecar(moved / "side")
    assert opened.source.uri == str(moved / "c.faiss")
    np.testing.assert_array_equal(opened.search(queries, 5)[1], want)
    # an update given the collection by another relative address is the same collection
    assert update(moved / "side", os.path.join("..", "moved", "c.faiss"), bank)["added"] == 0
