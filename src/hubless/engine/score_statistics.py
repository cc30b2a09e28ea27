"""Bank statistics from stored score matrices: one streamed pass over each bank's rows.

A model whose score is not one inner product (a mixture of experts, cross-attention: the video
and audio models of QB-Norm, Bogolin et al. 2022) gives score matrices, not embeddings. Every
statistic of :class:`~hubless.engine.statistics.BankStatistics` except the embedding means comes
from two of them:

* SB, query bank x gallery, ``SB[b, r] = s(b, r)``: per gallery item r (a column) its K largest
  scores (NNN, CSLS), ``log sum_b exp(beta s(b, r))`` at each beta (IS, DIS, DualIS, DualDIS) and
  its sorted probes (GC); per bank query b (a row) its k_a best gallery items, whose union is
  the activation set of DIS / DualDIS;
* SG, gallery bank x gallery, ``SG[g, r] = s(g, r)`` with g a reference item of the gallery's
  modality: the same log-sum-exp and activation sets for the gallery bank (DualIS, DualDIS).

Each matrix is read once, in blocks of whole rows, so a memory-mapped ``.npy`` of any size is
never loaded whole: the column statistics go to the engine's own reducers (``TopK``,
``LogSumExp``, ``SortedRows``, the ones the embedding path streams) as transposed views of each
block, the row statistics come from the rows as they are. The gallery's columns are split over
the worker threads, so every column sees the same blocks in the same order whatever the number
of threads, and the result does not depend on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from hubless.engine.device import torch_device
from hubless.engine.parallel import num_threads
from hubless.engine.statistics import BankStatistics, StatisticsRequest
from hubless.engine.stream import LogSumExp, SortedRows, TopK
from hubless.engine.topk import RunningTopK
from hubless.errors import InvalidInput, InvalidType
from hubless.progress import progress_bar

__all__ = ["SCORE_BLOCK_ELEMENTS", "check_score_matrix", "read_rows", "row_blocks", "row_topk", "score_statistics"]

#: Scores per block of rows read at once (32 MiB of float32): bounds the memory of every pass.
SCORE_BLOCK_ELEMENTS = 1 << 23


def check_score_matrix(x, name: str, *, n_cols: int | None = None, cols_of: str = "the gallery"):
    """A (n, m) matrix of real scores, returned as it is (a memory map stays one; values are
    checked block by block when read, see :func:`read_rows`). Refuses other shapes and dtypes."""
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise InvalidType(f"{name} could not be converted to an array: {exc}") from exc
    if x.dtype.kind not in "fiu" or x.dtype == np.bool_:
        raise InvalidType(f"{name} must hold real scores (a float or integer array); got dtype {x.dtype}")
    if x.ndim != 2:
        raise InvalidInput(f"{name} must be a 2-D score matrix (rows x gallery items); got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise InvalidInput(f"{name} is empty (shape {tuple(x.shape)})")
    if n_cols is not None and x.shape[1] != n_cols:
        raise InvalidInput(f"{name} scores {x.shape[1]} items but {cols_of} has {n_cols}: the columns must be the same items, in order")
    return x


def row_blocks(n_rows: int, n_cols: int, elements: int | None = None) -> list[tuple[int, int]]:
    """(start, stop) of the row blocks of an (n_rows, n_cols) matrix, each about ``elements``
    (default :data:`SCORE_BLOCK_ELEMENTS`)."""
    step = max(1, (elements or SCORE_BLOCK_ELEMENTS) // max(1, n_cols))
    return [(s, min(n_rows, s + step)) for s in range(0, n_rows, step)]


def read_rows(matrix, start: int, stop: int, name: str, rows: np.ndarray | None = None, *, offset: int = 0) -> np.ndarray:
    """Rows ``start:stop`` (or the given ``rows``) of a score matrix as float32, refusing NaN and
    infinities by row (numbered from ``offset`` when ``matrix`` is a block of a larger one). A
    float32 memory map is read in place (no copy)."""
    block = matrix[start:stop] if rows is None else matrix[rows]
    with np.errstate(over="ignore"):  # a float64 score beyond float32's range becomes inf: refused below
        block = np.asarray(block, dtype=np.float32)
    # a NaN or infinity makes the sum non-finite; only then (or if finite scores overflow it) look closer
    if not np.isfinite(np.sum(block)) and not np.isfinite(block).all():
        bad = int(np.flatnonzero(~np.isfinite(block).all(axis=1))[0])
        row = offset + (start + bad if rows is None else int(rows[bad]))
        raise InvalidInput(f"{name} holds NaN or infinite scores (row {row}); scores must be finite")
    return block


def row_topk(block: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of the ``k`` largest entries of each row, best first, ties to the lower id."""
    if k == 1:
        ids = np.argmax(block, axis=1)  # the first maximum: the lower id
        return block[np.arange(block.shape[0]), ids][:, None], ids[:, None].astype(np.int64)
    best = RunningTopK(block.shape[0], k, with_ids=True)
    best.update(block)
    values, ids = best.sorted()
    assert ids is not None  # kept with ids
    return values, ids


