"""``POST /search``: queries as embeddings (JSON lists or base64 float32), texts or images
(encoded with the index's model) or an item id; top_k; the correction's weight; ``compare``
adds the uncorrected ranking (through the same index structure) and each hit's rank change;
``where`` filters on metadata; ``rerank`` reranks with the server's cross-encoder.
``POST /search/binary``: the same for a body of raw little-endian float32 query rows, with the
options in the query string. Thin layers over :meth:`hubless.search.Searcher.search`
(concurrent requests batched); answers serialized with orjson."""

from __future__ import annotations

import base64
import binascii
import functools
import io
from typing import Annotated, Any

import numpy as np
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import JSONResponse

from hubless._validation import exactly_one
from hubless.service.answers import SearchAnswer
from hubless.service.batching import omp_threads_for
from hubless.service.body import check_content_type, json_body, parse_json
from hubless.service.convert import check_count, rows
from hubless.service.deps import ServiceDep, get_served, only_index
from hubless.service.guard import BodyTooLarge
from hubless.service.learning import client_of
from hubless.service.schemas import MAX_WEIGHT, TOP_K_HELP, SearchRequest
from hubless.service.state import Served, ServiceState

router = APIRouter()


class FastJSON(JSONResponse):
    """A JSON answer serialized by orjson (NaN and infinities become null). A JSONResponse, so
    the OpenAPI schema shows the route's ``response_model``; returned as it is, never validated."""

    media_type = "application/json"

    def render(self, content) -> bytes:
        import orjson

        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


@router.post("/search", response_class=FastJSON, openapi_extra=json_body(SearchRequest), response_model=SearchAnswer)
async def search(http: Request, service: ServiceDep) -> FastJSON:
    """Search with a ``SearchRequest``: embeddings, texts, images or an item id, top_k, weight,
    compare, where, rerank (see docs/service.md). The body is parsed and checked off the event
    loop, its shape bounded before it is built; concurrent searches of one index are batched."""
    from starlette.concurrency import run_in_threadpool

    check_content_type(http)
    raw = await http.body()
    return await run_in_threadpool(_parse_and_search, raw, service, client_of(http.scope))


def _parse_and_search(raw: bytes, service: ServiceState, client: str | None = None) -> FastJSON:
    return _search(parse_json(raw, SearchRequest, service.body_shape), service, client)


def _search(request: SearchRequest, service: ServiceState, client: str | None = None) -> FastJSON:
    s = get_served(service, request.index if request.index is not None else only_index(service))
    limits = service.limits
    exactly_one({k: getattr(request, k) for k in ("embeddings", "embeddings_b64", "texts", "images", "item")})  # 422
    embeddings: Any = None
    images: list | None = None
    if request.embeddings is not None:
        embeddings = rows(request.embeddings, s.index, limits, "queries")  # NaN/Inf are refused by the index's validation (422)
    elif request.embeddings_b64 is not None:
        try:
            raw = base64.b64decode(request.embeddings_b64, validate=True)
        except (binascii.Error, ValueError):
            raise HTTPException(422, "embeddings_b64 is not valid base64") from None
        embeddings = _float32_rows(raw, s, limits, "embeddings_b64")
    elif request.texts is not None:
        check_count(request.texts, limits, "queries")
        longest = max(len(t) for t in request.texts)
        if longest > limits.max_text_chars:
            raise HTTPException(422, f"a text query of {longest} characters exceeds the limit max_text_chars={limits.max_text_chars}")
    elif request.images is not None:
        check_count(request.images, limits, "queries")
        images = [_image(b, i) for i, b in enumerate(request.images)]
    n_queries = 1 if request.item is not None else len(embeddings if embeddings is not None else request.texts or images or [])
    learn_from = None if request.item is not None else client  # an item query is a gallery item, not a query: not learned
    return FastJSON(
        _answer(
            service,
            s,
            n_queries,
            request.top_k,
            request.compare,
            request.rerank,
            dict(embeddings=embeddings, texts=request.texts, images=images, item=request.item),
            weight=request.weight,
            where=request.where,
            version=request.version,
            learn_from=learn_from,
        )
    )


