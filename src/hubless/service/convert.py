"""Between JSON and arrays: request rows to float32 (count and dimension checked), results and
index summaries to plain JSON types."""

from __future__ import annotations

import math
import os

import numpy as np
from fastapi import HTTPException

from hubless.service.settings import Limits
from hubless.service.state import Served

__all__ = ["check_count", "plain", "rows", "summary"]


def check_count(batch: list, limits: Limits, what: str) -> None:
    if not batch:
        raise HTTPException(422, f"no {what} given")
    if len(batch) > limits.max_batch:
        raise HTTPException(422, f"{len(batch)} {what} exceed the limit max_batch={limits.max_batch}")


def rows(embeddings: list[list[float]], index, limits: Limits, what: str = "rows") -> np.ndarray:
    """A batch of request rows (queries, new items, bank queries) as float32, size and dimension checked."""
    check_count(embeddings, limits, what)
    dims = {len(r) for r in embeddings}
    dim = index.info()["dim"]
    if dims != {dim}:
        raise HTTPException(422, f"{what} must have dimension {dim}; got {sorted(dims)}")
    return np.asarray(embeddings, dtype=np.float32)


def public_model(name: str | None) -> str | None:
    """A model name fit to show: a hub name as it is, a local folder by its last part only."""
    if name is None:
        return None
    text = str(name).rstrip("/\\")
    if os.path.isabs(text) or text.startswith(".") or os.sep in text and os.path.exists(text):
        return os.path.basename(text)
    return text


def summary(s: Served) -> dict:
    index = s.index
    info = index.info()
    name = index.weight_param
    weight = None if name is None else {"name": name, "value": index.weight}
    return {
        "name": s.name,
        "n_items": index.ntotal,
        "method": info["method"],
        "factory": index.factory,
        "model": public_model(index.model),
        "weight": weight,
        "queries": s.searcher.query_kinds(s.name),
        "metadata_columns": sorted(info["metadata_columns"]),
    }


def plain(value):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
