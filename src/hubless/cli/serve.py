"""``hubless serve``: the HTTP API over saved indexes (FastAPI + uvicorn)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import typer

from hubless.cli._common import friendly_errors
from hubless.errors import InvalidInput


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
        None, help="File holding an API key every request must carry (X-API-Key); required to bind to anything but loopback."
    ),
    max_batch: int = typer.Option(256, help="Most queries per request."),
    max_top_k: int = typer.Option(1000, help="Largest top_k."),
    workers: int = typer.Option(1, help="Server processes, each with its own copy of the indexes (writes need 1)."),
    rerank: str = typer.Option(None, help="Cross-encoder (BLIP ITM or sentence-transformers name/folder) text searches may rerank with."),
    rerank_k: int = typer.Option(20, help="Candidates per query given to the reranker."),
) -> None:
    """Serve saved indexes over HTTP: POST /search (embeddings, texts with --model, or an item id;
    compare=true for the uncorrected ranking), GET /indexes, /items, /health, /metrics; docs at /docs."""
    from hubless.errors import check_available

    check_available("fastapi", "hubless serve", "serve")
    check_available("uvicorn", "hubless serve", "serve")
    if not _is_loopback(host) and api_key_file is None:
        raise InvalidInput(f"binding to {host} exposes the indexes beyond this machine: pass --api-key-file (or bind to 127.0.0.1)")
    api_key = None
    if api_key_file is not None:
        api_key = api_key_file.read_text(encoding="utf-8").strip()
        if len(api_key) < 16:
            raise InvalidInput(f"{api_key_file} holds a key of {len(api_key)} characters; use at least 16 (e.g. `openssl rand -hex 32`)")
    named = {}
    for value in indexes:
        name, sep, path = value.partition("=")
        name, path = (name, path) if sep else (Path(value).name, value)
        if name in named:
            raise InvalidInput(f"two indexes are named {name!r}: give them names as NAME=PATH")
        named[name] = Path(path)
    if workers < 1:
        raise InvalidInput(f"--workers must be >= 1; got {workers}")
    import json
    import os

    import uvicorn

    config = {"indexes": {k: str(v.resolve()) for k, v in named.items()}, "model": model, "allow_model_mismatch": allow_model_mismatch, "api_key": api_key,
              "max_batch": max_batch, "max_top_k": max_top_k, "writes": workers == 1, "rerank": rerank, "rerank_k": rerank_k}  # fmt: skip
    os.environ["HUBLESS_SERVE_CONFIG"] = json.dumps(config)  # read by each worker process
    typer.echo(f"serving {', '.join(named)} on http://{host}:{port} with {workers} worker(s) (API docs: /docs)")
    if workers == 1:
        from hubless.service.app import app_from_environment

        uvicorn.run(app_from_environment(), host=host, port=port, log_level="warning")
    else:
        uvicorn.run("hubless.service.app:app_from_environment", factory=True, host=host, port=port, workers=workers, log_level="warning")
