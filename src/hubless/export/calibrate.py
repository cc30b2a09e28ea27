"""Choose a store's search knob for a target recall, measured on the index's query bank.

How far an ANN index must look (IVF partitions probed, ``nprobe``; HNSW candidates kept,
``ef_search``) to find a given share of the exact corrected top 10 depends on the data: the
store defaults find 0.45-0.69 of it on 20k x 256 hub-prone data. At export, :func:`measure_curve`
searches the new table with increasing knob values for a sample of the index's query bank (the
queries' own modality; never test queries) and records recall@10 against the exact corrected
top 10 (``Correction.search``) per value: the curve is kept in the store's info
(``describe()["ann"]``) and the smallest value reaching ``target_recall`` on the bank, with half
the allowed misses kept as margin (:func:`with_margin`: 0.975 for 0.95), becomes the default.
At search, ``target_recall=`` picks the smallest measured value reaching it
(:func:`knob_for_target`). recall@k = mean over queries of |ANN top-k & exact top-k| / k.
"""

from __future__ import annotations

import numpy as np

from hubless._validation import check_target_recall
from hubless.errors import InvalidInput

__all__ = ["check_target", "knob_for_target", "knob_values", "measure_curve", "recall_at"]

#: The curve is measured until this recall (or the target, if higher) is reached.
MEASURE_UNTIL = 0.99
#: Queries of the bank the curve is measured on, and the k of recall@k.
SAMPLE, TOP_K = 200, 10


def check_target(target) -> float | None:
    """``target_recall`` of an export or a search: None, or checked as
    :func:`hubless._validation.check_target_recall` checks it."""
    return None if target is None else check_target_recall(target)


def recall_at(ids: np.ndarray, exact: np.ndarray) -> float:
    """Mean over queries of |ids & exact| / k (rows of ids; -1 never matches)."""
    k = exact.shape[1]
    hits = (ids[:, :, None] == exact[:, None, :]).any(axis=2).sum(axis=1)
    return float(hits.mean() / k)


def knob_values(knob: str, default: int, limit: int) -> list[int]:
    """Powers of two (from 1 for nprobe, 16 for ef_search) up to ``limit``, and the default."""
    values, v = set(), 1 if knob == "nprobe" else 16
    while v < limit:
        values.add(v)
        v *= 2
    values.update({min(limit, default), limit})
    return sorted(values)


def measure_curve(store, index, info: dict, target: float | None, *, sample: int = SAMPLE, seed: int = 0) -> dict:
    """Recall@10 of ``store``'s ANN search per knob value on a sample of ``index``'s query bank;
    returns the info's ``ann`` entries: ``curve`` [[value, recall], ...], ``default`` (the
    smallest value reaching ``target``, else the store's default), ``target_recall``,
    ``recall`` (at the default), ``reached`` and ``measured_on``."""
    ann = info["ann"]
    knob = ann["knob"]
    bank = index.query_bank
    rng = np.random.default_rng(seed)
    q = bank if bank.shape[0] <= sample else bank[np.sort(rng.choice(bank.shape[0], sample, replace=False))]
    k = min(TOP_K, index.ntotal)
    exact = index.ids[index.correction.search(q, k)[1]]  # the correction ranks positions; stores hold item ids
    default = int(ann["default"])
    stop = max(MEASURE_UNTIL, with_margin(target) if target is not None else 0.0)
    curve = []
    for value in knob_values(knob, default, store.knob_limit(knob, info)):
        ids = store.search(q, k, **{knob: value})[1]
        curve.append([int(value), round(recall_at(ids, exact), 4)])
        if curve[-1][1] >= stop and value >= default:
            break
    chosen = default if target is None else _smallest(curve, target)
    recall = dict((v, r) for v, r in curve).get(chosen)
    return {
        "curve": curve,
        "default": int(chosen),
        "target_recall": target,
        "recall": recall,
        "reached": None if target is None else bool(recall is not None and recall >= with_margin(target)),
        "required_on_bank": None if target is None else with_margin(target),
        "measured_on": f"recall@{k} of {q.shape[0]} queries of the index's query bank against its exact corrected top {k}",
    }


def with_margin(target: float) -> float:
    """The bank recall a knob must reach for ``target``: half the allowed misses kept as margin,
    since the bank's queries are not the test queries (measured on 20k x 256: a knob reaching
    0.95 on the bank gave 0.934-0.948 on held-out queries for pgvector and Qdrant HNSW)."""
    return min(1.0, target + (1.0 - target) / 2)


def _smallest(curve: list, target: float) -> int:
    target = with_margin(target)
    reached = [v for v, r in curve if r >= target]
    return min(reached) if reached else max(v for v, _ in curve)


def knob_for_target(ann: dict, target: float) -> int:
    """The smallest measured knob value whose recall reached ``target``; above the measured
    curve, its largest value (the best this store was seen to do)."""
    curve = ann.get("curve")
    if not curve:
        raise InvalidInput(
            "this store has no recall curve (exported without ann=, or from an index without its query bank): "
            "export it again with ann=... to use target_recall"
        )
    return _smallest(curve, target)
