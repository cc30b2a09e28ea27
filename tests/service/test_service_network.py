"""The service on a network (issue 41, items 5-7), against real `hubless serve` (uvicorn)
subprocesses on 127.0.0.1 with bounded requests: HTTPS with a self-signed certificate made here,
the warning for keys sent in clear beyond loopback, forwarded headers trusted only from the
proxies named, audit lines with the client address and the request id (also the answer's
X-Request-ID) for done and refused writes, the auth-failure counter, the per-client rate limit
(429 with Retry-After), and the OpenAPI Bearer scheme."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("PIL")

import hubless  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402
from tests.service.test_service_security import READ, SRC, WRITE, Server, auth  # noqa: E402

OPENSSL = shutil.which("openssl")


def _index(root):
    rng = np.random.default_rng(2)
    hubless.Index.build(unit_rows(rng, 60, 8), unit_rows(rng, 120, 8), "nnn:k=4", "Flat").save(root / "idx")
    (root / "write.key").write_text(WRITE)
    (root / "read.key").write_text(READ)


@pytest.fixture(scope="module")
def proxied(tmp_path_factory):
    """A server behind a 'proxy' on 127.0.0.1 (trusted: its X-Forwarded-For is the client), with
    a low rate limit; each test speaks for its own forwarded client address."""
    root = tmp_path_factory.mktemp("proxied")
    _index(root)
    server = Server(["idx", "--api-key-file", "write.key", "--read-key-file", "read.key", "--audit-log", root / "audit.jsonl",
                     "--trusted-proxy", "127.0.0.1", "--rate-limit", 5, "--rate-burst", 10], cwd=root)  # fmt: skip
    yield root, server
    server.stop()


def _as(client: str, key: str | None = READ) -> dict:
    return {"X-Forwarded-For": client, **(auth(key) if key else {})}


def _audit(root) -> list[dict]:
    return [json.loads(line) for line in (root / "audit.jsonl").read_text().splitlines()]


def _metric(server, name: str) -> float:
    text = server.request("GET", "/metrics", headers=_as("198.51.100.99"))[2].decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_audit_lines_name_the_client_and_the_request_id(proxied):
    root, server = proxied
    client = "203.0.113.7"
    before = _metric(server, 'hubless_auth_failures_total{reason="wrong_key"}')
    body = {"embeddings": [[0.5] * 8]}
    wrong = server.request("POST", "/bank/idx", body, headers=_as(client, "x" * 30))
    read = server.request("POST", "/bank/idx", body, headers=_as(client, READ))
    done = server.request("POST", "/bank/idx", body, headers=_as(client, WRITE))
    assert (wrong[0], read[0], done[0]) == (401, 403, 200)
    ids = [answer[1]["x-request-id"] for answer in (wrong, read, done)]
    assert len(set(ids)) == 3 and all(len(i) == 16 for i in ids)
    mine = [r for r in _audit(root) if r["client"] == client]
    assert [(r["status"], r["key"], r["request_id"]) for r in mine] == [(401, None, ids[0]), (403, "read", ids[1]), (200, "write", ids[2])]
    assert mine[2]["endpoint"] == "/bank/{name}" and mine[2]["index"] == "idx" and mine[0]["ids"] is None
    assert _metric(server, 'hubless_auth_failures_total{reason="wrong_key"}') == before + 1
    assert server.request("GET", "/indexes", headers=_as(client, None))[0] == 401  # a refused read is counted, not audited
    assert len([r for r in _audit(root) if r["client"] == client]) == 3


def test_a_client_past_the_rate_limit_gets_429_with_retry_after(proxied):
    _, server = proxied
    statuses, retry = [], None
    for _ in range(20):  # burst 10 at 5 a second: the later ones are refused
        status, headers, _ = server.request("GET", "/indexes", headers=_as("203.0.113.8"))
        statuses.append(status)
        if status == 429:
            retry = int(headers["retry-after"])
            assert headers["x-request-id"] and headers["x-content-type-options"] == "nosniff"
    assert statuses[:10] == [200] * 10 and 429 in statuses and retry is not None and retry >= 1
    assert server.request("GET", "/indexes", headers=_as("203.0.113.9"))[0] == 200  # another client is not limited
    assert all(server.request("GET", "/health", headers=_as("203.0.113.8"))[0] == 200 for _ in range(5))  # liveness never is
    assert _metric(server, "hubless_rate_limited_total") >= 1
    time.sleep(retry)
    assert server.request("GET", "/indexes", headers=_as("203.0.113.8"))[0] == 200


def test_the_rate_limiter_is_a_token_bucket_per_client_with_bounded_memory():
    from hubless.errors import InvalidInput
    from hubless.service import Settings
    from hubless.service.guard import RateLimiter

    limiter = RateLimiter(rate=2.0, burst=3, max_clients=100)
    assert [limiter.wait("a", now=0.0) for _ in range(3)] == [0.0] * 3  # the burst
    assert limiter.wait("a", now=0.0) == pytest.approx(0.5)  # then one token every 1/rate seconds
    assert limiter.wait("b", now=0.0) == 0.0  # another client has its own bucket
    assert limiter.wait("a", now=0.6) == 0.0 and limiter.wait("a", now=0.6) > 0
    for i in range(1000):  # many addresses: the buckets stay bounded
        limiter.wait(f"10.0.{i // 256}.{i % 256}", now=1.0 + i * 1e-4)
        assert len(limiter.buckets) <= 101
    for bad in (-1, float("nan"), True):
        with pytest.raises(InvalidInput, match="rate_limit"):
            Settings(rate_limit=bad)
    with pytest.raises(InvalidInput, match="rate_burst"):
        Settings(rate_burst=0)


def test_openapi_declares_the_bearer_scheme(proxied):
    _, server = proxied
    schema = json.loads(server.request("GET", "/openapi.json", headers=_as("203.0.113.10", None))[2])
    assert schema["components"]["securitySchemes"]["bearer"]["type"] == "http"
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert schema["security"] == [{"bearer": []}]
    assert schema["paths"]["/health"]["get"]["security"] == []
    search = schema["paths"]["/search"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert (
        search == {"$ref": "#/components/schemas/SearchRequest"}
        and "top_k" in schema["components"]["schemas"]["SearchRequest"]["properties"]
    )
    redoc = server.request("GET", "/static/redoc.standalone.js", headers=_as("203.0.113.10", None))
    assert redoc[0] == 200 and b"cdn.redoc.ly" not in redoc[2]  # its logo came from a CDN the CSP blocks


def _certificate(tmp_path):
    if OPENSSL is None:
        pytest.skip("needs the openssl command to make a self-signed certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([OPENSSL, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)  # fmt: skip
    return cert, key


class TLSServer(Server):
    def request(self, method, path, body=None, headers=None, timeout=30):
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        h = {"content-type": "application/json"} if isinstance(body, dict) else {}
        url = self.base.replace("http://", "https://") + path
        req = urllib.request.Request(url, data=data, method=method, headers={**h, **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.context) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()


@pytest.mark.slow
def test_https_with_a_self_signed_certificate(tmp_path):
    cert, key = _certificate(tmp_path)
    _index(tmp_path)
    TLSServer.context = ssl.create_default_context(cafile=str(cert))
    server = TLSServer(["idx", "--api-key-file", "write.key", "--audit-log", tmp_path / "audit.jsonl",
                        "--tls-cert", cert, "--tls-key", key], cwd=tmp_path)  # fmt: skip
    try:
        status, headers, body = server.request("POST", "/search", {"item": 1, "top_k": 3}, headers=auth(WRITE))
        assert status == 200 and len(json.loads(body)["results"][0]["hits"]) == 3
        assert headers["strict-transport-security"].startswith("max-age=")
        # no trusted proxy: a forwarded address is ignored, the audit names the connection's
        headers = {**auth(READ), "X-Forwarded-For": "203.0.113.50"}
        assert server.request("POST", "/bank/idx", {"embeddings": [[0.5] * 8]}, headers=headers)[0] == 401  # no read key here
        assert [r["client"] for r in _audit(tmp_path)] == ["127.0.0.1"]
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/health", timeout=5).read()
    finally:
        server.stop()


def _serve_output(args, cwd) -> str:
    """What `hubless serve` prints when it cannot bind (an address of TEST-NET-1, never this machine's)."""
    run = subprocess.run([sys.executable, "-m", "hubless", "serve", "idx", "--host", "192.0.2.1", "--port", "8", *map(str, args)],
                         cwd=cwd, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120)  # fmt: skip
    return run.stdout + run.stderr


@pytest.mark.slow
def test_keys_in_clear_beyond_loopback_are_warned_about(tmp_path):
    from hubless.cli.serve import transport_warnings

    assert transport_warnings("0.0.0.0", keys=True, tls=False) and transport_warnings(
        "10.0.0.5", keys=True, tls=False, proxies=["10.0.0.1"]
    )
    assert not transport_warnings("0.0.0.0", keys=True, tls=True) and not transport_warnings("127.0.0.1", keys=True, tls=False)
    _index(tmp_path)
    output = _serve_output(["--api-key-file", "write.key"], tmp_path)
    assert "travel in clear" in output and "--tls-cert" in output, output
    cert, key = _certificate(tmp_path)
    assert "travel in clear" not in _serve_output(["--api-key-file", "write.key", "--tls-cert", cert, "--tls-key", key], tmp_path)
    assert "together" in _serve_output(["--api-key-file", "write.key", "--tls-cert", cert], tmp_path)
