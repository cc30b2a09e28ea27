"""Choose an ANN index's search breadth for a target recall, measured on held-out queries.

How many IVF lists to visit (``nprobe``) or how wide an HNSW beam to keep (``ef_search``)
depends on the data: on hard, high-dimensional data the defaults can find well under half of
the true top 10 (see the README's index benchmark). :func:`calibrate` doubles the knob from
small values until the index's corrected top-k holds ``target_recall`` of the exact corrected
top-k (recall@k = mean over queries of |ANN top-k & exact top-k| / k) on a sample of queries,
then makes that value the index default. The sample defaults to the stored query bank: the
queries' own modality, and never test queries.
"""

from __future__ import annotations

import numpy as np

from hubless._validation import as_embeddings, check_positive_int
from hubless.errors import InvalidInput

__all__ = ["calibrate"]


def calibrate(index, queries=None, *, target_recall: float = 0.95, top_k: int = 10, sample: int = 1000, seed: int = 0) -> dict:
    """Set ``index.config.nprobe`` (IVF) or ``.ef_search`` (HNSW) to the smallest power of two whose
    recall@``top_k`` against exact corrected search reaches ``target_recall`` on up to ``sample``
    of ``queries`` (default: the stored query bank). Returns ``{"param", "value", "recall",
    "reached", "curve": [[value, recall], ...]}``; when even the largest value falls short it
    is kept and ``reached`` is False. Flat indexes are exact: nothing to choose.
    """
    if not 0.0 < float(target_recall) <= 1.0:
        raise InvalidInput(f"target_recall must be in (0, 1]; got {target_recall}")
    check_positive_int(sample, "sample")
    corr = index.correction
    if queries is None:
        if index.query_bank is None:
            raise InvalidInput("this index keeps no query bank: pass queries of the search modality to calibrate on")
        queries = index.query_bank
    q = as_embeddings(queries, "queries", normalize=corr.normalize, dim=corr.dim_)
    if q.shape[0] > sample:
        q = q[np.sort(np.random.default_rng(seed).choice(q.shape[0], sample, replace=False))]
    top_k = min(check_positive_int(top_k, "top_k"), index.ntotal)
    knob = index.search_knob()
    if knob is None:
        return {"param": None, "value": None, "recall": 1.0, "reached": True, "curve": []}
    param, limit = knob
    values = _powers_of_two(limit, start=1 if param == "nprobe" else 16)
    exact = index.ids[corr.search(q, top_k)[1]]  # the correction ranks positions; the index returns item ids
    curve = []
    for value in values:
        ids = index.search(q, top_k, **{param: value})[1]
        hits = (ids[:, :, None] == exact[:, None, :]).any(axis=2).sum(axis=1)
        curve.append([value, float(hits.mean() / top_k)])
        if curve[-1][1] >= target_recall:
            break
    setattr(index.config, param, curve[-1][0])
    return {"param": param, "value": curve[-1][0], "recall": curve[-1][1], "reached": curve[-1][1] >= target_recall, "curve": curve}


def _powers_of_two(limit: int, start: int = 1) -> list[int]:
    values = [start]
    while values[-1] < limit:
        values.append(min(2 * values[-1], limit))
    return values
