"""What is served: ``GET /indexes``, ``GET /indexes/{name}``, ``GET /hubness/{name}``."""

from __future__ import annotations

from fastapi import APIRouter

from hubless.service.convert import plain, summary
from hubless.service.deps import ServiceDep, get_served
from hubless.service.hubness import bank_hubness

router = APIRouter()


@router.get("/indexes")
def list_indexes(service: ServiceDep) -> list[dict]:
    return [summary(s) for s in service.served.values()]


@router.get("/indexes/{name}")
def describe(name: str, service: ServiceDep) -> dict:
    s = get_served(service, name)
    info = {k: plain(v) for k, v in s.index.info().items()}
    banks = {
        k: None if v is None else int(v.shape[0]) for k, v in (("query_bank", s.index.query_bank), ("gallery_bank", s.index.gallery_bank))
    }
    from hubless.index.store import VERSION

    return {**summary(s), "info": info, "banks": banks, "format_version": VERSION, "path": None if s.path is None else s.path.name}


@router.get("/hubness/{name}")
def hubness(name: str, service: ServiceDep) -> dict:
    return bank_hubness(get_served(service, name))
