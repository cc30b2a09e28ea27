"""``hubless serve --learn-bank`` against a real uvicorn server on 127.0.0.1 (bounded requests and
time): it learns the query bank from real POST /search requests of several clients (told apart
by the address a trusted proxy forwards), commits the refit as a new version that it then serves
(equal to an offline build on the learned bank), keeps the version it came from, writes an
audit line and metrics per decision, shows the history on /hubness, and forgets on reset; and
the settings' errors (a read-only collection, several workers)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("PIL")

import hubless  # noqa: E402
from hubless.data.synthetic import make_retrieval_data  # noqa: E402
from tests.index.test_live_index import assert_same_results  # noqa: E402
from tests.service.test_service_security import SRC, WRITE, Server, auth  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def learning(tmp_path_factory):
    root = tmp_path_factory.mktemp("learn")
    data = make_retrieval_data(400, dim=16, n_query_bank=3000, seed=6)
    far = make_retrieval_data(100, dim=16, n_query_bank=400, seed=9).query_bank
    hubless.Index.build(data.gallery, far, "nnn:alpha=0.75,k=8", "Flat").save(root / "idx")
    (root / "write.key").write_text(WRITE)
    server = Server(
        [
            "idx",
            "--learn-bank",
            "idx",
            "--api-key-file",
            "write.key",
            "--audit-log",
            root / "audit.jsonl",
            "--trusted-proxy",
            "127.0.0.1",
            "--rate-limit",
            0,
            "--learn-bank-every",
            600,
            "--learn-bank-capacity",
            1000,
            "--learn-bank-holdout",
            0.2,
            "--learn-bank-interval",
            3600,
        ],
        cwd=root,
    )
    yield root, server, data
    server.stop()


def _search(server, rows, client):
    status, _, body = server.request(
        "POST", "/search", {"embeddings": rows.tolist(), "top_k": 5}, headers={"X-Forwarded-For": client, **auth(WRITE)}
    )
    assert status == 200, body
    return json.loads(body)


def _hubness(server):
    status, _, body = server.request("GET", "/hubness/idx", headers=auth(WRITE))
    assert status == 200, body
    return json.loads(body)


def _drained(server) -> dict:
    """The learning figures once what was sent is admitted (bounded wait)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _hubness(server)["learning"]["queued"]:
        time.sleep(0.1)
    return _hubness(server)["learning"]


def test_the_server_learns_from_real_searches_and_serves_the_new_version(learning):
    root, server, data = learning
    for i in range(0, 1000, 10):  # 100 requests from 25 clients: 800 bank queries at most, past --learn-bank-every
        _search(server, data.query_bank[i : i + 10], f"198.51.100.{i // 10 % 25}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not _hubness(server)["learning"]["history"]:
        time.sleep(0.2)  # the background thread refits by itself after 600 new bank queries
    learned = _hubness(server)["learning"]
    assert learned["history"], learned
    first = learned["history"][0]
    assert first["decision"] == "accepted", first["reasons"]
    assert first["bank"]["clients"] == 25 and first["holdout"] >= 50
    assert first["after"]["n10_skewness"] <= first["before"]["n10_skewness"] + 0.05
    # the new version is served: a search equals an offline build on the bank it learned
    on_disk = hubless.Index.load(root / "idx")
    assert on_disk.query_bank.shape[0] == first["bank"]["size"]
    offline = hubless.Index.build(data.gallery, on_disk.query_bank, "nnn:alpha=0.75,k=8")
    answer = _search(server, data.queries[:20], "203.0.113.1")
    served_ids = np.array([[hit["id"] for hit in q["hits"]] for q in answer["results"]])
    served_scores = np.array([[hit["score"] for hit in q["hits"]] for q in answer["results"]], np.float32)
    assert_same_results(served_scores, served_ids, *offline.search(data.queries[:20], 5))  # to float rounding, ties aside
    versions = json.loads(server.request("GET", "/versions/idx", headers=auth(WRITE))[2])["versions"]
    assert [v["version"] for v in versions if v["current"]] == [first["version"]] and first["from_version"] in [
        v["version"] for v in versions
    ]
    audit = [json.loads(line) for line in (root / "audit.jsonl").read_text().splitlines()]
    refits = [a for a in audit if a["method"] == "REFIT"]
    assert refits and refits[0]["ids"]["decision"] == "accepted" and refits[0]["ids"]["version"] == first["version"]
    # a flood of one query counts once; an item query ("more like this") is not learned at all
    offered = _drained(server)["reservoir"]["offered"]
    _search(server, np.repeat(data.query_bank[2000:2001], 10, axis=0), "192.0.2.7")
    status, _, body = server.request("POST", "/search", {"item": 3, "top_k": 5}, headers={"X-Forwarded-For": "192.0.2.8", **auth(WRITE)})
    assert status == 200, body
    now = _drained(server)["reservoir"]["offered"]
    assert now["folded"] - offered["folded"] >= 9 and sum(now.values()) - sum(offered.values()) == 10
    metrics = server.request("GET", "/metrics", headers=auth(WRITE))[2].decode()
    assert 'hubless_learned_bank_refits_total{decision="accepted",index="idx"} 1.0' in metrics
    assert 'hubless_learned_bank_clients{index="idx"}' in metrics
    # reset: the queries learned are forgotten; the version served stays
    status, _, body = server.request("POST", "/bank/idx/reset", headers=auth(WRITE))
    assert status == 200 and json.loads(body)["reservoir"]["traffic"] == 0
    assert _hubness(server)["learning"]["reservoir"]["held_out"] == 0
    assert server.request("POST", "/bank/idx/reset")[0] == 401  # a write: the key is needed


def test_settings_that_cannot_learn_are_refused(tmp_path):
    data = make_retrieval_data(50, dim=8, n_query_bank=200, seed=1)
    hubless.Index.build(data.gallery, data.query_bank, "nnn:k=4").save(tmp_path / "idx")
    for args, words in ((["--learn-bank", "other"], "no index of that name"), (["--learn-bank", "idx", "--workers", "2"], "--workers 1")):
        run = subprocess.run(
            [sys.executable, "-m", "hubless", "serve", "idx", "--port", "1", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
        )
        assert run.returncode == 2 and words in run.stderr, run.stderr
