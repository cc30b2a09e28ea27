"""Items: ``GET /items/{name}/{id}`` (metadata), ``GET /items/{name}/{id}/image``, and the
writes (API key needed): ``POST /items/{name}`` (add), ``DELETE /items/{name}/{id}`` (remove),
``POST /bank/{name}`` (add query-bank queries; every bias is updated). A write is saved
atomically under the index's write lock, then swapped in whole (see :class:`Served`)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse

from hubless.service.convert import rows, summary
from hubless.service.deps import ServiceDep, check_id, get_served, writable
from hubless.service.schemas import ItemsRequest

router = APIRouter()

#: The files /items/{name}/{id}/image serves: images named by the index's own metadata, nothing else.
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".webp", ".bmp"}


@router.get("/items/{name}/{item_id}")
def item(name: str, item_id: int, service: ServiceDep) -> dict:
    s = get_served(service, name)
    check_id(s, item_id)
    return {"id": item_id, "metadata": None if s.index.metadata is None else s.index.metadata[item_id]}


@router.get("/items/{name}/{item_id}/image")
def image(name: str, item_id: int, service: ServiceDep):
    s = get_served(service, name)
    check_id(s, item_id)
    meta = s.index.metadata
    path = None if meta is None else meta[item_id].get("path")
    if not path:
        raise HTTPException(404, f"item {item_id} of {name!r} names no image file (no 'path' in its metadata)")
    file = Path(str(path))
    if file.suffix.lower() not in IMAGE_SUFFIXES or not file.is_file():  # only the index's own image files
        raise HTTPException(404, f"item {item_id}'s image is not an image file that exists here")
    return FileResponse(file)


@router.post("/items/{name}")
def add_items(name: str, request: ItemsRequest, service: ServiceDep) -> dict:
    s = writable(service, name)
    new = rows(request.embeddings, s.index, service.limits)
    if request.metadata is not None and len(request.metadata) != new.shape[0]:
        raise HTTPException(422, f"{len(request.metadata)} metadata records for {new.shape[0]} items")
    start = s.index.ntotal
    s.write(lambda index: index.add(new, request.metadata))
    return {**summary(s), "added": list(range(start, start + new.shape[0]))}


@router.delete("/items/{name}/{item_id}")
def remove_item(name: str, item_id: int, service: ServiceDep) -> dict:
    s = writable(service, name)
    check_id(s, item_id)
    s.write(lambda index: index.remove([item_id]))
    return {**summary(s), "removed": item_id, "note": "later items moved up by one position"}


@router.post("/bank/{name}")
def add_bank(name: str, request: ItemsRequest, service: ServiceDep) -> dict:
    s = writable(service, name)
    new = rows(request.embeddings, s.index, service.limits)
    s.write(lambda index: index.add_query_bank(new))
    return {**summary(s), "bank_queries_added": int(new.shape[0])}
