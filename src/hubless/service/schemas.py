"""The request bodies of the HTTP API (pydantic models; FastAPI validates them and documents
them at ``/docs``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

__all__ = ["ItemsRequest", "SearchRequest"]


class SearchRequest(BaseModel):
    """``POST /search``: exactly one of ``embeddings``, ``texts`` or ``item``."""

    index: str | None = Field(None, description="Index name (default: the only one served).")
    embeddings: list[list[float]] | None = Field(None, description="Query embeddings, one list per query.")
    texts: list[str] | None = Field(None, description="Text queries, encoded with the server's model.")
    item: int | None = Field(None, description="A gallery item id: search with its embedding ('more like this').")
    top_k: int = Field(10, ge=1, description="Results per query.")
    weight: float | None = Field(None, ge=0, description="The correction's query-time weight (NNN alpha, DN lambda).")
    compare: bool = Field(False, description="Also return the uncorrected ranking and each hit's rank change.")
    rerank: bool = Field(False, description="Rerank the corrected top rerank_k with the server's cross-encoder (text queries).")


class ItemsRequest(BaseModel):
    """``POST /items/{name}`` and ``POST /bank/{name}``: rows to add (and, for items, metadata)."""

    embeddings: list[list[float]] = Field(..., description="One list per new item (or bank query).")
    metadata: list[dict[str, Any]] | None = Field(None, description="One record per new item.")
