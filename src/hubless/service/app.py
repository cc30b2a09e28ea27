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

A thin layer over :class:`hubless.Index`: searching is ``Index.search`` (the same numbers as in
process), the uncorrected ranking is exact search over the same gallery. Bad requests get a 4xx
JSON error naming the problem (unknown index or id, wrong dimension, NaN, a limit exceeded:
body size 413, batch size and top_k 422); an unexpected failure is a 500 JSON error without a
traceback, and the server keeps serving. Concurrent searches run as batches: while one search
runs, the requests that arrive queue up and go together into the next (:class:`_Batcher`). OpenAPI documentation is at ``/docs``.
"""

from __future__ import annotations

import hmac
import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import as_embeddings
from hubless.errors import Busy, Conflict, HublessError, InvalidInput, MissingDependencyError, NotFound, message

try:
    from fastapi import FastAPI, HTTPException, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse
    from pydantic import BaseModel, Field
except ImportError as exc:  # pragma: no cover - the serve extra is missing
    raise MissingDependencyError("the HTTP service", "fastapi", "serve") from exc

__all__ = ["ItemsRequest", "Limits", "SearchRequest", "create_app"]


def error_status(exc: HublessError) -> int:
    """The HTTP status of a hubless error: 404 not found, 409 conflict, 503 busy, 422 other bad
    input; 500 for damaged data, a missing package or an unfinished job (the server's problem)."""
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, Busy):
        return 503
    if isinstance(exc, InvalidInput):
        return 422
    return 500


@dataclass(frozen=True)
class Limits:
    """Caps on a request, each reported by name when exceeded."""

    max_body_bytes: int = 8 * 2**20
    max_batch: int = 256
    max_top_k: int = 1000


class SearchRequest(BaseModel):
    """``POST /search``: exactly one of ``embeddings``, ``texts`` or ``item``."""

    index: str | None = Field(None, description="Index name (default: the only one served).")
    embeddings: list[list[float]] | None = Field(None, description="Query embeddings, one list per query.")
    texts: list[str] | None = Field(None, description="Text queries, encoded with the server's model.")
    item: int | None = Field(None, description="A gallery item id: search with its embedding ('more like this').")
    top_k: int = Field(10, ge=1, description="Results per query.")
    weight: float | None = Field(None, ge=0, description="The correction's query-time weight (NNN alpha, DN lambda).")
    compare: bool = Field(False, description="Also return the uncorrected ranking and each hit's rank change.")
    rerank: bool = Field(False, description="Rerank the corrected top rerank_k with the server's cross-encoder (text queries).")


class ItemsRequest(BaseModel):
    """``POST /items/{name}`` and ``POST /bank/{name}``: rows to add (and, for items, metadata)."""

    embeddings: list[list[float]] = Field(..., description="One list per new item (or bank query).")
    metadata: list[dict[str, Any]] | None = Field(None, description="One record per new item.")


class _Pending:
    """One request's queries waiting in a :class:`_Batcher`."""

    def __init__(self, index, queries: np.ndarray, key: tuple, weight: dict) -> None:
        self.index, self.queries, self.key, self.weight = index, queries, key, weight
        self.result = self.error = None
        self.done = False


class _Batcher:
    """Concurrent searches of one index run as batches: one search at a time, and while it
    runs the requests that arrive queue up; the next search takes every queued request with the
    same parameters at once (up to ``max_rows`` queries). No request ever waits for a timer: a
    lone request is searched at once, and under load batches grow by themselves. Against a Flat
    gallery a batch of 32 reads the gallery once where 32 single queries read it 32 times.
    Each request's queries are validated before they queue, so one bad request never fails the
    others."""

    def __init__(self, max_rows: int = 256) -> None:
        self.max_rows = max_rows
        self.cond = threading.Condition()
        self.queue: list[_Pending] = []
        self.busy = False

    def search(self, index, queries: np.ndarray, top_k: int, weight: dict):
        mine = _Pending(index, queries, (id(index), top_k, tuple(sorted(weight.items()))), weight)
        with self.cond:
            self.queue.append(mine)
            while not mine.done:
                if self.busy:
                    self.cond.wait()
                    continue
                self.busy = True  # this thread runs the next batch (which may or may not hold its own request)
                batch, rows = [], 0
                for item in list(self.queue):
                    if item.key == self.queue[0].key and (not batch or rows + item.queries.shape[0] <= self.max_rows):
                        batch.append(item)
                        rows += item.queries.shape[0]
                for item in batch:
                    self.queue.remove(item)
                self.cond.release()
                try:
                    self._run(batch)
                finally:
                    self.cond.acquire()
                    self.busy = False
                    self.cond.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.result

    @staticmethod
    def _run(batch: list[_Pending]) -> None:
        first = batch[0]
        try:
            scores, ids = first.index.search(np.concatenate([p.queries for p in batch]), first.key[1], **first.weight)
            start = 0
            for p in batch:
                n = p.queries.shape[0]
                p.result = (scores[start : start + n], ids[start : start + n])
                start += n
        except Exception as exc:  # noqa: BLE001 - handed to every request of the batch
            for p in batch:
                p.error = exc
        for p in batch:
            p.done = True


