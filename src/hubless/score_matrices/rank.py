"""Ranking the rows of a stored query x gallery score matrix, block by block.

The score-matrix counterpart of :func:`hubless.evaluation.rank_queries`: each block of rows of S
is read once (a memory map is never loaded whole), its raw-neighbour statistics (DIS gates,
CSLS's r_q) are taken from the rows, and every fitted correction ranks it with its own
:meth:`~hubless.corrections.Correction.rank`, the hook its ``search`` and ``correct`` use. From
each block come the rank of every relevant item (counted, never sorted) and the top ``depth`` ids.
Blocks run on all cores; memory stays at a few blocks whatever the number of queries. With a torch
device (``device=``, ``use_device``, ``HUBLESS_DEVICE``) each block is read on the host and ranked
on the device by every correction, only the ranks and top ids coming back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from hubless.corrections import Correction, QueryBatch, QueryRequest, QueryStatistics
from hubless.engine.device import torch_device
from hubless.engine.parallel import run_blocks
from hubless.engine.score_statistics import read_rows, row_blocks
from hubless.engine.topk import RunningTopK
from hubless.evaluation.core import Ranked, device_rankers
from hubless.metrics.retrieval import relevant_ranks
from hubless.metrics.truth import Truth

__all__ = ["RANK_BLOCK_ELEMENTS", "rank_score_rows", "score_batch", "top_ids", "top_k"]

#: Scores per block of query rows (16 MiB of float32), per worker thread.
RANK_BLOCK_ELEMENTS = 1 << 22


def top_k(block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of each row's ``k`` best, best first, ties to the lower id. The columns go to
    :class:`~hubless.engine.topk.RunningTopK` as a first part whose width is a multiple of 16 (its
    fast group-maximum bound applies) and the rest."""
    best = RunningTopK(block.shape[0], k, with_ids=True)
    split = block.shape[1] - block.shape[1] % 16
    if split >= 64 * k and split < block.shape[1]:
        best.update(block[:, :split])
        best.update(block[:, split:], split)
    else:
        best.update(block)
    values, ids = best.sorted()
    assert ids is not None  # kept with ids
    return values, ids


def top_ids(block: np.ndarray, k: int) -> np.ndarray:
    """The ids of :func:`top_k`."""
    return top_k(block, k)[1]


def score_batch(corrections: Sequence[Correction], block: np.ndarray) -> QueryBatch:
    """One batch of score rows for several corrections: the raw-neighbour statistics all of them
    need (merged requests) from the rows themselves."""
    request = QueryRequest()
    for c in corrections:
        request = request.merge(c.query_request)
    stats = QueryStatistics.from_similarities(request, block) if request.depth else None
    return QueryBatch(np.empty((block.shape[0], 0), np.float32), None, stats)


def rank_score_rows(
    corrections: Sequence[Correction],
    scores,
    truth: Truth,
    *,
    rows: np.ndarray | None = None,
    ties: str = "index",
    depth: int = 0,
    progress: bool | None = None,
    desc: str = "rank",
) -> list[Ranked]:
    """Rank rows of ``scores`` (n, n_gallery) for every correction fitted on this gallery.

    ``rows``: the rows to rank, in ``truth``'s order (default: all); ``ties``: see :func:`hubless.metrics.relevant_ranks`. Returns one
    :class:`~hubless.evaluation.core.Ranked` per correction, in order.
    """
    n_gallery = scores.shape[1]
    rows = np.arange(scores.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    contiguous = rows.size == 0 or (rows[0] == 0 and rows.size == scores.shape[0] and (np.diff(rows) == 1).all())
    depth = min(depth, n_gallery)

    def read(start: int, stop: int) -> np.ndarray:
        return read_rows(scores, start, stop, "scores") if contiguous else read_rows(scores, 0, 0, "scores", rows=rows[start:stop])

    on_device = torch_device()
    if on_device is not None and rows.size:
        return _rank_on_device(corrections, read, rows.size, n_gallery, truth, ties, depth, on_device[0])
    fractional = ties == "average"
    ranks = [np.empty(truth.indices.size, dtype=np.float64 if fractional else np.int64) for _ in corrections]
    tops = [np.empty((rows.size, depth), dtype=np.int64) if depth else None for _ in corrections]
    bounds = row_blocks(rows.size, n_gallery, RANK_BLOCK_ELEMENTS)
    seconds = np.zeros((len(bounds), len(corrections)))
    index = {b: i for i, b in enumerate(bounds)}

    def work(start: int, stop: int) -> None:
        t0 = time.perf_counter()
        block = read(start, stop)
        batch = score_batch(corrections, block)
        shared = time.perf_counter() - t0
        sub = truth.subset(np.arange(start, stop))
        lo, hi = truth.indptr[start], truth.indptr[stop]
        for i, corr in enumerate(corrections):
            t0 = time.perf_counter()
            ranked = corr.rank(batch, block)
            ranks[i][lo:hi] = relevant_ranks(ranked, sub, ties)
            top = tops[i]
            if top is not None:
                top[start:stop] = top_ids(ranked, depth)
            seconds[index[(start, stop)], i] = shared + time.perf_counter() - t0

    run_blocks(work, bounds, progress=progress, desc=desc, unit="queries")
    return [Ranked(r, t, float(s)) for r, t, s in zip(ranks, tops, seconds.sum(axis=0))]


def _rank_on_device(corrections, read, n_rows: int, n_gallery: int, truth: Truth, ties: str, depth: int, device: str) -> list[Ranked]:
    """:func:`rank_score_rows` on a torch device: each block of score rows is read and checked
    on the host, uploaded once and ranked there by every correction
    (:func:`hubless.engine.torch_ranking.rank_score_rows`, the rankings of
    :func:`hubless.evaluation.core.device_rankers`); only the ranks and top ids come back."""
    from hubless.engine import torch_ranking

    batches = [QueryBatch(np.empty((n_rows, 0), np.float32)) for _ in corrections]  # score rows carry no vectors
    results = torch_ranking.rank_score_rows(
        read,
        n_gallery,
        device_rankers(corrections, batches),
        truth.rows,
        truth.indptr,
        truth.indices,
        ties=ties,
        depth=depth,
        device=device,
    )
    return [Ranked(ranks, top, seconds) for ranks, top, seconds in results]
