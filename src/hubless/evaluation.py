"""Evaluate corrections on a retrieval benchmark: accuracy, confidence, hubness, time.

    result = hubless.evaluate(gallery, queries, "t2i:5", query_bank,
                              methods=["baseline", "nnn:alpha=0.75,k=16", "is:beta=20"])
    result.to_dict()      # the results.json schema of ``hubless eval``

Each method is fitted on the banks only (never on ``queries``), then the queries are scored in
blocks of rows with the same ranking form its ``search`` uses (``s - W . bias`` for additive
corrections, GC's rank-corrected score), so memory stays at one block whatever the sizes. From
each block come the ranks of every relevant item (R@K, MdR, MnR, MRR, mAP@R; see
:mod:`hubless.metrics.retrieval`) and the top 10 (hubness). Bootstrap intervals resample queries
with one seed for every method, so the intervals of the differences to the baseline are paired.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import as_embeddings, check_positive_int
from hubless.corrections import AdditiveCorrection, Correction, make_correction
from hubless.engine.parallel import progress_bar
from hubless.engine.topk import RunningTopK
from hubless.metrics.bootstrap import bootstrap_ci
from hubless.metrics.hubness import hubness_statistics
from hubless.metrics.retrieval import PerQuery, per_query_metrics, relevant_ranks, summarize
from hubless.metrics.truth import Truth, load_truth

__all__ = ["Evaluation", "MethodResult", "evaluate", "rank_queries", "ranking_blocks", "ranking_scores"]

#: Score elements per block of query rows (16 MiB of float32).
BLOCK_ELEMENTS = 1 << 22
#: Top results kept per query for the hubness statistics (N_1 and N_10).
HUBNESS_DEPTH = 10


@dataclass
class MethodResult:
    """One method's numbers. ``per_query`` holds the per-query values behind each metric and
    ``n1`` the N_1 occurrence of every gallery item (for plots); neither goes to JSON."""

    method: str
    params: dict[str, Any]
    spec: str
    metrics: dict[str, float]
    ci95: dict[str, tuple[float, float]]
    hubness: dict[str, float]
    seconds: dict[str, float]
    delta: dict[str, float] = field(default_factory=dict)
    delta_ci95: dict[str, tuple[float, float]] = field(default_factory=dict)
    per_query: dict[str, np.ndarray] = field(default_factory=dict, repr=False)
    n1: np.ndarray | None = field(default=None, repr=False)
    #: Further results added by callers (e.g. "eccv", "rerank"); written to JSON as they are.
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "spec": self.spec,
            "params": self.params,
            "metrics": self.metrics,
            "ci95": {k: list(v) for k, v in self.ci95.items()},
            "delta_vs_baseline": self.delta,
            "delta_ci95": {k: list(v) for k, v in self.delta_ci95.items()},
            "hubness": self.hubness,
            "seconds": self.seconds,
            **self.extra,
        }


@dataclass
class Evaluation:
    """Results of :func:`evaluate`: ``results`` (baseline first) and a description of the inputs."""

    inputs: dict[str, Any]
    results: list[MethodResult]
    ks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"inputs": self.inputs, "results": [r.to_dict() for r in self.results]}

    def __getitem__(self, spec: str) -> MethodResult:
        for r in self.results:
            if spec in (r.spec, r.method):
                return r
        raise KeyError(spec)


def ranking_blocks(correction: Correction, queries: np.ndarray, block_rows: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, scores)`` for consecutive blocks of query rows, where ``scores`` are the
    ranking scores over the whole gallery that ``correction.search`` orders by."""
    q = correction._queries(queries)
    rows = block_rows or query_block_rows(correction.n_gallery_)
    for start in range(0, q.shape[0], rows):
        block = q[start : start + rows]
        yield start, ranking_scores(correction, block, block @ correction.gallery_.T)


