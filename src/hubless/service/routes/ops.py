"""Operations: ``GET /health`` (liveness and what is served) and ``GET /metrics``."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from hubless.service.deps import ServiceDep

router = APIRouter()


@router.get("/health")
def health(service: ServiceDep) -> dict:
    return {"status": "ok", "indexes": sorted(service.served)}


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(service: ServiceDep) -> str:
    return service.metrics.text()
