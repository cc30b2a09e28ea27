"""hubless.search.Searcher, the facade under `hubless search` and `hubless serve`: the same
results as Index.search, the uncorrected ranking through the index's own structure equal to a
brute-force scan, the one model rule, and text queries encoded with the model the index records
(by the service too, without --model)."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from hubless.errors import InvalidInput, NotFound
from hubless.search import Searcher, choose_model, same_model
from tests.conftest import unit_rows


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(21)
    return unit_rows(rng, 600, 16), unit_rows(rng, 900, 16), unit_rows(rng, 25, 16)


@pytest.fixture(scope="module")
def indexes(data):
    gallery, bank, _ = data
    meta = [{"caption": f"item {i}"} for i in range(gallery.shape[0])]
    flat = hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=8", "Flat", metadata=meta)
    ivf = hubless.Index.build(gallery, bank, "is:beta=20.0", "IVF16,Flat", nprobe=4)
    hnsw = hubless.Index.build(gallery, bank, "nnn:alpha=0.5,k=8", "HNSW16", ef_search=64)
    return {"flat": flat, "ivf": ivf, "hnsw": hnsw}


def _brute_force_raw(queries, gallery, k):
    sims = queries @ gallery.T
    ids = np.lexsort((np.broadcast_to(np.arange(gallery.shape[0]), sims.shape), -sims), axis=1)[:, :k]
    return np.take_along_axis(sims, ids, axis=1), ids


def test_search_equals_index_search_with_metadata(indexes, data):
    _, _, queries = data
    searcher = Searcher(indexes)
    for name, index in indexes.items():
        result = searcher.search(name, embeddings=queries, top_k=7)
        scores, ids = index.search(queries, 7)
        np.testing.assert_array_equal(result.ids, ids)
        np.testing.assert_allclose(result.scores, scores, rtol=1e-6)
    weighted = searcher.search("flat", embeddings=queries, top_k=5, weight=0.2)
    np.testing.assert_array_equal(weighted.ids, indexes["flat"].search(queries, 5, weight=0.2)[1])
    record = weighted.records()[0]
    assert record["query"] == 0 and record["hits"][0]["metadata"] == {"caption": f"item {record['hits'][0]['id']}"}
    assert "metadata" not in searcher.search("ivf", embeddings=queries[:1], top_k=3).records()[0]["hits"][0]


def test_compare_on_every_structure_equals_a_brute_force_scan(indexes, data):
    gallery, _, queries = data
    searcher = Searcher(indexes)
    raw_scores, raw_ids = _brute_force_raw(queries, gallery, 10)
    for name in ("flat", "ivf", "hnsw"):
        full = {"nprobe": 16} if name == "ivf" else {"ef_search": 600} if name == "hnsw" else {}
        result = searcher.search(name, embeddings=queries, top_k=10, compare=True, **full)
        scores, ids = result.uncorrected
        np.testing.assert_array_equal(ids, raw_ids, err_msg=name)
        np.testing.assert_allclose(scores, raw_scores, rtol=1e-5, atol=1e-6)
        record = result.records()[3]
        before = {j: r for r, j in enumerate(raw_ids[3].tolist(), start=1)}
        for rank, hit in enumerate(record["hits"], start=1):
            assert hit["uncorrected_rank"] == before.get(hit["id"])
            assert hit["rank_change"] == (None if hit["id"] not in before else before[hit["id"]] - rank)
        assert [h["id"] for h in record["uncorrected"]] == raw_ids[3].tolist()


def test_compare_on_ivf_goes_through_the_ivf_structure(indexes, data):
    """With one list probed and no re-scoring, the uncorrected side sees only that list's items:
    it is the IVF search, not an exact scan."""
    gallery, _, queries = data
    ivf = indexes["ivf"]
    scores, ids = ivf.search_uncorrected(queries, 10, nprobe=1, rescore=False)
    exact = _brute_force_raw(queries, gallery, 10)[1]
    assert (ids != exact).any()  # an exact scan would always equal the brute force
    found = ids >= 0
    np.testing.assert_allclose(
        scores[found], np.einsum("qd,qd->q", np.repeat(queries, 10, 0), gallery[ids.ravel()])[found.ravel()], atol=1e-5
    )


def test_items_and_errors(indexes, data):
    _, _, queries = data
    searcher = Searcher(indexes)
    assert searcher.search("flat", item=42, top_k=1, weight=0.0).ids[0, 0] == 42
    with pytest.raises(NotFound, match="no item 600"):
        searcher.search("flat", item=600)
    with pytest.raises(NotFound, match="no index named 'nope'"):
        searcher.search("nope", item=1)
    with pytest.raises(InvalidInput, match="several indexes"):
        searcher.search(item=1)
    with pytest.raises(InvalidInput, match="exactly one of"):
        searcher.search("flat", item=1, embeddings=queries)
    with pytest.raises(InvalidInput, match="no query-time weight"):
        searcher.search("ivf", item=1, weight=0.5)
    with pytest.raises(InvalidInput, match="records no model"):
        searcher.search("flat", texts=["a dog"])
    with pytest.raises(InvalidInput, match="reranker"):
        searcher.search("flat", embeddings=queries[:1], rerank=True, query_items=["a"])
    beyond = searcher.search("flat", item=3, top_k=10_000)  # top_k beyond the gallery: all of it, then unfilled slots
    assert beyond.ids.shape == (1, 10_000) and (beyond.ids[0, 600:] == -1).all() and sorted(beyond.ids[0, :600]) == list(range(600))
    assert len(beyond.records()[0]["hits"]) == 600
    assert searcher.query_kinds("flat") == ["embeddings", "item"]


def test_the_model_rule():
    assert same_model("openai/clip-vit-base-patch32", "/models/clip-vit-base-patch32/")
    assert not same_model("openai/clip-vit-base-patch32", "openai/clip-vit-large-patch14")
    assert choose_model("a/m", None) == "a/m"
    assert choose_model("a/m", "/x/m") == "/x/m"
    with pytest.raises(InvalidInput, match="records no model"):
        choose_model(None, None)
    assert choose_model(None, "b/n") == "b/n"
    with pytest.raises(InvalidInput, match="allow_model_mismatch"):
        choose_model("a/m", "b/n")
    assert choose_model("a/m", "b/n", allow_mismatch=True) == "b/n"


@pytest.fixture(scope="module")
def clip_index(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from hubless.encoders import load_encoder
    from tests.models import WORDS, save_tiny

    root = tmp_path_factory.mktemp("facade-clip")
    model = save_tiny("clip", root / "clip")
    encoder = load_encoder(model, device="cpu")
    rng = np.random.default_rng(4)
    captions = [" ".join(rng.choice(WORDS[4:], 5)) for _ in range(50)]
    bank = [" ".join(rng.choice(WORDS[4:], 5)) for _ in range(80)]
    index = hubless.Index.build(encoder.encode_texts(captions), encoder.encode_texts(bank), "nnn:alpha=0.5,k=4", "Flat",
                                metadata=[{"caption": c} for c in captions], model=str(model))  # fmt: skip
    index.save(root / "idx")
    return root, model, encoder


def test_text_queries_use_the_model_the_index_records(clip_index):
    root, model, encoder = clip_index
    searcher = Searcher(root / "idx", device="cpu")
    texts = ["a red dog on the grass", "two cats near a car"]
    result = searcher.search(texts=texts, top_k=5)
    np.testing.assert_array_equal(result.ids, hubless.Index.load(root / "idx").search(encoder.encode_texts(texts), 5)[1])
    assert result.records()[1]["text"] == texts[1]
    assert searcher.query_kinds() == ["embeddings", "item", "texts", "images"]


def test_the_service_encodes_with_the_recorded_model_without_model_option(clip_index):
    """`hubless serve` without --model: text search works out of the box (issue 30)."""
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from hubless.service import create_app

    root, _, encoder = clip_index
    texts = ["a blue car on the street"]
    with TestClient(base_url="http://localhost", app=create_app({"idx": root / "idx"})) as c:
        info = c.get("/indexes").json()[0]
        assert "texts" in info["queries"]
        body = c.post("/search", json={"texts": texts, "top_k": 4, "compare": True}).json()
    expected = hubless.Index.load(root / "idx").search(encoder.encode_texts(texts), 4)[1]
    assert [h["id"] for h in body["results"][0]["hits"]] == expected[0].tolist()
    assert body["results"][0]["text"] == texts[0]


def test_image_queries_over_http_equal_in_process(clip_index, tmp_path):
    """An image query (base64 of a PNG) is encoded with the index's model, as in process."""
    pytest.importorskip("fastapi")
    import base64
    import io

    from starlette.testclient import TestClient

    from hubless.service import create_app
    from tests.models import random_images

    root, _, encoder = clip_index
    image = random_images(1)[0]
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    with TestClient(base_url="http://localhost", app=create_app({"idx": root / "idx"})) as c:
        assert "images" in c.get("/indexes").json()[0]["queries"]
        body = c.post("/search", json={"images": [base64.b64encode(buffer.getvalue()).decode()], "top_k": 4}).json()
        broken = c.post("/search", json={"images": [base64.b64encode(b"not an image").decode()]})
    expected = hubless.Index.load(root / "idx").search(encoder.encode_images([image]), 4)[1]
    assert [h["id"] for h in body["results"][0]["hits"]] == expected[0].tolist()
    assert broken.status_code == 422 and "images[0]" in broken.json()["detail"]


