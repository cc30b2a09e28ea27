"""The core every measurement shares: which methods to run, and one streamed ranking pass.

:func:`prepare_methods` builds the corrections to compare (the baseline always first, so every
method gets its difference to it). :func:`rank_queries` ranks the queries of a benchmark for
several fitted corrections at once: each block of query rows gets its raw similarities to the
gallery from one GEMM, shared by every correction, which ranks them with its own
:meth:`~hubless.corrections.Correction.rank` (the form its ``search`` orders by). Exact duplicate
gallery rows (found once, at fit: :mod:`hubless.engine.duplicates`) get their first copy's
similarities in every block, so copies tie exactly on any BLAS kernel and device. From each
block come the rank of every relevant item (counted, never sorted; see
:func:`hubless.metrics.relevant_ranks`) and, when asked, the top ``depth`` ids (hubness, bias@n).
Blocks run on every core (:func:`hubless.engine.parallel.run_blocks`, single-threaded BLAS in
each), and every correction ranks a block into one reused buffer. Memory stays at one block
(and its buffer) per thread whatever the number of queries. :func:`hubless.evaluate`,
:func:`hubless.tune` and :func:`hubless.fairness.audit` are built on these two functions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hubless.corrections import AdditiveCorrection, Correction, QueryBatch, make_correction
from hubless.corrections.inverted_softmax import ActivationGated
from hubless.engine.device import torch_device
from hubless.engine.parallel import run_blocks
from hubless.engine.topk import RunningTopK
from hubless.errors import InvalidInput
from hubless.metrics.retrieval import relevant_ranks
from hubless.metrics.truth import Truth

__all__ = ["BLOCK_ELEMENTS", "Ranked", "device_rankers", "prepare_methods", "query_block_rows", "rank_queries"]

#: Score elements per block of query rows (16 MiB of float32).
BLOCK_ELEMENTS = 1 << 22


def prepare_methods(methods: Sequence[str | Correction], normalize: bool = True) -> list[Correction]:
    """Corrections for ``methods`` (specs such as ``"nnn:alpha=0.5,k=16"``, or correction
    objects, used as given), with the baseline added when missing and put first. ``normalize``
    applies to every correction built from a spec."""
    corrections = []
    for method in methods:
        corr = make_correction(method)
        corrections.append(corr.set_params(normalize=normalize) if isinstance(method, str) else corr)
    if not any(c.name == "baseline" for c in corrections):
        corrections.insert(0, make_correction("baseline").set_params(normalize=normalize))
    corrections.sort(key=lambda c: c.name != "baseline")
    return corrections


def query_block_rows(n_gallery: int) -> int:
    """Query rows per block so that one block of scores holds about BLOCK_ELEMENTS values."""
    return max(1, min(4096, BLOCK_ELEMENTS // n_gallery))


@dataclass
class Ranked:
    """One correction's ranking of a benchmark's queries.

    ``ranks``: the 1-based rank of every relevant item, aligned with ``truth.indices``;
    ``top``: the ``depth`` best gallery ids of each query (None for depth 0); ``seconds``: the
    time this ranking would take alone (its own ranking plus the shared similarity blocks).
    """

    ranks: np.ndarray
    top: np.ndarray | None
    seconds: float


def rank_queries(
    corrections: Sequence[Correction],
    queries: np.ndarray,
    truth: Truth,
    *,
    depth: int = 0,
    progress: bool | None = None,
    desc: str = "rank",
    ties: str = "index",
) -> list[Ranked]:
    """Rank ``queries`` over the gallery for every fitted correction in one streamed pass.

    The corrections must be fitted on the same gallery array (as :func:`hubless.fit_many` and
    :func:`prepare_methods` + ``fit`` on one validated gallery give); ``truth`` describes the
    queries; ``ties``: the tie convention of the ranks (see :func:`hubless.metrics.relevant_ranks`).
    Returns one :class:`Ranked` per correction, in order.
    """
    if not corrections:
        return []
    gallery = corrections[0].gallery_
    if any(c.gallery_ is not gallery for c in corrections):
        raise InvalidInput("rank_queries compares corrections fitted on one gallery array; fit them on the same validated gallery")
    if len({bool(c.normalize) for c in corrections}) > 1:
        raise InvalidInput("rank_queries compares corrections with one normalize setting")
    first = corrections[0].queries(queries)  # validated once: one gallery, one normalize setting
    batches = [first] + [QueryBatch(first.vectors) for _ in corrections[1:]]  # each correction fills its own statistics
    n_queries, n_gallery = len(batches[0]), gallery.shape[0]
    depth = min(depth, n_gallery)
    duplicates = corrections[0].gallery_duplicates_  # found at fit: each copy gets its first copy's similarities
    on_device = torch_device()
    if on_device is not None:
        return _rank_on_device(corrections, batches, gallery, truth, depth, ties, on_device, duplicates)
    ranks = [np.empty(truth.indices.size, dtype=np.float64 if ties == "average" else np.int64) for _ in corrections]
    tops = [np.empty((n_queries, depth), dtype=np.int64) if depth else None for _ in corrections]
    rows = query_block_rows(n_gallery)
    seconds = np.zeros((-(-n_queries // rows), len(corrections)))  # per block (each thread writes its own), summed at the end

    def work(start: int, stop: int) -> None:
        t0 = time.perf_counter()
        sims = batches[0].vectors[start:stop] @ gallery.T
        duplicates.fill_columns(sims)  # copies tie exactly, whatever the BLAS kernel rounded
        shared = time.perf_counter() - t0
        sub = truth.subset(np.arange(start, stop))
        lo, hi = truth.indptr[start], truth.indptr[stop]
        buffer = np.empty_like(sims)  # every correction ranks into it: no fresh block per method
        for i, corr in enumerate(corrections):
            t0 = time.perf_counter()
            scores = corr.rank(batches[i].rows(start, stop), sims, out=buffer)
            ranks[i][lo:hi] = relevant_ranks(scores, sub, ties)
            top = tops[i]
            if top is not None:
                best = RunningTopK(scores.shape[0], depth, with_ids=True)
                best.update(scores)
                ids = best.sorted()[1]
                assert ids is not None  # kept with ids
                top[start:stop] = ids
            seconds[start // rows, i] = shared + time.perf_counter() - t0

    run_blocks(work, [(s, min(s + rows, n_queries)) for s in range(0, n_queries, rows)], progress=progress, desc=desc, unit="queries")
    seconds = seconds.sum(axis=0).tolist()
    return [Ranked(r, t, s) for r, t, s in zip(ranks, tops, seconds)]


def _rank_on_device(
    corrections, batches, gallery, truth: Truth, depth: int, ties: str, on_device: tuple[str, str], duplicates
) -> list[Ranked]:
    """:func:`rank_queries` on a torch device (:func:`hubless.engine.torch_ranking.rank_queries`)
    with the rankings of :func:`device_rankers`."""
    from hubless.engine import torch_ranking

    results = torch_ranking.rank_queries(
        batches[0].vectors,
        gallery,
        device_rankers(corrections, batches),
        truth.rows,
        truth.indptr,
        truth.indices,
        ties=ties,
        depth=depth,
        device=on_device[0],
        dtype=on_device[1],
        duplicates=duplicates,
    )
    return [Ranked(ranks, top, seconds) for ranks, top, seconds in results]


def device_rankers(corrections: Sequence[Correction], batches: Sequence[QueryBatch]) -> list:
    """The rankings of the device's ranking pass (:mod:`hubless.engine.torch_ranking`), one per
    correction with its batch: an additive correction ranks on the device (``(W,
    bias_columns)``), an activation-gated one (DIS, DualDIS in bias form) with its gates from
    each block's raw top-1 (as the numpy pass takes them from its blocks: no search of the
    queries, a :class:`~hubless.engine.torch_ranking.GatedRanker`); the others rank each block
    on the host with their own :meth:`~hubless.corrections.Correction.rank`."""
    from hubless.engine import torch_ranking

    def host_ranker(corr: Correction, batch: QueryBatch):
        def rank(start: int, stop: int, sims: np.ndarray) -> np.ndarray:
            return corr.rank(batch.rows(start, stop), sims, out=np.empty_like(sims))

        return rank

    rankers: list = []
    for corr, batch in zip(corrections, batches):
        exactly_additive = isinstance(corr, AdditiveCorrection) and corr.exactly_additive
        if isinstance(corr, ActivationGated) and exactly_additive and batch.statistics is None:
            assert isinstance(corr, AdditiveCorrection)
            rankers.append(torch_ranking.GatedRanker(corr.gate_masks(), corr.bias_columns_))
            continue
        additive = corr.additive_ranking(batch) if corr.ranking_request.depth == 0 or batch.statistics is not None else None
        rankers.append(host_ranker(corr, batch) if additive is None else additive)
    return rankers