class _Served:
    """One served index. ``index`` is replaced whole, never mutated: a write updates a fresh
    copy (loaded from disk under the index's write lock), saves it, then swaps it in, so a search
    sees the old or the new version, never a half-updated one."""

    def __init__(self, name: str, path: Path | None, index) -> None:
        self.name, self.path, self.index = name, path, index
        self.write_lock = threading.Lock()  # one writer per served index in this process
        self.hubness = None
        self.batcher = _Batcher()

    def write(self, change) -> None:
        from hubless.index import Index

        with self.write_lock:
            if self.path is None:  # served from memory: update a copy
                updated = self.index.copy()
                change(updated)
            else:  # the saved index, under its file lock (other processes may write it too)
                with Index.update(self.path) as updated:
                    change(updated)
            self.index = updated


def _load(indexes: Mapping[str, Any]) -> dict[str, _Served]:
    from hubless.index import Index

    if not indexes:
        raise InvalidInput("give at least one index to serve")
    served = {}
    for name, value in indexes.items():
        if isinstance(value, Index):
            served[name] = _Served(name, None, value)
        else:
            served[name] = _Served(name, Path(value), Index.load(value))
    return served


class _Metrics:
    """Request counts and latency per endpoint and status, in Prometheus text format."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: dict[tuple[str, int], int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            self.count[(endpoint, status)] += 1
            self.seconds[endpoint] += seconds

    def text(self) -> str:
        with self.lock:
            lines = ["# HELP hubless_requests_total Requests served.", "# TYPE hubless_requests_total counter"]
            lines += [f'hubless_requests_total{{endpoint="{e}",status="{s}"}} {n}' for (e, s), n in sorted(self.count.items())]
            lines += ["# HELP hubless_request_seconds_total Time spent serving requests.", "# TYPE hubless_request_seconds_total counter"]
            lines += [f'hubless_request_seconds_total{{endpoint="{e}"}} {t:.6f}' for e, t in sorted(self.seconds.items())]
        return "\n".join(lines) + "\n"


def app_from_environment() -> FastAPI:
    """The app `hubless serve` configured through ``HUBLESS_SERVE_CONFIG`` (one per worker process)."""
    import json

    config = json.loads(os.environ["HUBLESS_SERVE_CONFIG"])
    return create_app(config["indexes"], model=config["model"], api_key=config["api_key"], writes=config["writes"],
                      limits=Limits(max_batch=config["max_batch"], max_top_k=config["max_top_k"]),
                      reranker=config.get("rerank"), rerank_k=config.get("rerank_k", 20))  # fmt: skip


def create_app(
    indexes: Mapping[str, Any],
    *,
    model: str | None = None,
    encoder=None,
    limits: Limits = Limits(),
    api_key: str | None = None,
    writes: bool = True,
    reranker=None,
    rerank_k: int = 20,
) -> FastAPI:
    """The application serving ``indexes`` (name -> saved index directory or :class:`Index`).

    ``model`` (a name or folder) encodes text queries (loaded once, here); an index recording
    another model refuses text queries. ``encoder`` passes an already loaded encoder instead.
    With ``api_key``, every request but ``/health`` must carry it (header ``X-API-Key`` or
    ``Authorization: Bearer KEY``); otherwise 401. ``reranker`` (a Reranker, or a model name or
    folder for :func:`hubless.rerank.load_reranker`) lets text searches ask for ``rerank``: the
    corrected top ``rerank_k`` is reranked against each item's text or image path from the
    metadata (column path, text, caption or item). Writes need an API key and ``writes=True``
    (``hubless serve --workers N`` with N > 1 turns them off: each worker holds its own copy).
    """
    served = _load(indexes)
    if isinstance(reranker, (str, os.PathLike)):
        from hubless.rerank import load_reranker

        reranker = load_reranker(reranker)
    if encoder is None and model is not None:
        from hubless.encoders import load_encoder

        encoder = load_encoder(model)
    app = FastAPI(title="hubless", description="Hubness-corrected text-image retrieval over saved indexes.", version=_version())
    app.state.served, app.state.encoder, app.state.limits, app.state.metrics = served, encoder, limits, _Metrics()

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
        app.state.metrics.add(getattr(route, "path", "unmatched"), response.status_code, time.perf_counter() - t0)
        return response

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'body'}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"detail": f"invalid request: {problems}"}, status_code=422)

    @app.exception_handler(HublessError)
    async def hubless_error(request: Request, exc: HublessError):
        status = error_status(exc)
        if status >= 500:  # damaged data or a missing package is the server's business: no detail leaks
            return JSONResponse({"detail": f"internal error ({type(exc).__name__}); the server keeps running"}, status_code=status)
        headers = {"Retry-After": "1"} if status == 503 else None
        return JSONResponse({"detail": message(exc)}, status_code=status, headers=headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):  # one request fails, the server goes on, no traceback leaks
        return JSONResponse({"detail": f"internal error ({type(exc).__name__}); the server keeps running"}, status_code=500)

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "indexes": sorted(served), "model": getattr(encoder, "name", None)}

    @app.get("/indexes")
    def list_indexes() -> list[dict]:
        return [_summary(s) for s in served.values()]

    @app.get("/indexes/{name}")
    def describe(name: str) -> dict:
        s = _get(served, name)
        info = {k: _plain(v) for k, v in s.index.info().items()}
        banks = {
            k: None if v is None else int(v.shape[0])
            for k, v in (("query_bank", s.index.query_bank), ("gallery_bank", s.index.gallery_bank))
        }
        from hubless.index.store import VERSION

        return {**_summary(s), "info": info, "banks": banks, "format_version": VERSION, "path": None if s.path is None else s.path.name}

    @app.get("/items/{name}/{item_id}")
    def item(name: str, item_id: int) -> dict:
        s = _get(served, name)
        _check_id(s, item_id)
        return {"id": item_id, "metadata": None if s.index.metadata is None else s.index.metadata[item_id]}

    @app.post("/search")
    def search(request: SearchRequest) -> JSONResponse:
        s = _get(served, request.index if request.index is not None else _only(served))
        index = s.index  # one consistent version for the whole request
        queries = _queries(request, s, index, encoder, limits)
        if request.top_k > limits.max_top_k:
            raise HTTPException(422, f"top_k={request.top_k} exceeds the limit max_top_k={limits.max_top_k}")
        top_k = min(request.top_k, index.ntotal)
        weight = {}
        if request.weight is not None:
            if index.correction.weight_param is None:
                raise HTTPException(422, f"{index.correction.spec} has no query-time weight")
            weight = {index.correction.weight_param: request.weight}
        queries = as_embeddings(queries, "queries", normalize=index.correction.normalize, dim=index.correction.dim_)  # before batching
        if request.rerank:
            return JSONResponse(_reranked(s, index, queries, request, reranker, rerank_k, top_k, weight))
        scores, ids = s.batcher.search(index, queries, top_k, weight)
        raw = None
        if request.compare:
            from hubless.engine import exact_search

            raw_scores, raw_ids = exact_search(index.correction.queries(queries).vectors, index.correction.gallery_, top_k)
            raw = (raw_scores, raw_ids)
        body = {"index": s.name, "method": index.correction.spec, "results": [_hits(index, scores, ids, raw, i) for i in range(len(ids))]}
        return JSONResponse(body)  # plain JSON types already: skips FastAPI's generic (slow) encoder

    @app.get("/items/{name}/{item_id}/image")
    def image(name: str, item_id: int):
        s = _get(served, name)
        _check_id(s, item_id)
        meta = s.index.metadata
        path = None if meta is None else meta[item_id].get("path")
        if not path:
            raise HTTPException(404, f"item {item_id} of {name!r} names no image file (no 'path' in its metadata)")
        file = Path(str(path))
        if file.suffix.lower() not in IMAGE_SUFFIXES or not file.is_file():  # only the index's own image files
            raise HTTPException(404, f"item {item_id}'s image is not an image file that exists here")
        return FileResponse(file)

    def writable(name: str) -> _Served:
        if api_key is None:
            raise HTTPException(403, "writes are disabled: start the server with --api-key-file to enable them")
        if not writes:
            raise HTTPException(403, "writes are disabled with several --workers (each holds its own copy); serve with --workers 1")
        return _get(served, name)

    @app.post("/items/{name}")
    def add_items(name: str, request: ItemsRequest) -> dict:
        s = writable(name)
        rows = _rows(request.embeddings, s.index, limits)
        if request.metadata is not None and len(request.metadata) != rows.shape[0]:
            raise HTTPException(422, f"{len(request.metadata)} metadata records for {rows.shape[0]} items")
        start = s.index.ntotal
        s.write(lambda index: index.add(rows, request.metadata))
        return {**_summary(s), "added": list(range(start, start + rows.shape[0]))}

    @app.delete("/items/{name}/{item_id}")
    def remove_item(name: str, item_id: int) -> dict:
        s = writable(name)
        _check_id(s, item_id)
        s.write(lambda index: index.remove([item_id]))
        return {**_summary(s), "removed": item_id, "note": "later items moved up by one position"}

    @app.post("/bank/{name}")
    def add_bank(name: str, request: ItemsRequest) -> dict:
        s = writable(name)
        rows = _rows(request.embeddings, s.index, limits)
        s.write(lambda index: index.add_query_bank(rows))
        return {**_summary(s), "bank_queries_added": int(rows.shape[0])}

    @app.get("/hubness/{name}")
    def hubness(name: str) -> dict:
        s = _get(served, name)
        return _hubness(s)

    @app.get("/metrics", response_class=PlainTextResponse)
    def metrics() -> str:
        return app.state.metrics.text()

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> str:
        return PAGE

    return app


PAGE = (resources.files("hubless.service") / "static" / "index.html").read_text(encoding="utf-8")
#: The files /items/{name}/{id}/image serves: images named by the index's own metadata, nothing else.
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp"}
#: Bank queries the hubness panel measures on (a seeded sample of the stored query bank).
HUBNESS_SAMPLE = 2000


def _hubness(s: _Served) -> dict:
    """N_1 of every gallery item over the stored query bank, before and after the correction,
    with their skewness and kurtosis, the largest hubs and the bank's coverage (computed once
    per served version of the index)."""
    index = s.index
    cached = getattr(s, "hubness", None)
    if cached is not None and cached[0] is index:
        return cached[1]
    from hubless.banks import bank_report
    from hubless.engine import exact_search
    from hubless.metrics.hubness import kurtosis, skewness

    bank = index.query_bank
    if bank is None:
        raise HTTPException(422, f"index {s.name!r} was saved without its query bank: no hubness to show")
    if bank.shape[0] > HUBNESS_SAMPLE:
        bank = bank[np.sort(np.random.default_rng(0).choice(bank.shape[0], HUBNESS_SAMPLE, replace=False))]
    gallery = index.correction.gallery_
    before = np.bincount(exact_search(bank, gallery, 1)[1][:, 0], minlength=index.ntotal)
    ids = index.search(bank, 1)[1][:, 0]
    after = np.bincount(ids[ids >= 0], minlength=index.ntotal)
    hubs = np.argsort(-before, kind="stable")[:10]
    meta = index.metadata
    result = {
        "index": s.name,
        "n_bank_queries": int(bank.shape[0]),
        "before": {"skewness": skewness(before), "kurtosis": kurtosis(before), "max": int(before.max())},
        "after": {"skewness": skewness(after), "kurtosis": kurtosis(after), "max": int(after.max())},
        "coverage": bank_report(gallery, bank, normalize=False).coverage,
        "hubs": [
            {"id": int(j), "n1_before": int(before[j]), "n1_after": int(after[j]), "metadata": None if meta is None else meta[int(j)]}
            for j in hubs
        ],  # fmt: skip
        "histogram": {"before": np.bincount(before).tolist(), "after": np.bincount(after).tolist()},
    }
    s.hubness = (index, result)
    return result


def _authorised(request: Request, api_key: str) -> bool:
    given = request.headers.get("x-api-key") or request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), api_key.encode())


def _version() -> str:
    from hubless import __version__

    return __version__


def _only(served: dict[str, _Served]) -> str:
    if len(served) != 1:
        raise HTTPException(422, f"several indexes are served ({', '.join(sorted(served))}): name one with 'index'")
    return next(iter(served))


def _get(served: dict[str, _Served], name: str) -> _Served:
    if name not in served:
        raise HTTPException(404, f"no index named {name!r}; served: {', '.join(sorted(served))}")
    return served[name]


def _check_id(s: _Served, item_id: int) -> None:
    if not 0 <= item_id < s.index.ntotal:
        raise HTTPException(404, f"index {s.name!r} has no item {item_id} (ids are 0 .. {s.index.ntotal - 1})")


def _summary(s: _Served) -> dict:
    index = s.index
    corr = index.correction
    weight = None if corr.weight_param is None else {"name": corr.weight_param, "value": float(corr.weight())}
    return {"name": s.name, "n_items": index.ntotal, "method": corr.spec, "factory": index.factory, "model": index.model, "weight": weight}


def _queries(request: SearchRequest, s: _Served, index, encoder, limits: Limits) -> np.ndarray:
    given = [k for k in ("embeddings", "texts", "item") if getattr(request, k) is not None]
    if len(given) != 1:
        raise HTTPException(422, f"give exactly one of embeddings, texts or item (got {', '.join(given) or 'none'})")
    if request.item is not None:
        _check_id(s, request.item)
        return index.correction.gallery_[request.item : request.item + 1]
    if request.embeddings is not None:
        return _rows(request.embeddings, index, limits, "queries")  # NaN/Inf are refused by the index's validation (422)
    _check_count(request.texts, limits, "queries")
    if encoder is None:
        raise HTTPException(422, "text queries need a model: start the server with --model (or search with embeddings)")
    if index.model is not None and index.model not in (encoder.name, os.path.basename(str(encoder.name).rstrip("/"))):
        raise HTTPException(422, f"index {s.name!r} holds {index.model} embeddings; the server's model is {encoder.name}")
    from hubless.encoders import encode_queries

    return encode_queries(encoder, texts=request.texts, expected_dim=index.correction.dim_)


RERANK_COLUMNS = ("path", "text", "caption", "item")


def _reranked(s: _Served, index, queries, request: SearchRequest, reranker, rerank_k: int, top_k: int, weight: dict) -> dict:
    """Retrieve the corrected top ``rerank_k``, rerank with the cross-encoder (hubless.rerank.Pipeline)."""
    from hubless.rerank import Pipeline

    if reranker is None:
        raise HTTPException(422, "reranking needs a server started with --rerank MODEL")
    if request.texts is None:
        raise HTTPException(422, "reranking needs text queries: the cross-encoder reads the query text")
    meta = index.metadata
    column = next((c for c in RERANK_COLUMNS if meta and c in meta[0]), None)
    if column is None:
        raise HTTPException(
            422, f"index {s.name!r} has no item text or path in its metadata ({', '.join(RERANK_COLUMNS)}) to rerank against"
        )
    k = min(rerank_k, index.ntotal)
    pipe = Pipeline(index, reranker, k=k, gallery_items=[str(m.get(column, "")) for m in meta])
    result = pipe.search(queries, request.texts, top_k=min(top_k, k), **weight)
    out = []
    for row in range(result.ids.shape[0]):
        hits = [{**_hit(index, j, v), "first_stage_score": _plain(float(f))}
                for j, v, f in zip(result.ids[row], result.scores[row], result.first_stage_scores[row]) if j >= 0]  # fmt: skip
        out.append({"query": row, "hits": hits})
    return {"index": s.name, "method": index.correction.spec, "reranked": True, "rerank_k": k, "results": out}


def _check_count(batch: list, limits: Limits, what: str) -> None:
    if not batch:
        raise HTTPException(422, f"no {what} given")
    if len(batch) > limits.max_batch:
        raise HTTPException(422, f"{len(batch)} {what} exceed the limit max_batch={limits.max_batch}")


def _rows(embeddings: list[list[float]], index, limits: Limits, what: str = "rows") -> np.ndarray:
    """A batch of request rows (queries, new items, bank queries) as float32, size and dimension checked."""
    _check_count(embeddings, limits, what)
    dims = {len(r) for r in embeddings}
    if dims != {index.correction.dim_}:
        raise HTTPException(422, f"{what} must have dimension {index.correction.dim_}; got {sorted(dims)}")
    return np.asarray(embeddings, dtype=np.float32)


def _hit(index, item_id, score) -> dict:
    """One result: id, the score shown (None when not finite) and the item's metadata."""
    return {"id": int(item_id), "score": _plain(float(score)), "metadata": None if index.metadata is None else index.metadata[int(item_id)]}


def _hits(index, scores, ids, raw, row: int) -> dict:
    found = ids[row] >= 0
    hits = [_hit(index, j, v) for j, v in zip(ids[row][found], scores[row][found])]
    out = {"query": row, "hits": hits}
    if raw is not None:
        raw_scores, raw_ids = raw
        before = {int(j): r for r, j in enumerate(raw_ids[row], start=1)}
        for rank, hit in enumerate(hits, start=1):
            hit["uncorrected_rank"] = before.get(hit["id"])
            hit["rank_change"] = None if hit["uncorrected_rank"] is None else hit["uncorrected_rank"] - rank
        out["uncorrected"] = [_hit(index, j, v) for j, v in zip(raw_ids[row], raw_scores[row])]
    return out


def _plain(value):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
