"""``POST /search``: queries as embeddings, texts (needs a model) or an item id; top_k; the
correction's weight; ``compare`` adds the uncorrected ranking and each hit's rank change;
``rerank`` reranks with the server's cross-encoder."""

from __future__ import annotations

import os

import numpy as np
from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse

from hubless._validation import as_embeddings
from hubless.service.convert import check_count, hit, hits, plain, rows
from hubless.service.deps import ServiceDep, check_id, get_served, only_index
from hubless.service.schemas import SearchRequest
from hubless.service.settings import Limits
from hubless.service.state import Served

router = APIRouter()

RERANK_COLUMNS = ("path", "text", "caption", "item")


@router.post("/search")
def search(request: SearchRequest, service: ServiceDep) -> JSONResponse:
    s = get_served(service, request.index if request.index is not None else only_index(service))
    index = s.index  # one consistent version for the whole request
    limits = service.limits
    queries = _queries(request, s, index, service.encoder, limits)
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
        return JSONResponse(_reranked(s, index, queries, request, service.reranker, service.rerank_k, top_k, weight))
    scores, ids = s.batcher.search(index, queries, top_k, weight)
    raw = None
    if request.compare:
        from hubless.engine import exact_search

        raw = exact_search(index.correction.queries(queries).vectors, index.correction.gallery_, top_k)
    body = {"index": s.name, "method": index.correction.spec, "results": [hits(index, scores, ids, raw, i) for i in range(len(ids))]}
    return JSONResponse(body)  # plain JSON types already: skips FastAPI's generic (slow) encoder


def _queries(request: SearchRequest, s: Served, index, encoder, limits: Limits) -> np.ndarray:
    given = [k for k in ("embeddings", "texts", "item") if getattr(request, k) is not None]
    if len(given) != 1:
        raise HTTPException(422, f"give exactly one of embeddings, texts or item (got {', '.join(given) or 'none'})")
    if request.item is not None:
        check_id(s, request.item)
        return index.correction.gallery_[request.item : request.item + 1]
    if request.embeddings is not None:
        return rows(request.embeddings, index, limits, "queries")  # NaN/Inf are refused by the index's validation (422)
    check_count(request.texts, limits, "queries")
    if encoder is None:
        raise HTTPException(422, "text queries need a model: start the server with --model (or search with embeddings)")
    if index.model is not None and index.model not in (encoder.name, os.path.basename(str(encoder.name).rstrip("/"))):
        raise HTTPException(422, f"index {s.name!r} holds {index.model} embeddings; the server's model is {encoder.name}")
    from hubless.encoders import encode_queries

    return encode_queries(encoder, texts=request.texts, expected_dim=index.correction.dim_)


def _reranked(s: Served, index, queries, request: SearchRequest, reranker, rerank_k: int, top_k: int, weight: dict) -> dict:
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
        found = [{**hit(index, j, v), "first_stage_score": plain(float(f))}
                 for j, v, f in zip(result.ids[row], result.scores[row], result.first_stage_scores[row]) if j >= 0]  # fmt: skip
        out.append({"query": row, "hits": found})
    return {"index": s.name, "method": index.correction.spec, "reranked": True, "rerank_k": k, "results": out}
