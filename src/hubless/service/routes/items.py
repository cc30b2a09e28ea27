"""Items, by their stable ids: ``GET /items/{name}/{id}`` (metadata), ``GET /items/{name}/{id}/image``
(only from the server's image root), and the writes (write key needed): ``POST /items/{name}``
(add, with ``ids`` or assigned ones; ``upsert`` replaces present ids), ``DELETE
/items/{name}/{id}`` (remove), ``POST /items/{name}/delete`` (remove by ids or a ``where``
filter), ``POST /items/{name}/metadata`` (set / unset metadata keys of items by ids or a filter,
no embeddings sent), ``POST /bank/{name}`` (add query-bank queries; every bias is updated),
``POST /bank/{name}/refit`` and ``POST /bank/{name}/reset`` (a learned bank, ``--learn-bank``:
refit now, or forget the queries learned so far),
``POST /versions/{name}/{version}/restore`` (make a kept version current again). A write is all or nothing and committed at once as one segment under the index's
write lock (see :class:`hubless.service.state.Served`), then appended to the write log."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request

from hubless.service.answers import BankAdded, BankLearned, Item, ItemRemoved, ItemsAdded, ItemsDeleted, MetadataUpdated, VersionRestored
from hubless.service.body import json_body, read_json
from hubless.service.convert import check_count, rows, summary
from hubless.service.deps import ServiceDep, check_id, get_served, record_write, writable
from hubless.service.images import OpenFileResponse, open_image
from hubless.service.schemas import MAX_ID, DeleteRequest, ItemsRequest, MetadataRequest
from hubless.service.state import ServiceState

router = APIRouter()

#: An item id in a path: an int64 >= 0 (anything else is a 422 naming the range, never a 500).
ItemId = Annotated[int, Path(ge=0, le=MAX_ID, description="The item's id (an int64 >= 0).")]


@router.get("/items/{name}/{item_id}", response_model=Item, response_model_exclude_unset=True)
def item(name: str, item_id: ItemId, service: ServiceDep) -> dict:
    s = get_served(service, name)
    index = s.index
    check_id(s, item_id)
    return {"id": item_id, "metadata": None if index.metadata_schema is None else index.records([item_id])[0]}


@router.get(
    "/items/{name}/{item_id}/image", response_class=OpenFileResponse, status_code=200, responses={200: {"content": {"image/*": {}}}}
)
def image(name: str, item_id: ItemId, service: ServiceDep) -> OpenFileResponse:
    s = get_served(service, name)
    index = s.index
    check_id(s, item_id)
    meta = None if index.metadata_schema is None else index.records([item_id])[0]
    found = open_image(service.settings.image_root, None if meta is None else meta.get("path"))
    if found is None:  # says nothing about the disk: not configured, not named, outside the root, not an image alike
        raise HTTPException(404, f"no image for item {item_id} of {s.name!r}")
    fd, media_type = found
    return OpenFileResponse(fd, media_type, {"cache-control": "private, max-age=3600"})  # the opened file, never reopened


@router.post("/items/{name}", openapi_extra=json_body(ItemsRequest), response_model=ItemsAdded, response_model_exclude_unset=True)
async def add_items(name: str, request: Request, service: ServiceDep) -> dict:
    return await write_with_body(name, request, service, ItemsRequest, _add_items)


def _add_items(name: str, body: ItemsRequest, request: Request, service: ServiceState) -> dict:
    s = writable(service, name)
    new = rows(body.embeddings, s.index, service.limits)
    if body.metadata is not None and len(body.metadata) != new.shape[0]:
        raise HTTPException(422, f"{len(body.metadata)} metadata records for {new.shape[0]} items")
    if body.ids is not None and len(body.ids) != new.shape[0]:
        raise HTTPException(422, f"{len(body.ids)} ids for {new.shape[0]} items")
    if body.upsert and body.ids is None:
        raise HTTPException(422, "upsert needs ids (the items to replace or add)")

    def change(index):
        if body.upsert:
            return index.upsert(body.ids, new, body.metadata).tolist()
        return index.add(new, body.metadata, ids=body.ids).tolist()

    added = s.write(change)
    record_write(service, request, name, added)
    return {**summary(s), "added": added}


@router.delete("/items/{name}/{item_id}", response_model=ItemRemoved, response_model_exclude_unset=True)
def remove_item(name: str, item_id: ItemId, request: Request, service: ServiceDep) -> dict:
    s = writable(service, name)
    s.write(lambda index: index.remove([item_id]))  # an unknown id: 404, nothing removed
    record_write(service, request, name, [item_id])
    return {**summary(s), "removed": item_id}


@router.post("/bank/{name}", openapi_extra=json_body(ItemsRequest), response_model=BankAdded, response_model_exclude_unset=True)
async def add_bank(name: str, request: Request, service: ServiceDep) -> dict:
    return await write_with_body(name, request, service, ItemsRequest, _add_bank)


def _add_bank(name: str, body: ItemsRequest, request: Request, service: ServiceState) -> dict:
    s = writable(service, name)
    new = rows(body.embeddings, s.index, service.limits)
    s.write(lambda index: index.add_query_bank(new))
    record_write(service, request, name, {"bank_queries_added": int(new.shape[0])})
    return {**summary(s), "bank_queries_added": int(new.shape[0])}


@router.post("/bank/{name}/refit", response_model=BankLearned, response_model_exclude_unset=True)
def refit_bank(name: str, request: Request, service: ServiceDep) -> dict:
    """Refit a learned bank now (``--learn-bank``; write key): admit what is queued, refit,
    judge, and adopt or reject; answers the decision (none when there are too few queries)."""
    s = _learning(service, name)
    s.learner.admit()
    decision = s.learner.refit()  # audited by the learner's on_decision when it decides
    return {**summary(s), "decision": decision}


@router.post("/bank/{name}/reset", response_model=BankLearned, response_model_exclude_unset=True)
def reset_bank(name: str, request: Request, service: ServiceDep) -> dict:
    """Forget every query a learned bank holds (its seed stays; the index keeps its version)."""
    s = _learning(service, name)
    reservoir = s.learner.reset()
    record_write(service, request, name, {"learned_bank_reset": True})
    return {**summary(s), "reservoir": reservoir}


def _learning(service: ServiceState, name: str):
    s = writable(service, name)
    if s.learner is None:
        raise HTTPException(409, f"{s.name!r} does not learn its bank: serve it with --learn-bank {s.name}")
    return s


@router.post("/items/{name}/delete", openapi_extra=json_body(DeleteRequest), response_model=ItemsDeleted, response_model_exclude_unset=True)
async def delete_items(name: str, request: Request, service: ServiceDep) -> dict:
    return await write_with_body(name, request, service, DeleteRequest, _delete_items)


def _delete_items(name: str, body: DeleteRequest, request: Request, service: ServiceState) -> dict:
    s = writable(service, name)
    if (body.ids is None) == (body.where is None):
        raise HTTPException(422, "give ids or where (the items to remove), one of them")
    if body.ids is not None:
        check_count(body.ids, service.limits, "ids")
        removed = s.write(lambda index: index.remove(body.ids)).tolist()
    else:
        removed = s.write(lambda index: index.remove(where=body.where)).tolist()
    record_write(service, request, name, removed)
    return {**summary(s), "removed": removed}


@router.post(
    "/items/{name}/metadata", openapi_extra=json_body(MetadataRequest), response_model=MetadataUpdated, response_model_exclude_unset=True
)
async def update_metadata(name: str, request: Request, service: ServiceDep) -> dict:
    return await write_with_body(name, request, service, MetadataRequest, _update_metadata)


def _update_metadata(name: str, body: MetadataRequest, request: Request, service: ServiceState) -> dict:
    s = writable(service, name)
    if (body.ids is None) == (body.where is None):
        raise HTTPException(422, "give ids or where (the items to change), one of them")
    if body.set is None and not body.unset:
        raise HTTPException(422, "give set and/or unset (what to change)")
    if body.ids is not None:
        check_count(body.ids, service.limits, "ids")
    if isinstance(body.set, list):
        check_count(body.set, service.limits, "metadata records")
    changed = s.write(lambda index: index.update_metadata(body.ids, where=body.where, values=body.set, unset=body.unset)).tolist()
    record_write(service, request, name, changed)
    return {**summary(s), "updated": changed}


@router.post("/versions/{name}/{version}/restore", response_model=VersionRestored, response_model_exclude_unset=True)
def restore_version(name: str, version: int, request: Request, service: ServiceDep) -> dict:
    """Make a kept version of a saved index current again, as a new version (write key)."""
    from hubless.index import Index

    s = writable(service, name)
    if s.path is None:
        raise HTTPException(422, f"index {name!r} is served from memory: it keeps no versions")
    number = s.write(lambda index: Index.restore(s.path, version, timeout=s.lock_timeout))
    record_write(service, request, name, {"restored": version, "as_version": number})
    return {**summary(s), "restored": version, "version": number}


async def write_with_body(name: str, request: Request, service: ServiceState, model, handler) -> dict:
    """A write route with a JSON body: the index must be writable before the body is read (a
    refused write reads nothing), the body is read and checked off the event loop as ``model``
    (:func:`~hubless.service.body.read_json`), and ``handler(name, body, request, service)`` runs
    in a worker thread."""
    from starlette.concurrency import run_in_threadpool

    writable(service, name)
    body = await read_json(request, model)
    return await run_in_threadpool(handler, name, body, request, service)
