"""``hubless serve``: the HTTP API over saved indexes (FastAPI + uvicorn). The reference is
``docs/service.md``."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import typer

from hubless.cli._common import friendly_errors
from hubless.errors import InvalidInput

#: hubless.service.settings.DEFAULT_RATE_LIMIT / DEFAULT_RATE_BURST (not imported: the service
#: package needs the serve extra, and --help must work without it).
DEFAULT_RATE_LIMIT, DEFAULT_RATE_BURST = 100.0, 200


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def transport_warnings(host: str, *, keys: bool, tls: bool, proxies=()) -> list[str]:
    """What ``hubless serve`` warns about how keys travel: a key sent in clear beyond loopback."""
    if keys and not tls and not _is_loopback(host):
        via = (
            f" unless the trusted proxy ({', '.join(proxies)}) terminates TLS and reaches this server over a private network"
            if proxies
            else ""
        )
        return [
            f"API keys sent to {host} without TLS travel in clear{via}: pass --tls-cert and --tls-key, "
            "or serve on 127.0.0.1 behind a reverse proxy that terminates TLS (docs/service.md)"
        ]
    return []


@friendly_errors
def serve_command(
    indexes: list[str] = typer.Argument(..., help="Index directories to serve, as PATH (named after the folder) or NAME=PATH."),
    model: str = typer.Option(
        None, help="Model (name or folder) that encodes text/image queries (default: the model each index records; must be the same model)."
    ),
    allow_model_mismatch: bool = typer.Option(
        False, "--allow-model-mismatch", help="Encode queries with --model even where an index records another model."
    ),
    host: str = typer.Option("127.0.0.1", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8000, help="Port."),
    api_key_file: Path = typer.Option(
        None, help="File holding the write key (Authorization: Bearer KEY); then every request needs a key. Required beyond loopback."
    ),
    read_key_file: Path = typer.Option(None, help="File holding a read-only key (searches and reads, no writes)."),
    image_root: Path = typer.Option(None, help="Folder item images are served from (metadata 'path' relative to it); none: no images."),
    allowed_host: list[str] = typer.Option(
        None, "--allowed-host", help="Host header value to answer (repeatable; default: localhost names and the bind address; * for any)."
    ),
    cors_origin: list[str] = typer.Option(
        None, "--cors-origin", help="Browser origin allowed to call the API (repeatable; default: none)."
    ),
    audit_log: Path = typer.Option(None, help="Append one JSON line per write here (time, key, endpoint, ids)."),
    lock_timeout: float = typer.Option(5.0, help="Seconds a write waits for the index's lock before answering 503 (Retry-After)."),
    header_timeout: float = typer.Option(10.0, help="Seconds a client has to send a request's headers."),
    body_timeout: float = typer.Option(30.0, help="Seconds a client has to send a request's body."),
    max_body_bytes: int = typer.Option(8 * 2**20, help="Largest request body (chunked bodies too)."),
    max_batch: int = typer.Option(256, help="Most queries (or rows) per request."),
    max_top_k: int = typer.Option(1000, help="Largest top_k."),
    max_text_chars: int = typer.Option(1000, help="Longest text query, in characters."),
    max_result_hits: int = typer.Option(50_000, help="Largest answer: queries x top_k x (2 with compare)."),
    workers: int = typer.Option(1, help="Server processes, each with its own copy of the indexes (writes need 1)."),
    rerank: str = typer.Option(None, help="Cross-encoder (BLIP ITM or sentence-transformers name/folder) text searches may rerank with."),
    rerank_k: int = typer.Option(20, help="Candidates per query given to the reranker."),
    tls_cert: Path = typer.Option(None, help="TLS certificate (PEM) to serve HTTPS with (with --tls-key)."),
    tls_key: Path = typer.Option(None, help="The TLS certificate's private key (PEM)."),
    trusted_proxy: list[str] = typer.Option(
        None,
        "--trusted-proxy",
        help="Address of a reverse proxy whose X-Forwarded-For/-Proto headers are trusted (repeatable; default: none are).",
    ),
    rate_limit: float = typer.Option(DEFAULT_RATE_LIMIT, help="Requests per second per client address, on average (0: no limit)."),
    rate_burst: int = typer.Option(DEFAULT_RATE_BURST, help="Requests one client address may make at once before the rate limit applies."),
) -> None:
    """Serve saved indexes over HTTP: POST /search (embeddings, texts or images with the index's
    model, or an item id; compare=true for the uncorrected ranking), GET /indexes, /items,
    /hubness, /health, /metrics; the page at /, API docs at /docs."""
    from hubless.errors import check_available
    from hubless.service.settings import DEFAULT_HOSTS, Keys, Limits, Settings

    check_available("fastapi", "hubless serve", "serve")
    check_available("uvicorn", "hubless serve", "serve")
    if not _is_loopback(host) and api_key_file is None:
        raise InvalidInput(f"binding to {host} exposes the indexes beyond this machine: pass --api-key-file (or bind to 127.0.0.1)")
    if (tls_cert is None) != (tls_key is None):
        raise InvalidInput("give --tls-cert and --tls-key together (the certificate and its private key)")
    for flag, pem in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if pem is not None and not Path(pem).is_file():
            raise InvalidInput(f"{flag} {pem} is not a file")
    from hubless.cli._common import print_note

    for warning in transport_warnings(host, keys=api_key_file is not None, tls=tls_cert is not None, proxies=trusted_proxy or ()):
        print_note(warning, "warning")
    if workers < 1:
        raise InvalidInput(f"--workers must be >= 1; got {workers}")
    named = {}
    for value in indexes:
        name, sep, path = value.partition("=")
        name, path = (name, path) if sep else (Path(value).name, value)
        if name in named:
            raise InvalidInput(f"two indexes are named {name!r}: give them names as NAME=PATH")
        named[name] = Path(path)
    limits = Limits(max_body_bytes=max_body_bytes, max_batch=max_batch, max_top_k=max_top_k, max_text_chars=max_text_chars,
                    max_result_hits=max_result_hits)  # fmt: skip
    hosts = tuple(allowed_host) if allowed_host else (*DEFAULT_HOSTS, *([] if host in ("0.0.0.0", "::") else [host]))
    if not allowed_host and host in ("0.0.0.0", "::"):
        print_note(f"bound to {host} without --allowed-host: only requests for localhost names are answered (400 otherwise); "
                   "pass --allowed-host with the names clients use")  # fmt: skip
    Keys.from_files(api_key_file, read_key_file)  # checked here, read again by each worker: keys never go into the environment
    Settings(limits=limits, image_root=image_root, allowed_hosts=hosts, cors_origins=tuple(cors_origin or ()), audit_log=audit_log,
             lock_timeout=lock_timeout, header_timeout=header_timeout, body_timeout=body_timeout, rate_limit=rate_limit,
             rate_burst=rate_burst)  # fmt: skip
    import dataclasses
    import json
    import os
    import shutil
    import tempfile

    import uvicorn

    def absolute(p):
        return None if p is None else str(Path(p).resolve())

    config = {
        "indexes": {k: str(v.resolve()) for k, v in named.items()},
        "model": model,
        "allow_model_mismatch": allow_model_mismatch,
        "api_key_file": absolute(api_key_file),
        "read_key_file": absolute(read_key_file),
        "image_root": absolute(image_root),
        "allowed_hosts": list(hosts),
        "cors_origins": list(cors_origin or ()),
        "audit_log": absolute(audit_log),
        "lock_timeout": lock_timeout,
        "header_timeout": header_timeout,
        "body_timeout": body_timeout,
        "limits": dataclasses.asdict(limits),
        "writes": workers == 1,
        "rerank": rerank,
        "rerank_k": rerank_k,
        "rate_limit": rate_limit,
        "rate_burst": rate_burst,
    }
    os.environ["HUBLESS_SERVE_CONFIG"] = json.dumps(config)  # read by each worker process (file names, never keys)
    options: dict[str, Any] = dict(host=host, port=port, log_level="warning", http="hubless.service.protocol:ServeProtocol",
                                   server_header=False, timeout_keep_alive=5)  # fmt: skip
    # forwarded headers (client address, scheme) only from the proxies named; uvicorn's own default trusts 127.0.0.1
    options.update(proxy_headers=bool(trusted_proxy), forwarded_allow_ips=list(trusted_proxy) if trusted_proxy else [])
    if tls_cert is not None:
        options.update(ssl_certfile=str(tls_cert), ssl_keyfile=str(tls_key))
    scheme = "https" if tls_cert is not None else "http"
    typer.echo(f"serving {', '.join(named)} on {scheme}://{host}:{port} with {workers} worker(s) (API docs: /docs)")
    if workers == 1:
        from hubless.service.app import app_from_environment

        uvicorn.run(app_from_environment(), **options)
        return
    metrics_dir = tempfile.mkdtemp(prefix="hubless-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir  # /metrics sums the workers' counters
    try:
        uvicorn.run("hubless.service.app:app_from_environment", factory=True, workers=workers, **options)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
