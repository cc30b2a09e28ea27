"""The HTTP API over saved indexes: ``create_app({"coco": "idx/"})`` -> a FastAPI application.

    POST /search              queries as embeddings, texts (needs a model) or an item id
                              ("more like this"); top_k; the correction's weight; compare=true
                              adds the uncorrected ranking and each hit's rank change
    GET  /indexes             the served indexes
    GET  /indexes/{name}      one index: size, method, parameters, model, banks, format
    GET  /items/{name}/{id}   one item's metadata (/image: its image file, if its metadata names one)
    GET  /hubness/{name}      N_1 before/after the correction on the stored query bank, the top hubs
    POST /items/{name}        add items (embeddings + metadata)      } writes: need the API key;
    DELETE /items/{name}/{id} remove an item                         } saved atomically under the
    POST /bank/{name}         add query-bank queries (every bias)    } index's write lock
    GET  /health              liveness, and what is served
    GET  /                    the web page (static/index.html: search, compare, weight slider, hubness)
    GET  /metrics             Prometheus text: requests and latency per endpoint

The package has one module per job, after the FastAPI project template: :mod:`.settings`
(limits), :mod:`.schemas` (request bodies), :mod:`.state` (what is served), :mod:`.deps`
(dependencies of the routes), :mod:`.routes` (one router per concern), :mod:`.batching`
(concurrent searches as batches), :mod:`.metrics`, :mod:`.errors` (status mapping), and this
module, which assembles them.

A thin layer over :class:`hubless.Index`: searching is ``Index.search`` (the same numbers as in
process), the uncorrected ranking is exact search over the same gallery. Bad requests get a 4xx
JSON error naming the problem (unknown index or id, wrong dimension, NaN, a limit exceeded:
body size 413, batch size and top_k 422); an unexpected failure is a 500 JSON error without a
traceback, and the server keeps serving. OpenAPI documentation is at ``/docs``.
"""

from __future__ import annotations

import hmac
import os
import time
from collections.abc import Mapping
from typing import Any

from hubless.errors import MissingDependencyError

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse
except ImportError as exc:  # pragma: no cover - the serve extra is missing
    raise MissingDependencyError("the HTTP service", "fastapi", "serve") from exc

from hubless.service import routes
from hubless.service.errors import error_status, install_error_handlers
from hubless.service.schemas import ItemsRequest, SearchRequest
from hubless.service.settings import Limits
from hubless.service.state import ServiceState

__all__ = ["ItemsRequest", "Limits", "SearchRequest", "create_app", "error_status"]


def app_from_environment() -> FastAPI:
    """The app `hubless serve` configured through ``HUBLESS_SERVE_CONFIG`` (one per worker process)."""
    import json
    import sys

    config = json.loads(os.environ["HUBLESS_SERVE_CONFIG"])
    app = create_app(config["indexes"], model=config["model"], allow_model_mismatch=config.get("allow_model_mismatch", False),
                     api_key=config["api_key"], writes=config["writes"],
                     limits=Limits(max_batch=config["max_batch"], max_top_k=config["max_top_k"]),
                     reranker=config.get("rerank"), rerank_k=config.get("rerank_k", 20))  # fmt: skip
    for name, problem in app.state.service.query_problems.items():
        if problem is not None:
            print(f"note: {name}: embedding and item queries only ({problem})", file=sys.stderr)
    return app


def create_app(
    indexes: Mapping[str, Any],
    *,
    model: str | None = None,
    encoder=None,
    allow_model_mismatch: bool = False,
    limits: Limits = Limits(),
    api_key: str | None = None,
    writes: bool = True,
    reranker=None,
    rerank_k: int = 20,
) -> FastAPI:
    """The application serving ``indexes`` (name -> saved index directory or :class:`Index`).

    Text (and image) queries are encoded with the model each index records, loaded here, once
    per model (see :mod:`hubless.search` for the rule); ``model`` (a name or folder) or
    ``encoder`` (a loaded encoder) gives it explicitly, and must be the model the indexes record
    unless ``allow_model_mismatch``. An index whose model cannot be loaded is served for
    embedding and item queries only (``/indexes`` lists what each index can be queried with).
    With ``api_key``, every request but ``/health`` must carry it (header ``X-API-Key`` or
    ``Authorization: Bearer KEY``); otherwise 401. ``reranker`` (a Reranker, or a model name or
    folder for :func:`hubless.rerank.load_reranker`) lets text searches ask for ``rerank``: the
    corrected top ``rerank_k`` is reranked against each item's text or image path from the
    metadata (column path, text, caption or item). Writes need an API key and ``writes=True``
    (``hubless serve --workers N`` with N > 1 turns them off: each worker holds its own copy).
    """
    from hubless.search import Searcher

    searcher = Searcher(dict(indexes), model=model, encoder=encoder, allow_model_mismatch=allow_model_mismatch,
                        reranker=reranker, rerank_k=rerank_k)  # fmt: skip
    service = ServiceState(searcher, limits=limits, api_key=api_key, writes=writes, query_problems=searcher.preload())
    app = FastAPI(title="hubless", description="Hubness-corrected text-image retrieval over saved indexes.", version=_version())
    app.state.service = service
    app.state.served, app.state.limits, app.state.metrics = service.served, limits, service.metrics  # shortcuts (tests, tools)

    @app.middleware("http")
    async def limit_and_measure(request: Request, call_next):
        t0 = time.perf_counter()
        size = request.headers.get("content-length")
        if api_key is not None and request.url.path != "/health" and not _authorised(request, api_key):
            response = JSONResponse({"detail": "missing or wrong API key (header X-API-Key or Authorization: Bearer)"}, status_code=401)
        elif size is not None and (not size.isdigit() or int(size) > limits.max_body_bytes):
            response = JSONResponse(
                {"detail": f"request body larger than the limit max_body_bytes={limits.max_body_bytes}"}, status_code=413
            )
        else:
            response = await call_next(request)
        route = request.scope.get("route")
        service.metrics.add(getattr(route, "path", "unmatched"), response.status_code, time.perf_counter() - t0)
        return response

    install_error_handlers(app)
    for module in (routes.ops, routes.indexes, routes.items, routes.search, routes.page):
        app.include_router(module.router)
    return app


def _authorised(request: Request, api_key: str) -> bool:
    given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), api_key.encode())


def _version() -> str:
    from hubless import __version__

    return __version__
