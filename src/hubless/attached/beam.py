"""The default beam of an ANN store, chosen at attach from the store's measured recall.

An attached answer is *certified* relative to the store's plain ranking: exact over the store's
plain top-k'. Through an ANN index (HNSW, IVF) that top-k' misses some true neighbours, and a
certified answer can then differ from exact corrected search. How often depends on the store's
plain recall@k' at the beam it is searched with (``ef_search``, ``nprobe``), so attach measures
it, on the collection as it reads it anyway:

1. :class:`RecallProbe`: :data:`PROBE_QUERIES` queries (a sample of the query bank: queries of
   the kind the collection is searched with) get their exact plain top-k' (k' = :data:`PROBE_K`, the first k' of a top-10 search)
   from the batches the attach streams, scored as the store ranks (the raw inner product, or the
   cosine on a cosine store), ties to the lower id;
2. :func:`calibrate`: the store answers the same queries at beams of its ladder
   (:meth:`~hubless.attached.sources.base.Source.beam_ladder`, narrowest first: ``ef_search`` =
   1, 2, 4, ... 32 x k'; ``nprobe`` = 1, 2, 4, ...), bisecting it (the store's recall grows with
   its beam, so about log2 of the ladder's points are measured, the widest ones dominating the
   cost), and the narrowest beam whose mean recall@k' reaches :data:`BEAM_RECALL`
   (``attach(..., beam_recall=)``) is the sidecar's default (``beam`` in ``attach.json``, with
   every point measured: what a wider or narrower beam would buy). An ``ef_search`` is recorded as a
   multiple of k' and scales with it when a query is widened; an ``nprobe`` is a number.

The attached search uses the recorded beam unless the caller passes the knob. It costs what the
store's own query costs at that beam (``benchmarks/attach.py`` reports it); answers through an
ANN store are never claimed ``exact`` (see :mod:`hubless.attached.certified`), however high the
measured recall.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BEAM_RECALL", "PROBE_K", "PROBE_QUERIES", "RecallProbe", "beam_knobs", "calibrate", "probe_queries"]

#: The store recall@k' (on the probe's queries) the default beam is chosen to reach.
BEAM_RECALL = 0.99
#: k' the store's recall is measured at: the first k' of a top-10 attached search.
PROBE_K = 80
#: Queries the store's recall is measured on.
PROBE_QUERIES = 32


class RecallProbe:
    """The exact plain top-k' of a few queries, accumulated over the batches an attach reads."""

    def __init__(self, queries: np.ndarray, k: int) -> None:
        self.queries = np.ascontiguousarray(queries, np.float32)
        self.k = int(k)
        n = self.queries.shape[0]
        self.values = np.zeros((n, 0), np.float32)
        self.ids = np.zeros((n, 0), np.int64)

    def add(self, ids: np.ndarray, vectors: np.ndarray) -> None:
        """One batch: ``ids`` and the vectors as the store ranks them."""
        sims = self.queries @ np.asarray(vectors, np.float32).T
        keys = np.broadcast_to(np.asarray(ids, np.int64), sims.shape)
        if sims.shape[1] > self.k:  # the batch's best k first (a partition), then one sort with what was kept
            part = np.argpartition(-sims, self.k - 1, axis=1)[:, : self.k]
            sims, keys = np.take_along_axis(sims, part, axis=1), np.take_along_axis(keys, part, axis=1)
        values = np.concatenate([self.values, sims], axis=1)
        keys = np.concatenate([self.ids, keys], axis=1)
        order = np.lexsort((keys, -values.astype(np.float64)), axis=1)[:, : self.k]
        self.values, self.ids = np.take_along_axis(values, order, axis=1), np.take_along_axis(keys, order, axis=1)


def probe_queries(query_bank: np.ndarray, seed: int = 0) -> np.ndarray:
    """The probe's queries: :data:`PROBE_QUERIES` rows of the query bank, drawn with ``seed``."""
    rng = np.random.default_rng(seed)
    take = np.sort(rng.choice(query_bank.shape[0], min(PROBE_QUERIES, query_bank.shape[0]), replace=False))
    return np.ascontiguousarray(query_bank[take], np.float32)


def calibrate(source, probe: RecallProbe, target: float = BEAM_RECALL) -> dict | None:
    """Measure the store's plain recall@k' along its beam ladder and choose the narrowest beam
    that reaches ``target`` (see the module docstring); None when the store searches exactly or
    has no beam knob."""
    knob = source.beam_knob
    n_found = probe.ids.shape[1]
    if knob is None or source.searches_exactly({}) or n_found == 0:
        return None
    k = probe.k
    ladder = [int(v) for v in source.beam_ladder(k)]
    if not ladder:
        return None
    measured: dict[int, float] = {}

    def reaches(value: int) -> bool:
        got = source.search(probe.queries, n_found, **{knob: value})
        hit = (got.ids[:, :, None] == probe.ids[:, None, :]) & got.found[:, :, None]
        measured[value] = round(float(hit.any(axis=1).mean()), 5)
        return measured[value] >= target

    # a bisection of the ladder (recall grows with the beam): the narrowest beam in ladder[lo:hi]
    # that reaches the target, or none (lo == len(ladder)); about log2 of the ladder's points measured
    lo, hi = 0, len(ladder)
    while lo < hi:
        mid = (lo + hi) // 2
        if reaches(ladder[mid]):
            hi = mid
        else:
            lo = mid + 1
    met = lo < len(ladder)
    value = ladder[lo] if met else max(measured)
    scaled = knob == "ef_search"
    return {
        "knob": knob,
        "scaled": scaled,
        "value": value / k if scaled else value,  # ef_search: a multiple of k'
        "k": k,
        "queries": int(probe.queries.shape[0]),
        "target": target,
        "met": met,
        "recall": [[v, measured[v]] for v in sorted(measured)],  # [beam, recall@k'] at each beam measured, narrowest first
        "value_recall": measured[value],  # the recall@k' at the chosen beam
    }


def beam_knobs(beam: dict | None, knobs: dict, k: int) -> dict:
    """``knobs`` with the recorded default ``beam`` for k' = ``k`` added, unless the caller gave the knob."""
    if not beam or knobs.get(beam["knob"]) is not None:
        return knobs
    value = int(np.ceil(beam["value"] * k)) if beam["scaled"] else int(beam["value"])
    return {**knobs, beam["knob"]: max(value, 1)}