def query_block_rows(n_gallery: int) -> int:
    """Query rows per block so that one block of scores holds about BLOCK_ELEMENTS values."""
    return max(1, min(4096, BLOCK_ELEMENTS // n_gallery))


def ranking_scores(correction: Correction, queries: np.ndarray, sims: np.ndarray, **weight) -> np.ndarray:
    """The ranking scores ``correction.search`` orders by, from the raw similarities ``sims``
    (n_queries, n_gallery) of validated ``queries``: ``s - W . bias`` for additive corrections
    (``weight`` overrides w, e.g. ``alpha=0.5``), GC's rank-corrected score. ``sims`` is reused
    as the output buffer only for GC; pass a copy if you need it afterwards."""
    if isinstance(correction, AdditiveCorrection):
        weights = correction._query_weights(queries, correction._weight_override(weight, queries.shape[0]), None)
        if not weights.any():
            return sims
        return sims + np.ascontiguousarray(-weights, dtype=np.float32) @ correction.bias_columns_.T
    if correction.name == "gc":
        sims = np.array(sims, dtype=np.float32, copy=True)
        correction._subtract_ranks(sims, 0, sims.shape[0], 0, correction.n_gallery_)
        return sims
    raise TypeError(f"no ranking form for {type(correction).__name__}")  # pragma: no cover


def rank_queries(correction: Correction, queries: np.ndarray, truth: Truth, *, depth: int = HUBNESS_DEPTH, progress=None):
    """Ranks of every relevant item (aligned with ``truth.indices``) and the top ``depth`` ids
    of every query, in one streamed pass over query blocks."""
    depth = min(depth, correction.n_gallery_)
    ranks = np.empty(truth.indices.size, dtype=np.int64)
    top = np.empty((truth.n_queries, depth), dtype=np.int64)
    n_blocks = -(-truth.n_queries // query_block_rows(correction.n_gallery_))
    blocks = progress_bar(ranking_blocks(correction, queries), progress, desc=f"rank {correction.spec}", unit="block", total=n_blocks)
    for start, scores in blocks:
        stop = start + scores.shape[0]
        sub = truth.subset(np.arange(start, stop))
        ranks[truth.indptr[start] : truth.indptr[stop]] = relevant_ranks(scores, sub)
        best = RunningTopK(scores.shape[0], depth, with_ids=True)
        best.update(scores)
        top[start:stop] = best.sorted()[1]
    return ranks, top


def _as_truth(truth, n_queries: int, n_gallery: int) -> Truth:
    if isinstance(truth, np.ndarray) and truth.ndim == 1:
        truth = Truth.from_labels(truth, n_gallery)
    elif isinstance(truth, (list, tuple)):
        truth = Truth.from_lists(truth, n_gallery) if truth and isinstance(truth[0], (list, tuple, np.ndarray)) else Truth.from_labels(np.asarray(truth), n_gallery)
    return load_truth(truth, n_queries, n_gallery)


def _check_ks(ks: Sequence[int], n_gallery: int) -> tuple[int, ...]:
    ks = tuple(sorted({check_positive_int(k, "ks") for k in ks}))
    if not ks:
        raise ValueError("ks must list at least one K, e.g. 1,5,10")
    if ks[-1] > n_gallery:
        raise ValueError(f"K={ks[-1]} is larger than the gallery ({n_gallery} items)")
    return ks


def evaluate(
    gallery,
    queries,
    truth,
    query_bank=None,
    methods: Sequence[str | Correction] = ("baseline", "nnn"),
    *,
    gallery_bank=None,
    ks: Sequence[int] = (1, 5, 10),
    bootstrap: int = 1000,
    seed: int = 0,
    normalize: bool = True,
    progress: bool | None = None,
    inputs: dict[str, Any] | None = None,
) -> Evaluation:
    """Fit each method on the banks, rank ``queries`` over ``gallery`` and measure.

    ``truth``: a :class:`~hubless.metrics.truth.Truth`, one gallery id per query (int array),
    lists of ids, a file (.npy/.json) or a layout such as ``"t2i:5"`` (see
    :func:`~hubless.metrics.truth.load_truth`). ``methods``: specs like ``"nnn:alpha=0.5,k=16"``
    or corrections (refitted here); the baseline is always evaluated (first) so every method
    gets its difference to it, with a paired bootstrap interval. ``bootstrap=0`` skips intervals.
    ``normalize`` applies to every method built from a spec.
    """
    gallery = as_embeddings(gallery, "gallery", normalize=normalize)
    queries = as_embeddings(queries, "queries", normalize=normalize, dim=gallery.shape[1], dim_of="the gallery")
    truth = _as_truth(truth, queries.shape[0], gallery.shape[0])
    ks = _check_ks(ks, gallery.shape[0])
    if bootstrap < 0:
        raise ValueError(f"bootstrap must be >= 0 resamples; got {bootstrap}")
    corrections = [_build(m, normalize) for m in methods]
    if not any(c.name == "baseline" for c in corrections):
        corrections.insert(0, _build("baseline", normalize))
    corrections.sort(key=lambda c: c.name != "baseline")
    results = [_evaluate_one(c, gallery, queries, truth, query_bank, gallery_bank, ks, bootstrap, seed, progress) for c in corrections]
    base = results[0]
    for r in results[1:]:
        diffs = {m: r.per_query[m] - base.per_query[m] for m in r.per_query if m != "MdR"}
        r.delta = {m: float(d.mean()) for m, d in diffs.items()}
        if bootstrap:
            r.delta_ci95 = bootstrap_ci(diffs, bootstrap, seed=seed)
    described = {
        "n_gallery": int(gallery.shape[0]),
        "n_queries": int(queries.shape[0]),
        "dim": int(gallery.shape[1]),
        "n_query_bank": None if query_bank is None else int(np.shape(query_bank)[0]),
        "n_gallery_bank": None if gallery_bank is None else int(np.shape(gallery_bank)[0]),
        "relevant_per_query": float(truth.counts.mean()),
        "ks": list(ks),
        "bootstrap": int(bootstrap),
        "seed": int(seed),
        "normalize": bool(normalize),
    }
    described.update(inputs or {})
    return Evaluation(described, results, ks)


def _build(method, normalize: bool) -> Correction:
    corr = make_correction(method)
    return corr.set_params(normalize=normalize) if isinstance(method, str) else corr


def _evaluate_one(corr, gallery, queries, truth, query_bank, gallery_bank, ks, bootstrap, seed, progress) -> MethodResult:
    t0 = time.perf_counter()
    corr.fit(gallery, query_bank, gallery_bank, progress=progress)
    t1 = time.perf_counter()
    ranks, top = rank_queries(corr, queries, truth, progress=progress)
    t2 = time.perf_counter()
    values = per_query_metrics(PerQuery(ranks, truth), ks)
    hub = hubness_statistics(top, gallery.shape[0], ks=(1, 10), expected=truth.expected_occurrence())
    params = {k: v for k, v in corr.get_params().items() if k not in ("normalize", *getattr(corr, "resource_params", ()))}
    return MethodResult(
        method=corr.name,
        params=params,
        spec=corr.spec,
        metrics=summarize(values),
        ci95=bootstrap_ci(values, bootstrap, seed=seed) if bootstrap else {},
        hubness=hub,
        seconds={"fit": t1 - t0, "search": t2 - t1},
        per_query=values,
        n1=np.bincount(top[:, 0], minlength=gallery.shape[0]),
    )


def file_digest(path: str | Path) -> str:
    """sha256 of a file (streamed), to record which inputs produced a result."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
