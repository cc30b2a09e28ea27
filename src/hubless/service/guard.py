"""What every request passes first (one pure ASGI middleware, :class:`Guard`, cheap enough to
keep the HTTP overhead under a millisecond):

1. the Host header must be one of ``Settings.allowed_hosts`` (a DNS-rebinding page cannot reach a
   loopback server): 400 otherwise;
2. with API keys, ``Authorization: Bearer <key>`` (nothing else): reads take the read-only or
   the write key, writes only the write key; 401 / 403 otherwise. The page, its assets, the
   docs and ``/health`` are open;
3. the body may not exceed ``Limits.max_body_bytes``: a Content-Length beyond it is refused at
   once, and a body without one (chunked) is counted while it is read, refused with a 413 as
   soon as it passes the limit (memory stays bounded by the limit plus one chunk);
4. every response gets security headers (a CSP without inline script, nosniff, no-referrer,
   frame-ancestors 'none'; HSTS over HTTPS) and an ``X-Request-ID``, whatever its status (the
   Guard is outside the handler that answers an unexpected failure with a 500);
5. its endpoint, status and duration are recorded in :mod:`hubless.service.telemetry`.

Before the key is checked, each client address may make ``Settings.rate_limit`` requests per
second on average and ``rate_burst`` at once (a token bucket per address, :class:`RateLimiter`):
429 with Retry-After beyond them. A refused key is counted (``hubless_auth_failures_total``), and
a refused write (401 or 403) is appended to the write log with the client address and request id.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import threading
import time

from fastapi import HTTPException

__all__ = ["OPEN_PATHS", "BodyTooLarge", "Guard", "RateLimiter", "is_write"]

#: Paths anyone may read: the page and its assets, the API docs, liveness.
OPEN_PATHS = frozenset({"/", "/health", "/favicon.ico", "/docs", "/redoc", "/openapi.json"})
OPEN_PREFIXES = ("/static/",)
#: POST endpoints that only read.
READ_POSTS = frozenset({"/search", "/search/binary"})

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
#: The API docs (Swagger UI, ReDoc) set styles inline and ReDoc runs a worker from a blob.
DOCS_CSP = CSP.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'") + "; worker-src 'self' blob:"
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class BodyTooLarge(HTTPException):
    """Raised while reading a body that passed ``max_body_bytes`` (answered 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than the limit max_body_bytes={limit}")


def is_write(method: str, path: str) -> bool:
    """Whether a request changes something (needs the write key)."""
    return method not in ("GET", "HEAD", "OPTIONS") and path not in READ_POSTS


def _host_name(value: str) -> str:
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8000
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


HSTS = (b"strict-transport-security", b"max-age=31536000")
#: Paths never rate-limited (liveness probes).
UNLIMITED_PATHS = frozenset({"/health"})


class RateLimiter:
    """A token bucket per client address: ``rate`` tokens a second up to ``burst``; a request
    takes one. At most ``max_clients`` buckets are kept (idle, hence full, ones are dropped first),
    so memory stays bounded whatever addresses come."""

    def __init__(self, rate: float, burst: int, max_clients: int = 100_000) -> None:
        self.rate, self.burst, self.max_clients = float(rate), float(burst), max_clients
        self.buckets: dict[str, tuple[float, float]] = {}
        self.lock = threading.Lock()

    def wait(self, client: str, now: float | None = None) -> float:
        """0 if ``client`` may go on (its token taken), else the seconds until it may."""
        now = time.monotonic() if now is None else now
        with self.lock:
            tokens, last = self.buckets.get(client, (self.burst, now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens < 1:
                self.buckets[client] = (tokens, now)
                return (1 - tokens) / self.rate
            self.buckets[client] = (tokens - 1, now)
            if len(self.buckets) > self.max_clients:
                self._prune(now)
            return 0.0

    def _prune(self, now: float) -> None:
        full = self.burst / self.rate  # idle this long: full again, the same as no bucket
        self.buckets = {c: (t, last) for c, (t, last) in self.buckets.items() if now - last < full}
        if len(self.buckets) > self.max_clients:  # all busy: drop the oldest half (they start full again)
            for client in list(self.buckets)[: len(self.buckets) - self.max_clients // 2]:
                del self.buckets[client]


def _client(scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class Guard:
    """The pure ASGI middleware described in the module docstring."""

    def __init__(self, app, service) -> None:
        self.app, self.service = app, service
        settings = service.settings
        self.hosts = None if "*" in settings.allowed_hosts else {h.lower() for h in settings.allowed_hosts}
        keys = settings.keys
        self.write_key = None if keys.write is None else keys.write.encode()
        self.read_key = None if keys.read is None else keys.read.encode()
        self.max_body = settings.limits.max_body_bytes
        self.limiter = RateLimiter(settings.rate_limit, settings.rate_burst) if settings.rate_limit > 0 else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        path, method = scope["path"], scope["method"]
        status = [500]
        request_id = os.urandom(8).hex()
        scope["hubless.request_id"] = request_id
        added = [
            (b"content-security-policy", (DOCS_CSP if path in ("/docs", "/redoc") else CSP).encode()),
            *HEADERS,
            (b"x-request-id", request_id.encode()),
            *((HSTS,) if scope.get("scheme") == "https" else ()),
        ]

        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", ()), *added]
                if status[0] in (401, 403) and self.service.write_log is not None and is_write(method, path):
                    await self._record_refusal(scope, method, path, status[0])  # on disk before the answer goes out
            await send(message)

        try:
            refusal = self._refusal(scope, path, method)
            if refusal is not None:
                code, detail, extra = refusal
                body = json.dumps({"detail": detail}).encode()
                headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra]
                await send_with_headers({"type": "http.response.start", "status": code, "headers": headers})
                await send_with_headers({"type": "http.response.body", "body": body})
                return
            await self.app(scope, self._counting(receive), send_with_headers)
        finally:
            route = scope.get("route")
            self.service.telemetry.observe(getattr(route, "path", "unmatched"), method, status[0], time.perf_counter() - t0)

    async def _record_refusal(self, scope, method: str, path: str, code: int) -> None:
        from starlette.concurrency import run_in_threadpool

        from hubless.service.errors import clip

        route = scope.get("route")
        await run_in_threadpool(
            self.service.write_log.record,
            key=scope.get("hubless.key"),
            method=method,
            endpoint=getattr(route, "path", clip(path)),
            index=(scope.get("path_params") or {}).get("name"),
            ids=None,
            status=code,
            client=_client(scope),
            request_id=scope.get("hubless.request_id"),
        )

    def _refusal(self, scope, path: str, method: str):
        """(status, detail, extra headers) of a request refused before it reaches a route, or None."""
        headers = scope["headers"]
        host = authorization = length = None
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"authorization":
                authorization = value
            elif name == b"content-length":
                length = value
        if self.hosts is not None and (host is None or _host_name(host.decode("latin-1")) not in self.hosts):
            return 400, "invalid Host header: this server answers only to its configured host names (--allowed-host)", ()
        if self.limiter is not None and path not in UNLIMITED_PATHS:
            wait = self.limiter.wait(_client(scope))
            if wait > 0:
                self.service.telemetry.rate_limited.inc()
                return (
                    429,
                    f"too many requests from this address: at most {self.limiter.rate:g} a second (burst {self.limiter.burst:g}); retry after the Retry-After seconds",
                    ((b"retry-after", str(max(1, math.ceil(wait))).encode()),),
                )
        if self.write_key is not None and method != "OPTIONS" and path not in OPEN_PATHS and not path.startswith(OPEN_PREFIXES):
            given = None
            if authorization is not None:
                scheme, _, token = authorization.partition(b" ")
                if scheme.lower() == b"bearer" and token.strip():
                    given = token.strip()
            challenge = ((b"www-authenticate", b"Bearer"),)
            if given is None:
                self.service.telemetry.auth_failures.labels("missing").inc()
                return 401, "this server needs an API key: send the header 'Authorization: Bearer <key>'", challenge
            is_writer = hmac.compare_digest(given, self.write_key)
            is_reader = self.read_key is not None and hmac.compare_digest(given, self.read_key)
            if not (is_writer or is_reader):
                self.service.telemetry.auth_failures.labels("wrong_key").inc()
                return 401, "wrong API key", challenge
            if is_write(method, path) and not is_writer:
                scope["hubless.key"] = "read"
                self.service.telemetry.auth_failures.labels("read_only").inc()
                return 403, "the read-only key cannot write: use the write key", ()
            scope["hubless.key"] = "write" if is_writer else "read"
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return 413, f"request body larger than the limit max_body_bytes={self.max_body}", ()
        return None

    def _counting(self, receive):
        """``receive`` that raises :class:`BodyTooLarge` as soon as the body passes the limit."""
        seen = [0]
        limit = self.max_body

        async def counted():
            message = await receive()
            if message["type"] == "http.request":
                seen[0] += len(message.get("body", b""))
                if seen[0] > limit:
                    raise BodyTooLarge(limit)
            return message

        return counted
