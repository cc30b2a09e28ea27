"""The service's last holes (issue 41, items 1-4), each against a real `hubless serve` (uvicorn)
subprocess on 127.0.0.1 with bounded requests: a huge JSON body is refused off the event loop
(/health keeps answering within 100 ms, the server's memory stays bounded), a FIFO under
--image-root answers 404 at once, item ids beyond int64 are 4xx (never 500), every answer
including a 500 carries the security headers, input types are strict, weights finite and
bounded, and error messages echo input cut short."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("PIL")

import hubless  # noqa: E402
from hubless.service.body import MAX_DEPTH  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402
from tests.service.test_service import _free_port  # noqa: E402
from tests.service.test_service_security import READ, WRITE, Server, auth  # noqa: E402

SECURITY_HEADERS = ("content-security-policy", "x-content-type-options", "x-frame-options", "referrer-policy")


def _rss(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field}")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("hardening")
    rng = np.random.default_rng(5)
    images = root / "images"
    images.mkdir()
    Image.fromarray((rng.random((8, 8, 3)) * 255).astype(np.uint8)).save(images / "ok.png")
    os.mkfifo(images / "pipe.png")  # opened for reading, a FIFO blocks until a writer comes: never served
    meta = [{"path": "ok.png"}, {"path": "pipe.png"}] + [{"path": f"none{i}.png"} for i in range(2, 100)]
    hubless.Index.build(unit_rows(rng, 100, 16), unit_rows(rng, 200, 16), "dn:lam=0.5", "Flat", metadata=meta).save(root / "idx")
    (root / "write.key").write_text(WRITE)
    (root / "read.key").write_text(READ)
    server = Server(["idx", "--image-root", images, "--api-key-file", "write.key", "--read-key-file", "read.key",
                     "--max-batch", 64], cwd=root)  # fmt: skip
    yield root, server, rng
    server.stop()


def _health_latencies(server, stop: threading.Event, most: int = 400) -> list[float]:
    times: list[float] = []
    while not stop.is_set() and len(times) < most:
        t0 = time.perf_counter()
        status = server.request("GET", "/health", timeout=10)[0]
        times.append(time.perf_counter() - t0)
        assert status == 200
        time.sleep(0.01)
    return times


@pytest.mark.slow
def test_huge_bodies_are_refused_off_the_event_loop_with_bounded_memory(world):
    _, server, rng = world
    rows = b'{"embeddings": [' + b",".join([b"[0]"] * 2_000_000) + b"]}"  # 7.6 MiB, 2M rows (issue 41's body)
    flat = b'{"embeddings": [[' + b",".join([b"0"] * 3_900_000) + b"]]}"  # one row of 3.9M values
    deep = b'{"where": ' + b"[" * 200 + b"]" * 200 + b', "item": 1}'
    assert len(rows) < 8 * 2**20 and len(flat) < 8 * 2**20
    rss_before = _rss(server.proc.pid)
    quiet = _health_latencies(server, threading.Event(), most=30)  # the machine's own noise (a shared 2-core CI box)
    answers: list = []

    def post(body):
        answers.append(server.request("POST", "/search", body, headers={**auth(), "content-type": "application/json"}, timeout=60))

    stop = threading.Event()
    latencies: list[float] = []
    poller = threading.Thread(target=lambda: latencies.extend(_health_latencies(server, stop)))
    poller.start()
    time.sleep(0.1)
    posts = [threading.Thread(target=post, args=(body,)) for body in (rows, rows, flat, flat)]
    for t in posts:
        t.start()
    for t in posts:
        t.join(timeout=90)
    stop.set()
    poller.join(timeout=30)
    peak = _rss(server.proc.pid, "VmHWM")
    assert len(answers) == 4
    for status, headers, body in answers:
        detail = json.loads(body)["detail"]
        assert status == 422 and ("max_batch=64" in detail), detail
        assert all(h in headers for h in SECURITY_HEADERS)
    # /health answers within 100 ms beyond the slowest answer of a quiet server (before: stalled 3.7 s for one body,
    # 8.9 s for four); a tenth of the answers may be scheduling outliers of a shared 2-core machine (load ~12 when measured)
    slowest = sorted(latencies)
    p90 = slowest[int(0.9 * len(slowest)) - 1]
    assert len(slowest) >= 10 and p90 < 0.1 + max(quiet) and slowest[-1] < 0.5, (slowest[-5:], max(quiet))
    print(
        f"/health during the bodies: max {slowest[-1] * 1000:.0f} ms (quiet: {max(quiet) * 1000:.0f} ms); peak RSS +{peak - rss_before:.0f} MiB"
    )
    assert peak - rss_before < 120, (rss_before, peak)  # four 8 MiB bodies: their bytes, never 2M Python lists (was +466 MiB for one)
    status, _, body = server.request("POST", "/search", deep, headers={**auth(), "content-type": "application/json"})
    assert status == 422 and f"{MAX_DEPTH} deep" in json.loads(body)["detail"]
    legit = unit_rows(rng, 64, 16)  # the largest batch allowed still searches
    status, _, body = server.request("POST", "/search", {"embeddings": legit.tolist(), "top_k": 3}, headers=auth())
    assert status == 200 and len(json.loads(body)["results"]) == 64


def test_a_fifo_under_the_image_root_is_a_404_at_once(world):
    root, server, _ = world
    assert (root / "images" / "pipe.png").is_fifo()
    results: list = []

    def fetch():
        t0 = time.perf_counter()
        status = server.request("GET", "/items/idx/1/image", headers=auth(), timeout=10)[0]
        results.append((status, time.perf_counter() - t0))

    threads = [threading.Thread(target=fetch) for _ in range(40)]  # 40 of these hung every worker thread before
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert [s for s, _ in results] == [404] * 40 and max(t for _, t in results) < 5
    status, headers, body = server.request("GET", "/items/idx/0/image", headers=auth())
    assert status == 200 and body == (root / "images" / "ok.png").read_bytes() and headers["content-length"] == str(len(body))
    assert server.request("POST", "/search", {"item": 0, "top_k": 2}, headers=auth())[0] == 200


def test_ids_out_of_range_are_4xx_with_the_security_headers(world):
    _, server, _ = world
    for item in (2**63, 2**64, 10**30, -1):
        for path in (f"/items/idx/{item}", f"/items/idx/{item}/image"):
            status, headers, body = server.request("GET", path, headers=auth())
            assert status in (404, 422), (path, status, body)
            assert all(h in headers for h in SECURITY_HEADERS), path
    assert server.request("DELETE", f"/items/idx/{2**63}", headers=auth(WRITE))[0] == 422
    assert server.request("POST", "/search", {"item": 2**63}, headers=auth())[0] == 422
    added = server.request("POST", "/items/idx", {"embeddings": [[0.25] * 16], "ids": [2**63]}, headers=auth(WRITE))
    assert added[0] == 422 and "ids" in json.loads(added[2])["detail"]


def test_a_500_carries_the_security_headers(world):
    """An unexpected failure (a route that raises) on a real uvicorn server: the 500 answer has
    every security header, says nothing of the failure, and is counted in the metrics."""
    import uvicorn

    from hubless.service import create_app

    root, _, _ = world
    app = create_app({"idx": root / "idx"})

    @app.get("/boom")
    def boom():
        raise RuntimeError("a secret detail")

    port = _free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if server.started:
                break
            time.sleep(0.05)
        probe = Server.__new__(Server)
        probe.base = f"http://127.0.0.1:{port}"
        status, headers, body = probe.request("GET", "/boom")
        assert status == 500 and json.loads(body) == {"detail": "internal error; the server keeps running"}
        assert all(h in headers for h in SECURITY_HEADERS), dict(headers)
        assert "frame-ancestors 'none'" in headers["content-security-policy"] and headers["x-content-type-options"] == "nosniff"
        assert probe.request("GET", "/health")[0] == 200
        metrics = probe.request("GET", "/metrics")[2].decode()
        assert 'hubless_requests_total{endpoint="/boom",method="GET",status="500"} 1.0' in metrics
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"item": 1, "top_k": "3"}, "top_k"),
        ({"item": 1, "top_k": True}, "top_k"),
        ({"item": 1, "top_k": 3.0}, "top_k"),
        ({"item": True}, "item"),
        ({"item": 1, "weight": 1e39}, "weight"),
        ({"item": 1, "weight": "0.5"}, "weight"),
        ({"item": 1, "weight": True}, "weight"),
        ({"item": 1, "compare": 1}, "compare"),
        ({"embeddings": [["0.1"] * 16]}, "embeddings"),
        ({"embeddings": [[True] * 16]}, "embeddings"),
        ({"texts": "a dog"}, "texts"),
        ([1, 2], "JSON object"),
    ],
)
def test_types_are_strict_and_weights_bounded(world, body, named):
    _, server, _ = world
    status, _, answer = server.request("POST", "/search", body, headers=auth())
    assert status == 422 and named in json.loads(answer)["detail"], answer


def test_bounded_weights_and_short_echoes(world):
    _, server, _ = world
    assert server.request("POST", "/search", {"item": 1, "weight": 1000.0}, headers=auth())[0] == 200
    queries = np.zeros((1, 16), "<f4").tobytes()
    binary = {**auth(), "content-type": "application/octet-stream"}
    assert server.request("POST", "/search/binary?weight=1e39", queries, headers=binary)[0] == 422
    assert server.request("POST", "/search/binary?top_k=0", queries, headers=binary)[0] == 422
    key = "k" * (4 * 2**20)  # a 4 MiB unknown field
    status, _, answer = server.request("POST", "/search", {"item": 1, key: 1}, headers=auth())
    assert status == 422 and len(answer) < 2000 and "4194304 characters" in json.loads(answer)["detail"]
    status, _, answer = server.request("GET", "/indexes/" + "n" * 20_000, headers=auth())
    assert status == 404 and len(answer) < 2000
    form = {**auth(), "content-type": "text/plain"}  # what a browser form may send cross-site
    assert server.request("POST", "/search", b'{"item": 1}', headers=form)[0] == 415
    charset = {**auth(), "content-type": "application/json; charset=utf-8"}
    assert server.request("POST", "/search", b'{"item": 1}', headers=charset)[0] == 200
    too_many = {"embeddings": [[0.25] * 16] * 65}  # writes have the same limits, checked before pydantic
    status, _, answer = server.request("POST", "/items/idx", too_many, headers=auth(WRITE))
    assert status == 422 and "max_batch=64" in json.loads(answer)["detail"]
