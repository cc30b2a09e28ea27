"""Dependencies the routes declare: the service state, a served index by name, the write
permission, the record of a write in the write log (after the FastAPI project template's ``api/deps.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request

from hubless.service.errors import clip
from hubless.service.state import Served, ServiceState

__all__ = ["ServiceDep", "check_id", "get_served", "get_service", "only_index", "record_write", "writable"]


async def get_service(request: Request) -> ServiceState:
    """The service state (async: FastAPI runs it inline, not in a worker thread)."""
    return request.app.state.service


ServiceDep = Annotated[ServiceState, Depends(get_service)]


def get_served(service: ServiceState, name: str) -> Served:
    """The served index ``name`` (404 naming the served ones otherwise)."""
    if name not in service.served:
        raise HTTPException(404, f"no index named {clip(name)!r}; served: {', '.join(sorted(service.served))}")
    return service.served[name]


def only_index(service: ServiceState) -> str:
    """The name of the only served index (422 when several are served)."""
    if len(service.served) != 1:
        raise HTTPException(422, f"several indexes are served ({', '.join(sorted(service.served))}): name one with 'index'")
    return next(iter(service.served))


def check_id(s: Served, item_id: int) -> None:
    if item_id not in s.index:
        raise HTTPException(404, f"index {s.name!r} has no item {item_id}")


def writable(service: ServiceState, name: str) -> Served:
    """The served index ``name`` if this server accepts writes (403 saying why not otherwise;
    the write key itself is checked by :class:`hubless.service.guard.Guard`); an attached
    collection is never written here (409: write to the store, then ``hubless attach --update``), nor
    a store written by ``hubless export`` (409: change its index, then ``hubless export --sync``)."""
    if name in service.served and getattr(index := service.served[name].index, "read_only", False):
        reason = getattr(index, "read_only_reason", None)
        raise HTTPException(
            409,
            f"{clip(name)!r}: {reason}"
            if reason
            else f"{clip(name)!r} is an attached collection, served read only: write to the store itself, then run hubless attach --update",
        )
    if service.settings.keys.write is None:
        raise HTTPException(403, "writes are disabled: start the server with --api-key-file to enable them")
    if not service.settings.writes:
        raise HTTPException(403, "writes are disabled with several --workers (each holds its own copy); serve with --workers 1")
    return get_served(service, name)


def record_write(service: ServiceState, request: Request, index: str, ids) -> None:
    """Append a successful write to the write log (when one is configured)."""
    if service.write_log is not None:
        route = request.scope.get("route")
        client = request.scope.get("client")
        service.write_log.record(
            key=request.scope.get("hubless.key"),
            method=request.method,
            endpoint=getattr(route, "path", request.url.path),
            index=index,
            ids=ids,
            client=str(client[0]) if client else "unknown",
            request_id=request.scope.get("hubless.request_id"),
        )