@router.post("/search/binary", response_class=FastJSON, response_model=SearchAnswer)
async def search_binary(
    request: Request,
    service: ServiceDep,
    index: str | None = None,
    top_k: Annotated[int, Query(ge=1, description=TOP_K_HELP)] = 10,
    weight: Annotated[float | None, Query(ge=0, le=MAX_WEIGHT, allow_inf_nan=False, description="The query-time weight.")] = None,
    compare: bool = False,
) -> FastJSON:
    """Body: n x d little-endian float32 values (``content-type: application/octet-stream``)."""
    from starlette.concurrency import run_in_threadpool

    s = get_served(service, index if index is not None else only_index(service))
    try:
        raw = await request.body()
    except BodyTooLarge:
        raise
    embeddings = _float32_rows(raw, s, service.limits, "the body")
    return FastJSON(
        await run_in_threadpool(
            _answer,
            service,
            s,
            embeddings.shape[0],
            top_k,
            compare,
            False,
            dict(embeddings=embeddings),
            weight=weight,
            where=None,
            learn_from=client_of(request.scope),
        )
    )


def _answer(service: ServiceState, s: Served, n_queries: int, top_k: int, compare: bool, rerank: bool, queries: dict, **options) -> dict:
    limits = service.limits
    if top_k > limits.max_top_k:
        raise HTTPException(422, f"top_k={top_k} exceeds the limit max_top_k={limits.max_top_k}")
    # beyond the items, the library's unfilled slots (id -1) are left out of the answer: not counted
    hits = n_queries * min(top_k, s.index.ntotal) * (2 if compare else 1)
    if hits > limits.max_result_hits:
        raise HTTPException(
            422,
            f"{n_queries} queries x top_k {top_k}{' x 2 (compare)' if compare else ''} = {hits} results exceed the limit max_result_hits={limits.max_result_hits}",
        )
    omp_threads_for(n_queries)  # this worker thread's FAISS team (compare's search runs here)
    learn_from = options.pop("learn_from", None)  # --learn-bank: the client whose queries Served.run passes to the learner
    runner = s.run if learn_from is None else functools.partial(s.run, learn_from=learn_from)
    result = service.searcher.search(s.name, **queries, top_k=top_k, compare=compare, rerank=rerank, runner=runner, **options)
    current = s.searcher.index(s.name)
    if getattr(current, "read_only", False):  # an attached collection's or a store's search runs outside s.run: counted here
        s.sketch.add(result.ids, current.ntotal)
    body: dict[str, Any] = {"index": s.name, "method": result.method}
    if result.reranked:
        body.update(reranked=True, rerank_k=result.rerank_k)
    body["results"] = result.records()
    return body


def _float32_rows(raw: bytes, s: Served, limits, what: str) -> np.ndarray:
    dim = s.index.info()["dim"]
    if not raw or len(raw) % (4 * dim):
        raise HTTPException(422, f"{what} must hold n x {dim} float32 values (n x {4 * dim} bytes); got {len(raw)} bytes")
    queries = np.frombuffer(raw, dtype="<f4").reshape(-1, dim)
    if queries.shape[0] > limits.max_batch:
        raise HTTPException(422, f"{queries.shape[0]} queries exceed the limit max_batch={limits.max_batch}")
    return queries.astype(np.float32)


def _image(data: str, i: int):
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise HTTPException(422, "image queries need pillow on the server (the models extra)") from None
    try:
        raw = base64.b64decode(data, validate=True)
        image = Image.open(io.BytesIO(raw))
        image.load()
        return image.convert("RGB")
    except (binascii.Error, ValueError, OSError, UnidentifiedImageError, Image.DecompressionBombError):
        raise HTTPException(422, f"images[{i}] is not a readable image file in base64") from None
