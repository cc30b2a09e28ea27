"""The HTTP API over saved indexes: ``create_app({"coco": "idx/"})`` -> a FastAPI application.

    POST /search              queries as embeddings (JSON or base64 float32), texts or images
                              (the index's model), or an item id ("more like this"); top_k; the
                              correction's weight; compare=true adds the uncorrected ranking and
                              each hit's rank change; where filters on metadata
    POST /search/binary       the same with a body of raw float32 rows
    GET  /indexes             the served indexes (and what each can be queried with)
    GET  /indexes/{name}      one index: size, method, parameters, model, banks, format
    GET  /items/{name}/{id}   one item's metadata (/image: its image, from --image-root only)
    GET  /hubness/{name}      N_1 before/after the correction on the stored query bank, the
                              hubness of what was actually served, and with --learn-bank the
                              learned bank over time (every refit, kept or rejected, and why)
    POST /items/{name}        add items (embeddings + metadata)      } writes: the write key;
    DELETE /items/{name}/{id} remove an item                         } saved atomically under the
    POST /bank/{name}         add query-bank queries (every bias)    } index's write lock; audited
    POST /bank/{name}/refit   refit a learned bank now (--learn-bank)}
    POST /bank/{name}/reset   forget the queries learned so far      }
    GET  /health              liveness, what is served, whether a key is needed
    GET  /                    the web page (static/: search, compare, weight, hubness)
    GET  /metrics             Prometheus: requests and latency per endpoint, served hubness
    GET  /docs, /redoc        the API documentation (assets bundled, works offline)

The package has one module per job, after the FastAPI project template: :mod:`.settings`
(limits, keys, security settings), :mod:`.schemas` (request bodies), :mod:`.state` (what is
served), :mod:`.deps` (dependencies of the routes), :mod:`.routes` (one router per concern),
:mod:`.guard` (host check, rate limit, keys, body limit, security headers, request ids), :mod:`.body` (JSON bodies parsed off the event loop, their shape bounded), :mod:`.batching` (concurrent
searches as batches), :mod:`.telemetry`, :mod:`.hubness`, :mod:`.images`, :mod:`.write_log`,
:mod:`.errors` (status mapping), :mod:`.protocol` (read timeouts), and this module, which
assembles them. The service reference is ``docs/service.md``.

A thin layer over :class:`hubless.search.Searcher`: searching is ``Index.search`` (the same
numbers as in process). Bad requests get a 4xx JSON error naming the problem; an unexpected
failure is a 500 JSON error that says nothing of the server's internals, and the server keeps
serving.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from hubless.errors import InvalidInput, optional_import

try:
    from fastapi import FastAPI
except ImportError:  # pragma: no cover - the serve extra is missing: say which one, before the routes import it
    optional_import("fastapi", "the HTTP service", "serve")  # raises, naming the extra
    raise

from hubless.service import routes
from hubless.service.body import BODY_MODELS
from hubless.service.errors import error_status, install_error_handlers
from hubless.service.guard import Guard
from hubless.service.learning import make_learners
from hubless.service.schemas import ItemsRequest, SearchRequest
from hubless.service.settings import Keys, Limits, ServeSettings, Settings
from hubless.service.state import ServiceState

__all__ = ["ItemsRequest", "Keys", "Limits", "SearchRequest", "ServeSettings", "Settings", "create_app", "error_status"]


def app_from_environment() -> FastAPI:
    """The app `hubless serve` configured through ``HUBLESS_SERVE_CONFIG`` (one per worker
    process): its :class:`ServeSettings` as JSON and the indexes. The settings name the key
    files; each process reads them itself, so no key is ever put in the environment."""
    import json
    import sys

    config = json.loads(os.environ["HUBLESS_SERVE_CONFIG"])
    indexes = config.pop("indexes")
    settings = ServeSettings(**config)
    app = create_app(
        indexes,
        model=settings.model,
        allow_model_mismatch=settings.allow_model_mismatch,
        settings=settings,
        reranker=settings.rerank,
        rerank_k=settings.rerank_k,
    )
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
    settings: Settings | None = None,
    limits: Limits | None = None,
    api_key: str | None = None,
    writes: bool = True,
    reranker=None,
    rerank_k: int = 20,
) -> FastAPI:
    """The application serving ``indexes`` (name -> saved index directory or :class:`Index`, an
    attached collection's sidecar directory, or a store URI written by ``hubless export``, served
    read only: see :mod:`hubless.search.store_index`).

    Text (and image) queries are encoded with the model each index records, loaded here, once
    per model (see :mod:`hubless.search` for the rule); ``model`` (a name or folder) or
    ``encoder`` (a loaded encoder) gives it explicitly, and must be the model the indexes record
    unless ``allow_model_mismatch``. An index whose model cannot be loaded is served for
    embedding and item queries only (``/indexes`` lists what each index can be queried with).
    ``settings``: limits, keys, image root, hosts, CORS, audit log, timeouts
    (:class:`hubless.service.Settings`); ``limits``, ``api_key`` (the write key) and ``writes``
    are shortcuts for the same when ``settings`` is not given. ``reranker`` (a Reranker, or a
    model name or folder for :func:`hubless.rerank.load_reranker`) lets text searches ask for
    ``rerank``: the corrected top ``rerank_k`` is reranked against each item's text or image
    path from the metadata (column path, text, caption or item).
    """
    from hubless.search import Searcher

    if settings is None:
        settings = Settings(limits=limits or Limits(), keys=Keys(write=api_key), writes=writes)
    elif limits is not None or api_key is not None:
        raise InvalidInput("give limits and keys inside settings=, not beside it")
    searcher = Searcher(
        dict(indexes), model=model, encoder=encoder, allow_model_mismatch=allow_model_mismatch, reranker=reranker, rerank_k=rerank_k
    )
    service = ServiceState(searcher, settings=settings, query_problems=searcher.preload())
    make_learners(service)  # --learn-bank: a learner per index named, started with the application
    app = _App(
        title="hubless",
        description="Hubness-corrected text-image retrieval over saved indexes.",
        version=_version(),
        docs_url=None,
        redoc_url=None,
        lifespan=_learning,
    )
    app.state.service = service
    app.state.served, app.state.limits, app.state.telemetry = service.served, settings.limits, service.telemetry  # shortcuts (tests, tools)
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["authorization", "content-type"],
        )
    install_error_handlers(app)
    for module in (routes.ops, routes.indexes, routes.items, routes.queries, routes.page):
        app.include_router(module.router)
    return app


@contextlib.asynccontextmanager
async def _learning(app: FastAPI):
    """The bank learners (``--learn-bank``) run while the application does."""
    learners = app.state.service.learners
    for learner in learners.values():
        learner.start()
    try:
        yield
    finally:
        for learner in learners.values():
            learner.stop()


class _App(FastAPI):
    """FastAPI with :class:`hubless.service.guard.Guard` outermost: outside the error handler that
    answers an unexpected failure with a 500 (``add_middleware`` would put it inside that
    handler, so a 500 would leave without the security headers and the metrics)."""

    def build_middleware_stack(self):
        return Guard(super().build_middleware_stack(), service=self.state.service)

    def openapi(self) -> dict:
        """FastAPI's schema plus the JSON bodies the routes parse themselves
        (:mod:`hubless.service.body`) and the Bearer scheme: every operation needs a key when the
        server has one, but the open ones (``/health``, the page, the docs); Swagger UI's
        Authorize button sends it."""
        if self.openapi_schema is None:
            from hubless.service.guard import OPEN_PATHS

            schema = super().openapi()
            components = schema.setdefault("components", {})
            models = components.setdefault("schemas", {})
            for model in BODY_MODELS.values():  # every request body a route names (json_body)
                models[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components["securitySchemes"] = {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The read-only or the write key (hubless serve --api-key-file / --read-key-file), "
                    "when the server has keys.",
                }
            }
            schema["security"] = [{"bearer": []}]
            for path in OPEN_PATHS:
                for operation in schema["paths"].get(path, {}).values():
                    operation["security"] = []
            self.openapi_schema = schema
        return self.openapi_schema


def _version() -> str:
    from hubless._version import __version__

    return __version__