def test_the_cli_and_the_service_print_the_searchers_records(indexes, data, tmp_path):
    """One path: `hubless search --json` prints, and POST /search answers, Hits.records() of
    Searcher.search, itself Index.search (found slots only, the metadata of each hit)."""
    import json

    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from hubless.cli.main import app
    from hubless.service import create_app

    _, _, queries = data
    indexes["flat"].save(tmp_path / "flat")
    np.save(tmp_path / "q.npy", queries[:4])
    want = Searcher({"flat": tmp_path / "flat"}).search(embeddings=queries[:4], top_k=650)  # beyond the 600 items
    assert isinstance(want, hubless.Hits) and want.found[:, :600].all() and not want.found[:, 600:].any()
    records = json.loads(json.dumps(want.records()))
    assert [len(r["hits"]) for r in records] == [600] * 4 and records[0]["hits"][0]["metadata"]["caption"]
    done = CliRunner().invoke(app, ["search", str(tmp_path / "flat"), "--queries", str(tmp_path / "q.npy"), "--top-k", "650", "--json"])
    assert done.exit_code == 0, done.output
    assert [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")] == records
    with TestClient(base_url="http://localhost", app=create_app({"flat": tmp_path / "flat"})) as client:
        answer = client.post("/search", json={"embeddings": queries[:4].tolist(), "top_k": 650})
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"] == records
