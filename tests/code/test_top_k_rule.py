"""One top-k rule for every search (issue 40 item 2, ``hubless._validation.check_top_k``): a
``top_k`` beyond the items a search can return keeps the width, the first n slots are the search's
whole ranking (equal to the exact corrected search) and the rest come last with id -1 and score
-inf; the CLI and the service leave those slots out. A non-positive or non-integer ``top_k`` is
InvalidInput / InvalidType everywhere, and one above both the items and MAX_PADDED_TOP_K is
refused (no absurd allocation). Real components on a tiny gallery (24 items): a correction, Flat
and IVF indexes (all lists probed: exact), score matrices, an embedded LanceDB store, an attached
FAISS file, the Searcher over each."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import hubless
import hubless.export
from hubless._validation import MAX_PADDED_TOP_K
from hubless.errors import InvalidInput, InvalidType
from tests.conftest import unit_rows

SPEC = "nnn:alpha=0.75,k=8"
N, D = 24, 8
TOP_K = N + 3


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(40)
    return {"gallery": unit_rows(rng, N, D), "bank": unit_rows(rng, 60, D), "queries": unit_rows(rng, 5, D)}


@pytest.fixture(scope="module")
def exact(data):
    """The exact corrected ranking of every item (the correction's own search, top_k = n) and
    the exact plain one (brute force)."""
    corr = hubless.make_correction(SPEC).fit(data["gallery"], data["bank"])
    scores, ids = corr.search(data["queries"], N)
    sims = data["queries"] @ data["gallery"].T
    plain = np.argsort(-sims, axis=1, kind="stable")
    return {"corrected": (scores, ids), "plain": (np.take_along_axis(sims, plain, axis=1), plain), "corr": corr}


def _lancedb_store(data, tmp_path):
    pytest.importorskip("lancedb")
    uri = f"lancedb://{tmp_path}/store/gallery"
    hubless.export.export(hubless.Index.build(data["gallery"], data["bank"], SPEC, "Flat"), uri)
    return uri


def _faiss_sidecar(data, tmp_path):
    faiss = pytest.importorskip("faiss")
    from hubless.attached import attach

    index = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    index.add_with_ids(data["gallery"], np.arange(N, dtype=np.int64))
    path = tmp_path / "c.faiss"
    faiss.write_index(index, str(path))
    attach(str(path), data["bank"], SPEC, out=tmp_path / "side")
    return tmp_path / "side"


def _searcher(target):
    from hubless.search import Searcher

    searcher = Searcher({"s": target})

    def search(q, k):
        result = searcher.search("s", embeddings=q, top_k=k, compare=True)
        return (result.scores, result.ids), result.uncorrected

    return search


def _entry(name, data, tmp_path):
    """search(queries, top_k) -> (corrected (scores, ids), uncorrected (scores, ids) or None)."""
    g, b = data["gallery"], data["bank"]
    if name == "correction":
        corr = hubless.make_correction(SPEC).fit(g, b)
        return lambda q, k: (corr.search(q, k), None)
    if name in ("index-flat", "index-ivf"):
        with warnings.catch_warnings():  # 24 items train 2 lists: FAISS's advice on list sizes
            warnings.simplefilter("ignore", UserWarning)
            index = hubless.Index.build(g, b, SPEC, "Flat" if name == "index-flat" else "IVF2,Flat", nprobe=2)  # every list probed
        return lambda q, k: (index.search(q, k), index.search_uncorrected(q, k))
    if name == "index-where":
        index = hubless.Index.build(g, b, SPEC, "Flat", metadata=[{"n": i} for i in range(N)])
        return lambda q, k: (index.search(q, k, where={"n": {"gte": 0}}), index.search_uncorrected(q, k, where={"n": {"gte": 0}}))
    if name == "scores":
        return lambda q, k: (hubless.correct_scores(q @ g.T, b @ g.T, SPEC, top_k=k), None)
    if name == "store":
        uri = _lancedb_store(data, tmp_path)
        return lambda q, k: (hubless.export.search(uri, q, k)[:2], hubless.export.search(uri, q, k, corrected=False)[:2])
    if name == "attached":
        from hubless.attached import AttachedCollection

        collection = AttachedCollection.from_sidecar(_faiss_sidecar(data, tmp_path))
        return lambda q, k: (collection.search(q, k), None)
    if name == "attached-exact":
        from hubless.attached import AttachedCollection

        collection = AttachedCollection.from_sidecar(_faiss_sidecar(data, tmp_path))
        return lambda q, k: (collection.exact_search(q, k), None)
    if name == "searcher-index":
        return _searcher(hubless.Index.build(g, b, SPEC, "Flat"))
    if name == "searcher-store":
        return _searcher(_lancedb_store(data, tmp_path))
    if name == "searcher-attached":
        return _searcher(_faiss_sidecar(data, tmp_path))
    raise AssertionError(name)


ENTRIES = [
    "correction", "index-flat", "index-ivf", "index-where", "scores", "store", "attached", "attached-exact",
    "searcher-index", "searcher-store", "searcher-attached",
]  # fmt: skip


def _check(found, want, top_k):
    scores, ids = found
    assert scores.shape == ids.shape == (want[1].shape[0], top_k) and ids.dtype == np.int64
    np.testing.assert_array_equal(ids[:, :N], want[1])
    np.testing.assert_allclose(scores[:, :N], want[0], rtol=1e-5, atol=1e-5)
    assert (ids[:, N:] == -1).all() and (scores[:, N:] == -np.inf).all()


@pytest.mark.parametrize("name", ENTRIES)
def test_top_k_beyond_the_items_is_padded_with_unfilled_slots(name, data, exact, tmp_path):
    search = _entry(name, data, tmp_path)
    q = data["queries"]
    corrected, plain = search(q, TOP_K)
    _check(corrected, exact["corrected"], TOP_K)
    if plain is not None:
        _check(plain, exact["plain"], TOP_K)
    at_n, _ = search(q, N)  # the first n slots are the search's whole ranking
    np.testing.assert_array_equal(corrected[1][:, :N], at_n[1])
    for bad, error in ((0, InvalidInput), (-2, InvalidInput), (2.5, InvalidType), ("3", InvalidType), (True, InvalidType)):
        with pytest.raises(error, match="top_k"):
            search(q, bad)
    with pytest.raises(InvalidInput, match="top_k"):  # absurd: refused, nothing allocated
        search(q, 10**12)
    assert search(q, MAX_PADDED_TOP_K)[0][1].shape == (q.shape[0], MAX_PADDED_TOP_K)  # up to the cap: padded


def test_the_cli_and_the_service_leave_unfilled_slots_out(data, exact, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    index = hubless.Index.build(data["gallery"], data["bank"], SPEC, "Flat")
    index.save(tmp_path / "idx")
    np.save(tmp_path / "q.npy", data["queries"])
    want = exact["corrected"][1].tolist()
    out = CliRunner().invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--top-k", str(TOP_K), "--json"])
    assert out.exit_code == 0, out.output
    assert [[h["id"] for h in json.loads(line)["hits"]] for line in out.output.strip().splitlines()] == want
    pytest.importorskip("fastapi")
    pytest.importorskip("pydantic_settings")
    from starlette.testclient import TestClient

    from hubless.service import create_app

    with TestClient(base_url="http://localhost", app=create_app({"idx": index})) as client:
        body = {"index": "idx", "embeddings": data["queries"].tolist(), "top_k": TOP_K, "compare": True}
        answer = client.post("/search", json=body)
        assert answer.status_code == 200, answer.text
        results = answer.json()["results"]
        assert [[h["id"] for h in r["hits"]] for r in results] == want
        assert [[h["id"] for h in r["uncorrected"]] for r in results] == exact["plain"][1].tolist()
        binary = client.post(f"/search/binary?index=idx&top_k={TOP_K}", content=data["queries"].astype("<f4").tobytes(),
                             headers={"content-type": "application/octet-stream"})  # fmt: skip
        assert [[h["id"] for h in r["hits"]] for r in binary.json()["results"]] == want
        assert client.post("/search", json={**body, "top_k": 0}).status_code == 422


def test_a_reranked_search_is_padded_past_rerank_k(data):
    """The Searcher reranks its first rerank_k: a larger top_k keeps the width, the rest unfilled."""
    from hubless.rerank import CallableReranker, Pipeline
    from hubless.search import Searcher

    captions = [f"item {i}" for i in range(N)]
    index = hubless.Index.build(data["gallery"], data["bank"], SPEC, "Flat", metadata=[{"caption": c} for c in captions])
    reranker = CallableReranker(lambda qs, cs: [float(c.split()[1]) for c in cs])  # the higher id first
    items = [f"q{i}" for i in range(data["queries"].shape[0])]
    result = Searcher({"idx": index}, reranker=reranker, rerank_k=5).search(embeddings=data["queries"], top_k=TOP_K, rerank=True,
                                                                             query_items=items)  # fmt: skip
    want = Pipeline(index, reranker, k=5, gallery_items=captions).search(data["queries"], items, top_k=5)
    assert result.ids.shape == result.scores.shape == result.first_stage_scores.shape == (len(items), TOP_K)
    np.testing.assert_array_equal(result.ids[:, :5], want.ids)
    assert (result.ids[:, 5:] == -1).all() and (result.scores[:, 5:] == -np.inf).all()
    assert [len(r["hits"]) for r in result.records()] == [5] * len(items)


def test_an_unfilled_slot_is_never_a_hit():
    """R@K reads padded rankings: id -1 (encoded as the previous query's last item before) never counts."""
    from hubless.metrics import recall_at_k

    ranked = np.array([[0, 1], [2, -1]])  # query 1 asked beyond what was found; 3 items
    assert recall_at_k(ranked, np.array([2, 0]), 2) == 0.0  # query 1's -1 is not query 0's relevant item 2
    assert recall_at_k(ranked, np.array([1, 2]), 2) == 100.0