def _bank_pass(
    matrix,
    name: str,
    *,
    k: int = 0,
    betas: Iterable[float] = (),
    probes: bool = False,
    activation_k: int = 0,
    progress: bool | None = None,
):
    """Column statistics (top-k, log-sum-exp, sorted probes) and row top-``activation_k`` of one
    bank's score matrix, from one pass over its rows."""
    n_rows, n_cols = matrix.shape
    betas = sorted(float(b) for b in betas)
    topk = TopK(n_cols, k) if k else None
    lse = LogSumExp(n_cols, betas) if betas else None
    sorted_rows = SortedRows(n_cols, n_rows) if probes else None
    reducers = [r for r in (topk, lse, sorted_rows) if r is not None]
    act_k = min(activation_k, n_cols)
    act_scores = np.empty((n_rows, act_k), np.float32) if act_k else None
    act_ids = np.empty((n_rows, act_k), np.int64) if act_k else None
    if not reducers and not act_k:
        return topk, lse, sorted_rows, act_scores, act_ids
    on_device = torch_device()
    if on_device is not None:  # the reductions on the device; the rows are read and checked here
        from hubless.engine import torch_passes
        from hubless.engine.torch_arrays import block_budget

        # blocks of at most one device block budget (the device holds a few of them at once)
        elements = min(SCORE_BLOCK_ELEMENTS, block_budget(on_device[0].split(",")[0]))
        blocks = progress_bar(row_blocks(n_rows, n_cols, elements), progress, desc=name, unit="block")
        checked = ((start, read_rows(matrix, start, stop, name)) for start, stop in blocks)
        values, sums, act_scores, act_ids = torch_passes.score_bank_pass(
            checked,
            n_rows,
            n_cols,
            k=k,
            betas=betas,
            probes_out=None if sorted_rows is None else sorted_rows.values,
            activation_k=activation_k,
            device=on_device[0],
        )
        if topk is not None:
            topk.values[:] = values
        if lse is not None:
            lse.values[:] = sums
        return topk, lse, sorted_rows, act_scores, act_ids
    threads = max(1, min(num_threads(), n_cols))
    width = -(-n_cols // threads)
    col_bounds = [(c, min(n_cols, c + width)) for c in range(0, n_cols, width)]
    states = [[r.start(c0, c1) for r in reducers] for c0, c1 in col_bounds]

    def work(part: int, block: np.ndarray, start: int) -> None:
        # this thread's share of the rows: finite (NaN / inf refused), and their top-k_a items
        n = block.shape[0]
        r0, r1 = part * n // len(col_bounds), (part + 1) * n // len(col_bounds)
        if r1 > r0:
            rows = read_rows(block, r0, r1, name, offset=start)
            if act_scores is not None and act_ids is not None:
                act_scores[start + r0 : start + r1], act_ids[start + r0 : start + r1] = row_topk(rows, act_k)
        # this thread's share of the columns: the column reducers
        c0, c1 = col_bounds[part]
        view = block[:, c0:c1].T  # gallery items x bank rows: what the reducers expect, no copy
        with np.errstate(invalid="ignore"):  # a non-finite row (refused by the check above) stays silent
            for state in states[part]:
                state.update(view, start)

    blocks = progress_bar(row_blocks(n_rows, n_cols), progress, desc=name, unit="block")
    with ThreadPoolExecutor(len(col_bounds)) as pool:
        for start, stop in blocks:
            with np.errstate(over="ignore"):  # a float64 score beyond float32's range becomes inf: refused in the check
                block = np.asarray(matrix[start:stop], dtype=np.float32)  # a float32 memory map: no copy
            for future in [pool.submit(work, part, block, start) for part in range(len(col_bounds))]:
                future.result()
    for part in states:
        for state in part:
            state.finish()
    return topk, lse, sorted_rows, act_scores, act_ids


def score_statistics(
    query_bank_scores,
    gallery_bank_scores,
    request: StatisticsRequest,
    *,
    n_gallery: int,
    progress: bool | None = None,
) -> BankStatistics:
    """The statistics in ``request`` from score matrices (see the module docstring).

    ``query_bank_scores`` (n_bank, n_gallery) and ``gallery_bank_scores`` (n_gallery_bank,
    n_gallery), arrays or memory maps, either None when not needed. The embedding means of
    :class:`BankStatistics` are empty: no correction fitted on scores may read them (DN cannot
    be fitted on scores).
    """
    sb = None if query_bank_scores is None else check_score_matrix(query_bank_scores, "query_bank_scores", n_cols=n_gallery)
    sg = None if gallery_bank_scores is None else check_score_matrix(gallery_bank_scores, "gallery_bank_scores", n_cols=n_gallery)
    needs_query = request.query_topk or request.query_betas or request.query_activation_k or request.query_probes
    if needs_query and sb is None:
        raise InvalidInput("these statistics need the query bank's scores; pass query_bank_scores=")
    if request.needs_gallery_bank and sg is None:
        raise InvalidInput("these statistics need the gallery bank's scores; pass gallery_bank_scores=")
    stats = BankStatistics(
        n_gallery=n_gallery,
        n_query_bank=0 if sb is None else sb.shape[0],
        n_gallery_bank=None if sg is None else sg.shape[0],
        query_bank_mean=np.zeros(0),
        gallery_mean=np.zeros(0),
    )
    if sb is not None and needs_query:
        topk, lse, probes, act_scores, act_ids = _bank_pass(
            sb,
            "query_bank_scores",
            k=request.query_topk,
            betas=request.query_betas,
            probes=request.query_probes,
            activation_k=request.query_activation_k,
            progress=progress,
        )
        stats.query_topk = None if topk is None else topk.values
        stats.query_lse = {} if lse is None else {b: lse.values[:, t] for t, b in enumerate(lse.betas)}
        stats.query_probes = None if probes is None else probes.values
        stats.query_activation_scores, stats.query_activation = act_scores, act_ids
    if sg is not None and request.needs_gallery_bank:
        _, lse, _, act_scores, act_ids = _bank_pass(
            sg, "gallery_bank_scores", betas=request.gallery_betas, activation_k=request.gallery_activation_k, progress=progress
        )
        stats.gallery_lse = {} if lse is None else {b: lse.values[:, t] for t, b in enumerate(lse.betas)}
        stats.gallery_activation_scores, stats.gallery_activation = act_scores, act_ids
    return stats
