"""The HTTP API: every endpoint and every error with FastAPI's TestClient, the same results as
Index.search in process, and a real uvicorn server on a free loopback port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("fastapi")

from starlette.testclient import TestClient  # noqa: E402

import hubless  # noqa: E402
from hubless.service import Limits, create_app  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    rng = np.random.default_rng(9)
    gallery, bank, queries = unit_rows(rng, 400, 16), unit_rows(rng, 800, 16), unit_rows(rng, 20, 16)
    meta = [{"path": f"img{i}.jpg", "caption": f"item {i}"} for i in range(400)]
    hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=8", "Flat", metadata=meta).save(root / "coco")
    hubless.Index.build(gallery, bank, "is:beta=20.0", "IVF8,Flat", nprobe=8).save(root / "ivf")
    return root, queries


@pytest.fixture(scope="module")
def client(saved):
    root, _ = saved
    app = create_app({"coco": root / "coco", "ivf": root / "ivf"}, limits=Limits(max_batch=8, max_top_k=50, max_body_bytes=64_000))
    with TestClient(base_url="http://localhost", app=app, raise_server_exceptions=False) as c:
        yield c


def test_search_equals_index_search_in_process(client, saved):
    root, queries = saved
    index = hubless.Index.load(root / "coco")
    response = client.post("/search", json={"index": "coco", "embeddings": queries[:5].tolist(), "top_k": 7, "weight": 0.3})
    assert response.status_code == 200, response.text
    scores, ids = index.search(queries[:5], 7, weight=0.3)
    body = response.json()
    assert body["method"] == "nnn:alpha=0.75,k=8"
    for row, result in enumerate(body["results"]):
        assert [h["id"] for h in result["hits"]] == ids[row].tolist()
        np.testing.assert_allclose([h["score"] for h in result["hits"]], scores[row], rtol=1e-6)
        assert result["hits"][0]["metadata"] == index.metadata[ids[row][0]]


def test_compare_gives_the_uncorrected_ranking_and_rank_changes(client, saved):
    root, queries = saved
    body = client.post("/search", json={"index": "coco", "embeddings": queries[:3].tolist(), "top_k": 10, "compare": True}).json()
    gallery = hubless.Index.load(root / "coco").correction.gallery_
    raw = np.argsort(-(queries[:3] @ gallery.T), axis=1, kind="stable")[:, :10]
    for row, result in enumerate(body["results"]):
        assert [h["id"] for h in result["uncorrected"]] == raw[row].tolist()
        before = {j: r for r, j in enumerate(raw[row].tolist(), start=1)}
        for rank, hit in enumerate(result["hits"], start=1):
            assert hit["uncorrected_rank"] == before.get(hit["id"])
            assert hit["rank_change"] == (None if hit["id"] not in before else before[hit["id"]] - rank)


def test_more_like_this_and_items(client):
    body = client.post("/search", json={"index": "coco", "item": 42, "top_k": 3, "weight": 0.0}).json()
    assert body["results"][0]["hits"][0]["id"] == 42  # uncorrected, an item is its own nearest neighbour
    assert client.get("/items/coco/42").json() == {"id": 42, "metadata": {"path": "img42.jpg", "caption": "item 42"}}
    assert client.get("/items/ivf/3").json()["metadata"] is None


def test_descriptions_health_and_metrics(client):
    names = [i["name"] for i in client.get("/indexes").json()]
    assert names == ["coco", "ivf"]
    info = client.get("/indexes/ivf").json()
    assert info["n_items"] == 400 and info["factory"] == "IVF8,Flat" and info["banks"]["query_bank"] == 800 and info["format_version"] >= 4
    assert client.get("/health").json()["status"] == "ok"
    assert client.post("/search", json={"index": "coco", "item": 1}).status_code == 200
    metrics = client.get("/metrics")
    text = metrics.text
    assert metrics.headers["content-type"].startswith("text/plain; version=")  # the exposition format, versioned
    assert 'hubless_requests_total{endpoint="/search",method="POST",status="200"}' in text
    assert 'hubless_request_duration_seconds_bucket{endpoint="/search",le="0.001"}' in text


@pytest.mark.parametrize(
    "payload, status, message",
    [
        ({"index": "nope", "item": 1}, 404, "no index named"),
        ({"index": "coco", "item": 400}, 404, "has no item 400"),
        ({"index": "coco", "embeddings": [[0.1] * 15]}, 422, "dimension 16"),
        ({"index": "coco", "embeddings": [[0.1] * 16] * 9}, 422, "max_batch=8"),
        ({"index": "coco", "item": 1, "top_k": 51}, 422, "max_top_k=50"),
        ({"index": "coco", "item": 1, "top_k": 0}, 422, "top_k"),
        ({"index": "coco", "texts": ["a dog"]}, 422, "records no model"),
        ({"index": "coco"}, 422, "exactly one of"),
        ({"index": "ivf", "item": 1, "weight": 0.5}, 422, "no query-time weight"),
        ({"index": "coco", "item": 1, "weight": -1}, 422, "weight"),
        ({"item": 1}, 422, "several indexes are served"),
    ],
)
def test_bad_requests_are_4xx_json(client, payload, status, message):
    response = client.post("/search", json=payload)
    assert response.status_code == status and message in response.json()["detail"], response.text


def test_malformed_and_oversized_bodies(client):
    nan = client.post(
        "/search", content='{"index": "coco", "embeddings": [[NaN' + ", 0.1" * 15 + "]]}", headers={"content-type": "application/json"}
    )
    assert nan.status_code == 422 and "NaN" in nan.json()["detail"]
    broken = client.post("/search", content="{not json", headers={"content-type": "application/json"})
    assert broken.status_code == 422 and "invalid request" in broken.json()["detail"]
    big = client.post("/search", json={"index": "coco", "embeddings": [[0.1] * 16] * 2000})
    assert big.status_code == 413 and "max_body_bytes" in big.json()["detail"]
    assert client.get("/items/coco/abc").status_code == 422


def test_api_key_protects_everything_but_health_and_the_page(saved):
    root, _ = saved
    with TestClient(base_url="http://localhost", app=create_app({"coco": root / "coco"}, api_key="k" * 20)) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/indexes").status_code == 401
        assert c.get("/indexes", headers={"X-API-Key": "k" * 20}).status_code == 401  # Bearer only
        assert c.get("/indexes", headers={"Authorization": "k" * 20}).status_code == 401
        assert c.get("/indexes", headers={"Authorization": "Bearer " + "k" * 20}).status_code == 200
        assert c.post("/search", json={"item": 1}, headers={"Authorization": "Bearer " + "k" * 20}).status_code == 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_a_real_server(saved, tmp_path):
    root, queries = saved
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hubless", "serve", f"coco={root / 'coco'}", str(root / "ivf"), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(200):  # wait for start-up, bounded
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        index = hubless.Index.load(root / "ivf")
        for i in range(5):  # a bounded number of requests
            body = _post(base + "/search", {"index": "ivf", "embeddings": queries[i : i + 1].tolist(), "top_k": 5})
            assert [h["id"] for h in body["results"][0]["hits"]] == index.search(queries[i : i + 1], 5)[1][0].tolist()
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(base + "/search", {"index": "ivf", "embeddings": [[0.0] * 3]})
        assert err.value.code == 422 and "Traceback" not in err.value.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_serve_refuses_a_public_address_without_a_key(saved):
    root, _ = saved
    done = subprocess.run(
        [sys.executable, "-m", "hubless", "serve", str(root / "coco"), "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "--api-key-file" in done.stderr


@pytest.mark.slow
def test_demo_serve_starts_the_page(tmp_path):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "hubless", "demo", "--n-items", "200", "--report", "", "--serve", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)  # fmt: skip
    try:
        for _ in range(600):  # the demo evaluates first, then serves: bounded wait
            try:
                page = urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).read().decode()
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        else:
            pytest.fail("the demo server did not start")
        assert "<title>hubless search</title>" in page
        assert _post(f"http://127.0.0.1:{port}/search", {"item": 3, "top_k": 2, "weight": 0.0})["results"][0]["hits"][0]["id"] == 3
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_concurrent_single_queries_are_batched(saved, monkeypatch):
    """32 concurrent one-query requests: every answer equals Index.search for that query, and
    they ran as fewer, batched searches."""
    import concurrent.futures

    root, queries = saved
    rng = np.random.default_rng(3)
    many = unit_rows(rng, 32, 16)
    app = create_app({"coco": root / "coco"})
    calls = []
    real_search = hubless.Index.search

    def counting_search(self, q, top_k, **weight):
        calls.append(q.shape[0])
        return real_search(self, q, top_k, **weight)

    expected = hubless.Index.load(root / "coco").search(many, 5)[1]
    monkeypatch.setattr(hubless.Index, "search", counting_search)  # a request searches the version it pinned
    with TestClient(base_url="http://localhost", app=app) as c, concurrent.futures.ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(lambda i: c.post("/search", json={"embeddings": many[i : i + 1].tolist(), "top_k": 5}).json(), range(32)))
    for i, body in enumerate(answers):
        assert [h["id"] for h in body["results"][0]["hits"]] == expected[i].tolist()
    assert sum(calls) == 32 and len(calls) < 32  # batched: fewer searches than requests


def test_text_search_with_reranking(tmp_path):
    """--model encodes text queries; --rerank reranks the corrected top k with a cross-encoder,
    exactly as hubless.rerank.Pipeline does in process."""
    pytest.importorskip("sentence_transformers")
    import transformers as tf

    from hubless.encoders import load_encoder
    from hubless.rerank import Pipeline, load_reranker
    from tests.models import WORDS, save_tiny, tokenizer

    clip = save_tiny("clip", tmp_path / "clip")
    encoder = load_encoder(clip, device="cpu")
    rng = np.random.default_rng(5)
    captions = [" ".join(rng.choice(WORDS[4:], 5)) for _ in range(60)]
    bank = [" ".join(rng.choice(WORDS[4:], 5)) for _ in range(120)]
    index = hubless.Index.build(encoder.encode_texts(captions), encoder.encode_texts(bank), "nnn:alpha=0.5,k=4", "Flat",
                                metadata=[{"caption": c} for c in captions], model=str(clip))  # fmt: skip
    index.save(tmp_path / "idx")
    cfg = tf.BertConfig(vocab_size=len(tokenizer().get_vocab()), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=32, num_labels=1)  # fmt: skip
    tf.BertForSequenceClassification(cfg).save_pretrained(tmp_path / "ce")
    tokenizer().save_pretrained(tmp_path / "ce")
    reranker = load_reranker(tmp_path / "ce", device="cpu")
    app = create_app({"idx": tmp_path / "idx"}, encoder=encoder, reranker=reranker, rerank_k=10)
    texts = ["a red dog on the grass", "two cats near a car"]
    with TestClient(base_url="http://localhost", app=app) as c:
        plain = c.post("/search", json={"texts": texts, "top_k": 5}).json()
        reranked = c.post("/search", json={"texts": texts, "top_k": 5, "rerank": True}).json()
        assert c.post("/search", json={"item": 3, "rerank": True}).status_code == 422
    q = encoder.encode_texts(texts)
    assert [[h["id"] for h in r["hits"]] for r in plain["results"]] == index.search(q, 5)[1].tolist()
    direct = Pipeline(hubless.Index.load(tmp_path / "idx"), reranker, k=10, gallery_items=captions).search(q, texts, top_k=5)
    assert reranked["reranked"] and [[h["id"] for h in r["hits"]] for r in reranked["results"]] == direct.ids.tolist()
    with TestClient(base_url="http://localhost", app=create_app({"idx": tmp_path / "idx"}, encoder=encoder)) as c:
        assert "--rerank" in c.post("/search", json={"texts": texts, "rerank": True}).json()["detail"]


def test_hubness_endpoint_matches_a_direct_count(client, saved):
    root, _ = saved
    index = hubless.Index.load(root / "coco")
    body = client.get("/hubness/coco").json()
    bank = index.query_bank
    before = np.bincount(np.argmax(bank @ index.correction.gallery_.T, axis=1), minlength=index.ntotal)
    after = np.bincount(index.search(bank, 1)[1][:, 0], minlength=index.ntotal)
    assert body["n_bank_queries"] == bank.shape[0] and body["before"]["max"] == before.max() and body["after"]["max"] == after.max()
    top = body["hubs"][0]
    assert top["n1_before"] == before.max() and top["n1_after"] == after[top["id"]] and top["metadata"] == index.metadata[top["id"]]
    assert body["histogram"]["before"] == np.bincount(before).tolist()
    assert client.get("/hubness/nope").status_code == 404


def test_served_hubness_matches_a_direct_count(saved):
    """/hubness's `served` figures and /metrics's served gauges against counts made here from
    the answers themselves (scipy's skewness)."""
    from scipy.stats import skew

    root, _ = saved
    rng = np.random.default_rng(11)
    queries = unit_rows(rng, 60, 16)
    with TestClient(base_url="http://localhost", app=create_app({"coco": root / "coco"})) as c:
        answers = [c.post("/search", json={"embeddings": queries[i : i + 3].tolist(), "top_k": 5}).json() for i in range(0, 60, 3)]
        served = c.get("/hubness/coco").json()["served"]
        metrics = c.get("/metrics").text
    ids = np.array([[h["id"] for h in r["hits"]] for a in answers for r in a["results"]])
    n1 = np.bincount(ids[:, 0], minlength=400)
    nk = np.bincount(ids.ravel(), minlength=400)
    assert served["queries"] == 60 and served["n1_max"] == n1.max()
    assert served["n1_skewness"] == pytest.approx(skew(n1), rel=1e-9)
    assert served["top1pct_share"] == pytest.approx(np.sort(nk)[::-1][:4].sum() / nk.sum())
    assert served["hubs"][0]["n1"] == n1.max() and served["hubs"][0]["nk"] == nk[served["hubs"][0]["id"]]
    line = next(x for x in metrics.splitlines() if x.startswith('hubless_served_n1_skewness{index="coco"}'))
    assert float(line.split()[-1]) == pytest.approx(skew(n1), rel=1e-9)


def test_serve_refuses_bad_security_settings_before_starting(saved, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    root, _ = saved
    (tmp_path / "short.key").write_text("abc")
    (tmp_path / "good.key").write_text("g" * 32)
    cases = [
        (["--api-key-file", str(tmp_path / "short.key")], "at least 16"),
        (["--read-key-file", str(tmp_path / "good.key")], "needs a write key"),
        (["--api-key-file", str(tmp_path / "good.key"), "--read-key-file", str(tmp_path / "good.key")], "must differ"),
        (["--image-root", str(tmp_path / "nowhere")], "not a folder"),
        (["--max-top-k", "0"], "max_top_k"),
        (["--lock-timeout", "0"], "lock_timeout"),
    ]
    for extra, message in cases:
        result = CliRunner().invoke(app, ["serve", str(root / "coco"), *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)
