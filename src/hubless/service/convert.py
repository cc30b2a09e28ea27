"""Between JSON and arrays: request rows to float32 (count and dimension checked), results and
index summaries to plain JSON types."""

from __future__ import annotations

import math

import numpy as np
from fastapi import HTTPException

from hubless.service.settings import Limits
from hubless.service.state import Served

__all__ = ["check_count", "hit", "hits", "plain", "rows", "summary"]


def check_count(batch: list, limits: Limits, what: str) -> None:
    if not batch:
        raise HTTPException(422, f"no {what} given")
    if len(batch) > limits.max_batch:
        raise HTTPException(422, f"{len(batch)} {what} exceed the limit max_batch={limits.max_batch}")


def rows(embeddings: list[list[float]], index, limits: Limits, what: str = "rows") -> np.ndarray:
    """A batch of request rows (queries, new items, bank queries) as float32, size and dimension checked."""
    check_count(embeddings, limits, what)
    dims = {len(r) for r in embeddings}
    if dims != {index.correction.dim_}:
        raise HTTPException(422, f"{what} must have dimension {index.correction.dim_}; got {sorted(dims)}")
    return np.asarray(embeddings, dtype=np.float32)


def summary(s: Served) -> dict:
    index = s.index
    corr = index.correction
    weight = None if corr.weight_param is None else {"name": corr.weight_param, "value": float(corr.weight())}
    return {"name": s.name, "n_items": index.ntotal, "method": corr.spec, "factory": index.factory, "model": index.model, "weight": weight}


def hit(index, item_id, score) -> dict:
    """One result: id, the score shown (None when not finite) and the item's metadata."""
    return {"id": int(item_id), "score": plain(float(score)), "metadata": None if index.metadata is None else index.metadata[int(item_id)]}


def hits(index, scores, ids, raw, row: int) -> dict:
    found = ids[row] >= 0
    out_hits = [hit(index, j, v) for j, v in zip(ids[row][found], scores[row][found])]
    out = {"query": row, "hits": out_hits}
    if raw is not None:
        raw_scores, raw_ids = raw
        before = {int(j): r for r, j in enumerate(raw_ids[row], start=1)}
        for rank, h in enumerate(out_hits, start=1):
            h["uncorrected_rank"] = before.get(h["id"])
            h["rank_change"] = None if h["uncorrected_rank"] is None else h["uncorrected_rank"] - rank
        out["uncorrected"] = [hit(index, j, v) for j, v in zip(raw_ids[row], raw_scores[row])]
    return out


def plain(value):
    """JSON-safe: numpy scalars to Python, non-finite floats to None."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
