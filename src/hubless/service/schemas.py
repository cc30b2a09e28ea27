"""The request bodies of the HTTP API (pydantic models, documented at ``/docs``; parsed by
:mod:`hubless.service.body`). Unknown fields are refused (422), so a misspelt option never
passes silently, and types are strict: ``"top_k": "3"`` or ``true`` is refused, not converted;
the weight is finite and at most :data:`MAX_WEIGHT`."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from hubless.index.ids import MAX_ID

__all__ = ["MAX_ID", "MAX_WEIGHT", "DeleteRequest", "ItemsRequest", "MetadataRequest", "SearchRequest"]

#: An item id in a body: an int64 >= 0.
Id = Annotated[int, Field(ge=0, le=MAX_ID)]
#: The largest query-time weight accepted: the papers' grids stop at 1.5, and DN's score has a
#: lam^2 term that a weight near 1e19 takes past float32's range (scores turn into null).
MAX_WEIGHT = 1000.0
#: What /docs says of top_k (the one top-k rule: the library pads, the answer leaves the padding out).
TOP_K_HELP = "Results per query, at most the server's max_top_k; beyond the index's items every item is returned (no error)."


class SearchRequest(BaseModel):
    """``POST /search``: exactly one of ``embeddings``, ``embeddings_b64``, ``texts``, ``images``
    or ``item``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    index: str | None = Field(None, description="Index name (default: the only one served).")
    embeddings: list[list[float]] | None = Field(None, description="Query embeddings, one list per query.")
    embeddings_b64: str | None = Field(
        None, description="Query embeddings as base64 of little-endian float32, row after row (n x the index's dimension)."
    )
    texts: list[str] | None = Field(None, description="Text queries, encoded with the model the index records.")
    images: list[str] | None = Field(
        None, description="Image queries: base64 of image files (PNG, JPEG, ...), encoded with the index's model (an image encoder)."
    )
    item: Id | None = Field(None, description="A gallery item id: search with its embedding ('more like this').")
    top_k: int = Field(10, ge=1, description=TOP_K_HELP)
    weight: float | None = Field(
        None, ge=0, le=MAX_WEIGHT, allow_inf_nan=False, description="The correction's query-time weight (NNN alpha, DN lambda)."
    )
    compare: bool = Field(False, description="Also return the uncorrected ranking (same index structure) and each hit's rank change.")
    where: dict[str, Any] | None = Field(
        None,
        description='A metadata filter: {"split": "test", "year": {"gte": 2020}, "tag": {"in": ["a", "b"]}} (Index.search(where=...)).',
    )
    rerank: bool = Field(False, description="Rerank the corrected top rerank_k with the server's cross-encoder (text queries).")
    version: int | None = Field(
        None, ge=1, description="Search this kept version of the index instead of the current one (GET /versions/{name} lists them)."
    )


class ItemsRequest(BaseModel):
    """``POST /items/{name}`` and ``POST /bank/{name}``: rows to add (and, for items, metadata)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    embeddings: list[list[float]] = Field(..., description="One list per new item (or bank query).")
    metadata: list[dict[str, Any]] | None = Field(None, description="One record per new item (typed by the index's metadata schema).")
    ids: list[Id] | None = Field(None, description="The new items' ids (int64 >= 0; default: assigned by the index, never reused).")
    upsert: bool = Field(False, description="Replace the items whose ids are present (needs ids) instead of refusing them (409).")


class DeleteRequest(BaseModel):
    """``POST /items/{name}/delete``: the items to remove, by ``ids`` or by a ``where`` filter."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[Id] | None = Field(None, description="Ids of the items to remove (all or nothing: an unknown id removes none, 404).")
    where: dict[str, Any] | None = Field(
        None, description='Instead of ids: remove every item matching this metadata filter, e.g. {"split": "old"} (as search\'s where).'
    )


class MetadataRequest(BaseModel):
    """``POST /items/{name}/metadata``: set / unset metadata keys of items (by ``ids`` or a
    ``where`` filter) without sending their embeddings again."""

    model_config = ConfigDict(extra="forbid", strict=True)

    ids: list[Id] | None = Field(None, description="The items to change (an unknown id changes nothing, 404).")
    where: dict[str, Any] | None = Field(None, description="Instead of ids: every item matching this metadata filter.")
    set: dict[str, Any] | list[dict[str, Any]] | None = Field(
        None, description="Keys to set: one object for every item, or with ids one object per id (typed as on add; 422 otherwise)."
    )
    unset: list[str] | None = Field(None, description="Keys to set to null.")
