"""The service on a network (issue 29), each hole as a regression test against a real
`hubless serve` (uvicorn) subprocess on 127.0.0.1 with bounded requests and time: images only
from --image-root (symlink, `..`, absolute and non-image escapes are 404s that say nothing about
the disk), a chunked oversize body refused early with the server's memory checked, the Host
header, security headers, no server path in any answer, Bearer-only keys with a read-only key,
keys never in the environment, an audit log of writes, 503 + Retry-After on a held lock,
unknown fields refused, slow connections dropped while searches go on, CORS off by default,
binary and base64 queries, and metrics summed over --workers."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("PIL")

import hubless  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402
from tests.service.test_service import _free_port  # noqa: E402

SRC = str(Path(__file__).resolve().parents[2] / "src")
WRITE, READ = "write-key-0123456789abcdef", "read-key-0123456789abcdef"


class Server:
    def __init__(self, args, cwd, env=None):
        self.port = _free_port()
        env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", "hubless", "serve", *map(str, args), "--port", str(self.port)], cwd=cwd,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.base = f"http://127.0.0.1:{self.port}"
        for _ in range(300):  # bounded wait for start-up
            if self.proc.poll() is not None:
                pytest.fail(f"the server stopped: {self.proc.stdout.read()}")
            try:
                self.request("GET", "/health")
                return
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        self.stop()
        pytest.fail("the server did not start")

    def request(self, method, path, body=None, headers=None, timeout=30):
        """(status, headers, body bytes); HTTP errors are answers, not exceptions."""
        data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
        h = {"content-type": "application/json"} if isinstance(body, (dict, list)) else {}
        req = urllib.request.Request(self.base + path, data=data, method=method, headers={**h, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("secure")
    rng = np.random.default_rng(3)
    images = root / "images"
    (images / "sub").mkdir(parents=True)
    Image.fromarray((rng.random((16, 16, 3)) * 255).astype(np.uint8)).save(images / "sub" / "ok.png")
    secret = root / "secret.png"  # outside the root, with an image name
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(secret)
    (images / "escape.png").symlink_to(secret)  # a symlink leaving the root
    (images / "inside.png").symlink_to(images / "sub" / "ok.png")  # a symlink staying inside
    (images / "fake.png").write_text("not an image")  # an image name, not image content
    (images / "notes.txt").write_text("text")
    paths = ["sub/ok.png", "escape.png", "../secret.png", str(secret), "inside.png", "fake.png", "notes.txt", "sub/../sub/ok.png"]
    meta = [{"path": paths[i]} if i < len(paths) else {"caption": f"item {i}"} for i in range(200)]
    gallery, bank = unit_rows(rng, 200, 16), unit_rows(rng, 400, 16)
    hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=8", "IVF4,Flat", metadata=meta, nprobe=4).save(root / "idx")
    (root / "write.key").write_text(WRITE + "\n")
    (root / "read.key").write_text(READ)
    server = Server(["idx", "--image-root", images, "--api-key-file", "write.key", "--read-key-file", "read.key",
                     "--audit-log", root / "audit.jsonl", "--max-body-bytes", 2**20, "--max-batch", 64, "--max-result-hits", 2000,
                     "--max-text-chars", 50, "--lock-timeout", 1, "--header-timeout", 2, "--body-timeout", 3], cwd=root)  # fmt: skip
    yield root, server, rng
    server.stop()


def auth(key=READ):
    return {"Authorization": f"Bearer {key}"}


def test_images_only_from_the_image_root(world):
    root, server, _ = world
    ok = server.request("GET", "/items/idx/0/image", headers=auth())
    assert ok[0] == 200 and ok[1]["content-type"] == "image/png" and ok[2] == (root / "images" / "sub" / "ok.png").read_bytes()
    assert server.request("GET", "/items/idx/4/image", headers=auth())[0] == 200  # a symlink inside the root
    for item in (1, 2, 3, 5, 6, 7, 100):  # symlink out, `..`, absolute, fake image, text, `..` at all, no path
        status, _, body = server.request("GET", f"/items/idx/{item}/image", headers=auth())
        assert status == 404, item
        assert str(root) not in body.decode() and "secret" not in body.decode() and "/" not in json.loads(body)["detail"].replace("idx", "")


def test_a_chunked_oversize_body_is_refused_early_with_bounded_memory(world):
    _, server, _ = world
    rss_before = server.rss_mib()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(
        f"POST /search HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {READ}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    )
    chunk = b"[" + b"0.1," * 65_000  # 260 kB per chunk, never a valid body
    sent, answer = 0, b""
    sock.setblocking(False)
    while sent < 64 * 2**20:  # at most 64 MiB, stop at the answer
        try:
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
        except (BlockingIOError, BrokenPipeError, ConnectionResetError):
            time.sleep(0.01)
        try:
            answer += sock.recv(4096)
        except (BlockingIOError, ConnectionResetError):
            pass
        if answer:
            break
    sock.setblocking(True)
    sock.settimeout(5)
    try:
        answer += sock.recv(4096)
    except OSError:
        pass
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"max_body_bytes=1048576" in answer
    assert sent < 16 * 2**20  # answered soon after the limit, not after reading everything
    assert server.rss_mib() - rss_before < 40


def test_hosts_headers_cors_and_bearer_only(world):
    _, server, _ = world
    status, headers, _ = server.request("GET", "/indexes", headers={**auth(), "Host": "evil.example"})
    assert status == 400  # DNS rebinding: a foreign Host header
    status, headers, _ = server.request("GET", "/indexes", headers={**auth(), "Host": f"localhost:{server.port}"})
    assert status == 200
    for path in ("/", "/indexes", "/nope", "/docs"):
        status, headers, _ = server.request("GET", path, headers={**auth(), "Origin": "http://evil.example"})
        csp = headers["content-security-policy"]
        assert (
            "frame-ancestors 'none'" in csp
            and "script-src 'self'" in csp
            and "unsafe-inline" not in csp.split("script-src")[1].split(";")[0]
        )
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
        assert "access-control-allow-origin" not in headers  # CORS is off
        assert "server" not in headers  # no internal name
    assert server.request("GET", "/indexes")[0] == 401
    assert server.request("GET", "/indexes", headers={"Authorization": READ})[0] == 401  # no scheme
    assert server.request("GET", "/indexes", headers={"X-API-Key": READ})[0] == 401
    assert server.request("GET", "/indexes", headers={"Authorization": "Basic " + READ})[0] == 401
    assert server.request("GET", "/indexes", headers=auth("x" * 30))[0] == 401
    assert server.request("GET", "/health")[0] == 200 and server.request("GET", "/")[0] == 200  # open
    assert server.request("POST", "/search", {"item": 1}, headers=auth(READ))[0] == 200
    assert server.request("POST", "/search", {"item": 1}, headers=auth(WRITE))[0] == 200
    assert server.request("POST", "/bank/idx", {"embeddings": [[0.25] * 16]}, headers=auth(READ))[0] == 403  # the read key cannot write


def test_keys_are_never_in_the_environment(world):
    _, server, _ = world
    environ = Path(f"/proc/{server.proc.pid}/environ").read_bytes()
    assert WRITE.encode() not in environ and READ.encode() not in environ


def test_limits_are_named_and_unknown_fields_refused(world):
    _, server, rng = world
    cases = [
        ({"item": 1, "bogus": True}, "bogus"),
        ({"texts": ["x" * 51]}, "max_text_chars=50"),
        ({"embeddings": unit_rows(rng, 65, 16).tolist()}, "max_batch=64"),
        ({"embeddings": unit_rows(rng, 60, 16).tolist(), "top_k": 20, "compare": True}, "max_result_hits=2000"),
        ({"embeddings_b64": "###"}, "base64"),
    ]
    for body, named in cases:
        status, _, answer = server.request("POST", "/search", body, headers=auth())
        assert status == 422 and named in json.loads(answer)["detail"], (body.keys(), answer)


def test_binary_and_base64_queries_equal_json_ones(world):
    root, server, rng = world
    queries = unit_rows(rng, 3, 16)
    plain = json.loads(server.request("POST", "/search", {"embeddings": queries.tolist(), "top_k": 5}, headers=auth())[2])
    b64 = base64.b64encode(queries.astype("<f4").tobytes()).decode()
    coded = json.loads(server.request("POST", "/search", {"embeddings_b64": b64, "top_k": 5}, headers=auth())[2])
    raw = json.loads(
        server.request(
            "POST",
            "/search/binary?top_k=5",
            queries.astype("<f4").tobytes(),
            headers={**auth(), "content-type": "application/octet-stream"},
        )[2]
    )
    ids = hubless.Index.load(root / "idx").search(queries, 5)[1].tolist()
    for body in (plain, coded, raw):
        assert [[h["id"] for h in r["hits"]] for r in body["results"]] == ids


def test_writes_are_audited_and_a_held_lock_is_a_quick_503(world):
    from hubless.index.lock import write_lock

    root, server, rng = world
    status, _, body = server.request("POST", "/bank/idx", {"embeddings": unit_rows(rng, 2, 16).tolist()}, headers=auth(WRITE))
    assert status == 200, body
    record = json.loads((root / "audit.jsonl").read_text().splitlines()[-1])
    assert record["key"] == "write" and record["endpoint"] == "/bank/{name}" and record["index"] == "idx" and record["method"] == "POST"
    with write_lock(root / "idx"):  # another writer holds the index
        t0 = time.perf_counter()
        status, headers, body = server.request("POST", "/bank/idx", {"embeddings": unit_rows(rng, 2, 16).tolist()}, headers=auth(WRITE))
        waited = time.perf_counter() - t0
    assert status == 503 and headers["retry-after"] and waited < 5, (status, body, waited)
    assert str(root) not in body.decode()
    records = [json.loads(line) for line in (root / "audit.jsonl").read_text().splitlines()]
    assert [r["status"] for r in records].count(200) == 1  # a failed write is not recorded as done
    assert {r["status"] for r in records} <= {200, 401, 403}  # refused ones are (the read key's 403 above), the 503 is not


def test_no_server_path_in_any_error(world):
    root, server, _ = world
    probes = [
        ("GET", "/indexes/nope", None),
        ("GET", "/items/idx/99999", None),
        ("GET", "/items/idx/abc", None),
        ("POST", "/search", b"{broken"),
        ("POST", "/search", {"index": "idx", "embeddings": [[float("nan")] * 16]}),
        ("POST", "/search", {"texts": ["a dog"]}),
        ("DELETE", "/items/idx/99999", None),
        ("GET", "/indexes/idx", None),
        ("GET", "/hubness/idx", None),
    ]
    for method, path, body in probes:
        headers = {**auth(WRITE), "content-type": "application/json"} if isinstance(body, bytes) else auth(WRITE)
        status, _, answer = server.request(method, path, body, headers=headers)
        text = answer.decode()
        assert str(root) not in text and "/tmp" not in text and "Traceback" not in text, (path, text)


def test_slow_connections_are_dropped_while_searches_go_on(world):
    _, server, rng = world
    slow = []
    for _ in range(30):  # idle and trickling connections
        s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        s.sendall(b"POST /search HTTP/1.1\r\nHost: localhost\r\n")  # headers never finished
        slow.append(s)
    body = socket.create_connection(("127.0.0.1", server.port), timeout=10)  # headers done, body never sent
    body.sendall(f"POST /search HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {READ}\r\nContent-Length: 500\r\n\r\n{{".encode())
    served = []

    def search():
        t0 = time.perf_counter()
        status = server.request("POST", "/search", {"embeddings": unit_rows(rng, 1, 16).tolist()}, headers=auth(), timeout=5)[0]
        served.append((status, time.perf_counter() - t0))

    threads = [threading.Thread(target=search) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert [s for s, _ in served] == [200] * 5 and max(t for _, t in served) < 2
    t0 = time.perf_counter()
    closed = 0
    for s in [*slow, body]:
        s.settimeout(8)
        try:
            closed += s.recv(100) == b""  # the server closed it
        except ConnectionResetError:
            closed += 1
        s.close()
    assert closed == 31 and time.perf_counter() - t0 < 8


@pytest.mark.slow
def test_metrics_add_up_over_workers(tmp_path):
    rng = np.random.default_rng(1)
    hubless.Index.build(unit_rows(rng, 100, 8), unit_rows(rng, 200, 8), "nnn:k=4", "Flat").save(tmp_path / "idx")
    server = Server(["idx", "--workers", "2"], cwd=tmp_path)
    try:
        for _ in range(20):  # spread over the workers by the kernel
            assert server.request("POST", "/search", {"item": 1})[0] == 200
        text = server.request("GET", "/metrics")[2].decode()
        count = sum(
            float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith('hubless_requests_total{endpoint="/search"')
        )
        assert count == 20, text
        assert 'hubless_request_duration_seconds_count{endpoint="/search"} 20.0' in text
    finally:
        server.stop()
