"""Operations: ``GET /health`` (liveness, what is served, whether keys are needed) and
``GET /metrics`` (Prometheus, see :mod:`hubless.service.telemetry`)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from hubless.service.answers import Health
from hubless.service.deps import ServiceDep
from hubless.service.telemetry import CONTENT_TYPE

router = APIRouter()


@router.get("/health", response_model=Health, response_model_exclude_unset=True)
async def health(service: ServiceDep) -> dict:
    keys = service.settings.keys
    return {
        "status": "ok",
        "indexes": sorted(service.served),
        "auth": {"required": keys.required, "read_only_key": keys.read is not None},
        "writes": keys.write is not None and service.settings.writes,
    }


@router.get("/metrics", response_class=Response)
def metrics(service: ServiceDep) -> Response:
    body = service.telemetry.text({name: s.sketch for name, s in service.served.items()}, service.learners)
    return Response(body, media_type=CONTENT_TYPE)
