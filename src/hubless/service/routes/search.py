"""``POST /search``: queries as embeddings, texts (encoded with the index's model) or an item
id; top_k; the correction's weight; ``compare`` adds the uncorrected ranking and each hit's
rank change; ``rerank`` reranks with the server's cross-encoder. A thin layer over
:meth:`hubless.search.Searcher.search` (concurrent requests batched)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from fastapi.responses import JSONResponse

from hubless.service.convert import check_count, rows
from hubless.service.deps import ServiceDep, get_served, only_index
from hubless.service.schemas import SearchRequest

router = APIRouter()


@router.post("/search")
def search(request: SearchRequest, service: ServiceDep) -> JSONResponse:
    s = get_served(service, request.index if request.index is not None else only_index(service))
    limits = service.limits
    if request.top_k > limits.max_top_k:
        raise HTTPException(422, f"top_k={request.top_k} exceeds the limit max_top_k={limits.max_top_k}")
    embeddings = None
    if request.embeddings is not None:
        embeddings = rows(request.embeddings, s.index, limits, "queries")  # NaN/Inf are refused by the index's validation (422)
    if request.texts is not None:
        check_count(request.texts, limits, "queries")
    result = service.searcher.search(
        s.name,
        embeddings=embeddings,
        texts=request.texts,
        item=request.item,
        top_k=request.top_k,
        weight=request.weight,
        compare=request.compare,
        rerank=request.rerank,
        runner=s.run,
    )
    body = {"index": s.name, "method": result.method}
    if result.reranked:
        body.update(reranked=True, rerank_k=result.rerank_k)
    body["results"] = result.records()
    return JSONResponse(body)  # plain JSON types already: skips FastAPI's generic (slow) encoder
