"""What is served: ``GET /indexes``, ``GET /indexes/{name}``, ``GET /hubness/{name}`` (the
bank-based figures, the hubness of what was served and, with ``--learn-bank``, the learned bank
and its refits over time), ``GET /versions/{name}`` (the versions a
saved index keeps, searched with ``POST /search``'s ``version``)."""

from __future__ import annotations

from fastapi import APIRouter

from hubless.service.answers import HubnessAnswer, IndexDescription, IndexListing, Versions
from hubless.service.convert import plain, public_model, summary
from hubless.service.deps import ServiceDep, get_served
from hubless.service.hubness import bank_hubness

router = APIRouter()

#: index.info() keys that name something on the server's disk: left out of answers.
PRIVATE_INFO = ("path", "model")


@router.get("/indexes", response_model=list[IndexListing], response_model_exclude_unset=True)
def list_indexes(service: ServiceDep) -> list[dict]:
    images = service.settings.image_root is not None
    return [{**summary(s), "images": images and "path" in summary(s)["metadata_columns"]} for s in service.served.values()]


@router.get("/indexes/{name}", response_model=IndexDescription, response_model_exclude_unset=True)
def describe(name: str, service: ServiceDep) -> dict:
    s = get_served(service, name)
    info = {k: plain(v) for k, v in s.index.info().items() if k not in PRIVATE_INFO}
    info["model"] = public_model(s.index.model)
    banks = {
        k: None if v is None else int(v.shape[0]) for k, v in (("query_bank", s.index.query_bank), ("gallery_bank", s.index.gallery_bank))
    }
    from hubless.index.pointer import VERSION
    from hubless.search import StoreIndex

    if isinstance(s.index, StoreIndex):  # the store's own description, typed; never its location
        return {**summary(s), "info": info, "banks": banks, "format_version": s.index.format_version, "store": store_description(s.index)}
    return {**summary(s), "info": info, "banks": banks, "format_version": VERSION}


def store_description(store) -> dict:
    """A served store, as :class:`~hubless.service.answers.StoreDescription` (from its
    :class:`~hubless.export.info.StoreInfo`): scheme and table, never its location."""
    described = store.describe()
    ann = described.ann
    return {
        "scheme": store.scheme,
        "table": store.table,
        "metric": described.metric,
        "bias_columns": described.bias_columns,
        "metadata_columns": {k: str(v) for k, v in described.metadata_columns.items()},
        "ann": None if ann is None else {"type": ann.get("type"), "knob": ann.get("knob"), "default": ann.get("default")},
    }


@router.get("/hubness/{name}", response_model=HubnessAnswer, response_model_exclude_unset=True)
def hubness(name: str, service: ServiceDep) -> dict:
    s = get_served(service, name)
    answer = {**bank_hubness(s), "served": s.sketch.summary()}
    if s.learner is not None:
        answer["learning"] = s.learner.status()
    return answer


@router.get("/versions/{name}", response_model=Versions, response_model_exclude_unset=True)
def versions(name: str, service: ServiceDep) -> dict:
    s = get_served(service, name)
    path = s.path
    if path is None:
        return {"name": name, "keep_versions": 0, "versions": []}
    from hubless.index import Index

    return {"name": name, "keep_versions": s.index.keep_versions, "versions": Index.versions(path)}
