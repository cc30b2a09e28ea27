"""The streamed similarity engine: rows x columns in BLAS-sized blocks, reduced row by row.

Every statistic hubless needs has the same shape: for each row vector (a gallery item, a query),
stream the similarities to every column vector (a bank, the gallery) and reduce them to a few
numbers (the top-k, a log-sum-exp, sorted probes). A reducer may also reduce each column over all
rows (:class:`ColumnNearest`: the nearest row of every column) from the same blocks, so one pass
gives both sides' statistics. :func:`stream_reduce` computes one block of
similarities at a time with a single GEMM, hands it to each reducer, and never holds more than
``row_block x col_block`` similarities per thread, however large either side is.

A ``transform`` may rewrite each block in place before the reducers see it: exact search of a
correction passes its ranking hook (``Correction.rank``), so a searched block is ranked exactly
as a scored one.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Sequence

import numpy as np

from hubless.engine.device import DeviceName, block_product
from hubless.engine.formulas import (  # noqa: F401 - the constants are re-exported (tests move EXP_MIN_BETA)
    CLAMP_FROM_BETA,
    EXP_MIN_BETA,
    LOWEST_EXPONENT,
    LOWEST_EXPONENT_2,
    NUMPY,
    lse_add,
    lse_finish,
    lse_recentre,
    lse_terms,
)
from hubless.engine.parallel import num_threads, run_blocks
from hubless.engine.topk import NO_ID, RunningTopK
from hubless.errors import InvalidInput

__all__ = [
    "ROW_BLOCK",
    "COL_BLOCK",
    "Reducer",
    "ReducerState",
    "TopK",
    "LogSumExp",
    "SortedRows",
    "ColumnNearest",
    "Dense",
    "stream_reduce",
]

#: Rows per block (per thread). 512 x 16384 float32 similarities = 32 MiB per thread.
ROW_BLOCK = 512
#: Columns per block.
COL_BLOCK = 16384

Transform = Callable[[np.ndarray, int, int, int, int], None]


class Reducer:
    """Reduces each row's similarities to all columns; one instance per :func:`stream_reduce` call.

    ``start(start, stop)`` returns the state of one row block; the engine feeds it every column
    block with ``state.update(sims, col_offset)`` and then calls ``state.finish()``, which writes
    rows ``start:stop`` of the reducer's outputs. Different row blocks run in different threads
    and only write their own rows.
    """

    def start(self, start: int, stop: int) -> ReducerState:  # pragma: no cover - interface
        raise NotImplementedError


class ReducerState:
    """The running state of one reducer over one row block."""

    def update(self, block: np.ndarray, col_offset: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def finish(self) -> None:  # pragma: no cover
        raise NotImplementedError


class TopK(Reducer):
    """Top-``k`` similarities of each row, sorted descending (``values``), optionally with ``ids``.

    Ties are broken by the lower column id. ``initial=(values, ids)`` merges the new columns
    into an earlier top-k of the same rows (ids of the new columns start at ``id_offset``).
    """

    def __init__(
        self,
        n_rows: int,
        k: int,
        *,
        with_ids: bool = False,
        initial: tuple[np.ndarray, np.ndarray | None] | None = None,
        id_offset: int = 0,
    ) -> None:
        self.k = k
        self.with_ids = with_ids
        self.initial = initial
        self.id_offset = id_offset
        self.values = np.empty((n_rows, k), dtype=np.float32)
        self.ids = np.empty((n_rows, k), dtype=np.int64) if with_ids else None

    @property
    def ids_(self) -> np.ndarray:
        """``ids`` of a top-k kept with ids."""
        if self.ids is None:
            raise InvalidInput("this top-k was computed without ids (with_ids=False)")
        return self.ids

    def start(self, start: int, stop: int) -> ReducerState:
        return _TopKState(self, start, stop)


class _TopKState(ReducerState):
    def __init__(self, parent: TopK, start: int, stop: int) -> None:
        self.parent, self.start, self.stop = parent, start, stop
        initial = None
        if parent.initial is not None:
            values, ids = parent.initial
            initial = (values[start:stop], None if ids is None else ids[start:stop])
        self.running = RunningTopK(stop - start, parent.k, with_ids=parent.with_ids, initial=initial)

    def update(self, block: np.ndarray, col_offset: int) -> None:
        self.running.update(block, col_offset + self.parent.id_offset)

    def finish(self) -> None:
        values, ids = self.running.sorted()
        self.parent.values[self.start : self.stop] = values
        if ids is not None and self.parent.ids is not None:
            self.parent.ids[self.start : self.stop] = ids


#: Rows of a block reduced at a time by :class:`LogSumExp`, so that its scratch rows (2 x 8 x
#: 16384 float32 = 1 MiB) stay in the core's cache across its few elementwise passes.
LSE_CHUNK_ROWS = 8


@functools.cache
def exp2_is_vectorised() -> bool:
    """Whether this numpy computes float32 ``exp2`` with SIMD code on this CPU (it does with
    AVX-512 (SVML); on an AVX2-only CPU its exp2 is scalar: 5.1 ns an element on an AMD EPYC
    against 2.3 ns for its SIMD ``exp``). The exp form uses exp2 where it is vectorised (40%
    faster than exp measured on an AVX-512 Xeon), exp elsewhere; equally exact. Decided from
    numpy's dispatch table, never by timing, so every process on a machine makes the same choice
    (the distributed fit's tiles then reproduce the single pass bitwise)."""
    try:
        from numpy.lib.introspect import opt_func_info  # numpy >= 2.0

        targets = opt_func_info(func_name="^exp2$", signature="float32").get("exp2", {})
    except Exception:  # noqa: BLE001 - an older numpy: its exp is the vectorised one
        return False
    return bool(targets) and not any(str(t.get("current", "baseline")).startswith("baseline") for t in targets.values())


class LogSumExp(Reducer):
    """``log sum_j exp(beta * s_ij)`` of each row for several ``betas`` (>= 0), in float64.

    Streamed around the row maximum m of s found in the first column block (every exponent <= 0
    there; later blocks reuse it, their terms may exceed 1, and a row whose term would overflow
    is summed again around its new maximum), with s_ij - m formed before scaling by beta (a large beta does not magnify the rounding of
    beta * s). Two exact forms, chosen per beta:

    * beta >= :data:`EXP_MIN_BETA`: S = sum_j exp(beta (s_ij - m)), each term in float32, as
      exp2(beta log2(e) (s_ij - m)) where numpy's exp2 is vectorised on this CPU, else as exp
      (:func:`exp2_is_vectorised`: the faster of the two, equally exact), with float32 pairwise
      sums per block row accumulated in float64;
      log-sum-exp = beta m + log S. S >= 1 (the maximum's own term), so its relative error, a few
      float32 ulps, is the log-sum-exp's absolute error: the bias (log-mean-exp over beta) is off
      by about 1e-7 / beta.
    * smaller beta: the deviation D = sum_j expm1(beta (s_ij - m)), summed in float64, and
      beta m + log(c + D) (c: the number of columns). expm1 keeps the digits of exp(beta (s - m))
      - 1 that a tiny beta puts far below float32's resolution of exp near 1 (where the exp form
      would lose the bias entirely at beta = 1e-6).

    Each block is reduced :data:`LSE_CHUNK_ROWS` rows at a time (its temporaries stay in cache),
    s - m once for every beta. ``values[:, t]`` belongs to ``betas[t]``; beta = 0 gives log(n_cols).
    """

    def __init__(self, n_rows: int, betas: Sequence[float]) -> None:
        self.betas = [float(b) for b in betas]
        self.values = np.empty((n_rows, len(self.betas)), dtype=np.float64)

    def start(self, start: int, stop: int) -> ReducerState:
        return _LogSumExpState(self, start, stop)


class _LogSumExpState(ReducerState):
    def __init__(self, parent: LogSumExp, start: int, stop: int) -> None:
        self.parent, self.start, self.stop = parent, start, stop
        n = stop - start
        self.terms = lse_terms(parent.betas, exp2_is_vectorised(), EXP_MIN_BETA)  # the formulas: hubless.engine.formulas
        self.peak = np.full(n, -np.inf)  # running max m of s
        # per beta: S = sum exp(beta (s - m)) (exp form) or D = sum expm1(beta (s - m)) (expm1 form)
        self.sums = np.zeros((n, len(parent.betas)))
        self.count = 0
        self.scratch: tuple[np.ndarray, np.ndarray] | None = None

    def update(self, block: np.ndarray, col_offset: int) -> None:
        if not self.terms:
            self.count += block.shape[1]
            return
        width = block.shape[1]
        if self.scratch is None or self.scratch[0].shape[1] != width:
            rows = min(LSE_CHUNK_ROWS, block.shape[0])
            self.scratch = (np.empty((rows, width), np.float32), np.empty((rows, width), np.float32))
        for r0 in range(0, block.shape[0], LSE_CHUNK_ROWS):
            r1 = min(r0 + LSE_CHUNK_ROWS, block.shape[0])
            self._update_rows(block[r0:r1], r0, r1)
        self.count += width

    def _update_rows(self, rows: np.ndarray, r0: int, r1: int) -> None:
        """Add ``rows`` (block rows r0:r1) to the sums. After the first column block the running
        maximum is kept as the shift without looking for a new one (a pass saved): a larger s
        only gives terms above 1, exact as well, unless one overflows float32, and then the rows
        are summed again around their new maximum."""
        old = self.peak[r0:r1]
        if not (self.count and self._add_rows(rows, r0, r1, old, old)):
            self._add_rows(rows, r0, r1, old, np.maximum(old, rows.max(axis=1).astype(np.float64)))

    def _add_rows(self, rows: np.ndarray, r0: int, r1: int, old: np.ndarray, new: np.ndarray) -> bool:
        """Sums around the shift ``new`` (>= ``old``, the shift of what was summed so far);
        False (nothing changed) when a term overflowed."""
        assert self.scratch is not None  # made by update()
        diff, x = (a[: r1 - r0] for a in self.scratch)
        np.subtract(rows, new.astype(np.float32)[:, None], out=diff)  # s - m, formed before scaling
        sums = self.sums[r0:r1]
        added = np.empty((r1 - r0, len(self.terms)))
        with np.errstate(over="ignore"):
            for i, term in enumerate(self.terms):
                added[:, i] = lse_add(NUMPY, diff, term, x)
        if new is old and not np.isfinite(added).all():
            return False
        for i, term in enumerate(self.terms):
            sums[:, term.column] = lse_recentre(NUMPY, sums[:, term.column], added[:, i], term, old, new, self.count)
        self.peak[r0:r1] = new
        return True

    def finish(self) -> None:
        out = self.parent.values[self.start : self.stop]
        by_column = {term.column: term for term in self.terms}
        for t in range(len(self.parent.betas)):
            out[:, t] = lse_finish(NUMPY, by_column.get(t), self.peak, self.sums[:, t], self.count)


class SortedRows(Reducer):
    """Every similarity of each row, sorted ascending: ``values`` is (n_rows, n_cols).

    Memory grows with rows x columns; only the rank-based GC correction needs it.
    """

    def __init__(self, n_rows: int, n_cols: int) -> None:
        self.values = np.empty((n_rows, n_cols), dtype=np.float32)

    def start(self, start: int, stop: int) -> ReducerState:
        return _SortedRowsState(self.values[start:stop])


class _SortedRowsState(ReducerState):
    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def update(self, block: np.ndarray, col_offset: int) -> None:
        self.rows[:, col_offset : col_offset + block.shape[1]] = block

    def finish(self) -> None:
        self.rows.sort(axis=1)


class ColumnNearest(Reducer):
    """The nearest row of every column: ``values`` (n_cols,) float32, its similarity, and ``ids``
    (n_cols,) int64, its row (ties: the lower row), reduced over the rows of the same blocks the
    row reducers see (a gallery x bank pass gives every bank item's nearest gallery item).

    Each block gives the maxima of groups of :data:`COLUMN_GROUP` rows per column (one pass; the
    column maxima follow from them). Only columns whose maximum reaches the best seen so far (by
    any thread) look for the row, in the first group holding it, so after the first row blocks
    little is left to search. numpy's ``argmax(axis=0)`` is avoided: it walks a C-ordered block
    column by column, an order of magnitude slower than a pass. Merges take a lock and compare
    (value, then lower row): the result does not depend on the order the row blocks run in.
    """

    def __init__(self, n_cols: int) -> None:
        self.values = np.full(n_cols, -np.inf, dtype=np.float32)
        self.ids = np.full(n_cols, NO_ID, dtype=np.int64)
        self._lock = threading.Lock()

    def start(self, start: int, stop: int) -> ReducerState:
        return _ColumnNearestState(self, start)


#: Rows per group in :class:`ColumnNearest` (the search for a column's row reads one group).
COLUMN_GROUP = 32


class _ColumnNearestState(ReducerState):
    def __init__(self, parent: ColumnNearest, start: int) -> None:
        self.parent, self.start = parent, start

    def update(self, block: np.ndarray, col_offset: int) -> None:
        parent, (n, width) = self.parent, block.shape
        if n % COLUMN_GROUP:  # pad to whole groups (only a last, partial row block)
            block = np.concatenate([block, np.full((COLUMN_GROUP - n % COLUMN_GROUP, width), -np.inf, dtype=block.dtype)])
        groups = block.reshape(-1, COLUMN_GROUP, width)
        group_max = groups.max(axis=1)  # (n_groups, width)
        best = group_max.max(axis=0)
        cand = np.flatnonzero(best >= parent.values[col_offset : col_offset + width])  # unlocked read: stale lets more through
        if not cand.size:
            return
        first = group_max[:, cand].argmax(axis=0)  # the first group holding the maximum: the lower rows
        rows = self.start + first * COLUMN_GROUP + groups[first, :, cand].argmax(axis=1)
        cols, best = cand + col_offset, best[cand]
        with parent._lock:
            have, have_ids = parent.values[cols], parent.ids[cols]
            better = (best > have) | ((best == have) & (rows < have_ids))
            parent.values[cols[better]] = best[better]
            parent.ids[cols[better]] = rows[better]

    def finish(self) -> None:
        pass


class Dense(Reducer):
    """Every (transformed) block written into ``out`` (n_rows, n_cols): the full score matrix,
    computed by the very block products a streamed search uses, so its values are bitwise the
    ones the search ranks (a single big GEMM can round a product differently in the last bit)."""

    def __init__(self, out: np.ndarray) -> None:
        self.out = out

    def start(self, start: int, stop: int) -> ReducerState:
        return _DenseState(self.out[start:stop])


class _DenseState(ReducerState):
    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows

    def update(self, block: np.ndarray, col_offset: int) -> None:
        self.rows[:, col_offset : col_offset + block.shape[1]] = block

    def finish(self) -> None:
        pass


def _bounds(n: int, block: int) -> list[tuple[int, int]]:
    return [(s, min(n, s + block)) for s in range(0, n, block)]


def row_block_size(n_rows: int, block: int = ROW_BLOCK) -> int:
    """Rows per block: ``block``, or smaller so that every thread gets work on small inputs."""
    per_thread = -(-n_rows // num_threads())
    return max(1, min(block, max(64, per_thread)))


def stream_reduce(
    rows: np.ndarray,
    cols: np.ndarray,
    reducers: Sequence[Reducer],
    *,
    transform: Transform | None = None,
    row_block: int = ROW_BLOCK,
    col_block: int = COL_BLOCK,
    progress: bool | None = None,
    desc: str = "",
    device: DeviceName = None,
    fixed_blocks: bool = False,
) -> None:
    """Feed every block of ``rows @ cols.T`` to ``reducers``.

    ``rows`` (n, d) and ``cols`` (m, d) must be float32 and C-contiguous (see
    :func:`hubless._validation.as_embeddings`). ``transform(sims,
    row_start, row_stop, col_start, col_stop)`` may rewrite a block in place before the reducers
    see it. Reducers must not modify the block. ``device``: where the block products run
    (default: ``HUBLESS_DEVICE`` or numpy; see :mod:`hubless.engine.device`).

    ``fixed_blocks``: every block is ``row_block`` x ``col_block`` (the last ones smaller), cut
    from row 0 and column 0 and multiplied by single-threaded BLAS, whatever the input size and
    the number of threads. A BLAS rounds a product differently in the last bit depending on the
    shape of the call it is part of, so only fixed blocks make the result bitwise independent of
    the machine's cores, and let a computation split into slices that start on block boundaries
    (the distributed fit's tiles) reproduce the whole pass bitwise.
    """
    n, m = rows.shape[0], cols.shape[0]
    col_bounds = _bounds(m, col_block)
    product = block_product(cols, device)

    def work(start: int, stop: int) -> None:
        states = [r.start(start, stop) for r in reducers]
        block_rows = rows[start:stop]
        buffer = np.empty((stop - start, min(col_block, m)), dtype=np.float32)
        for c0, c1 in col_bounds:
            sims = buffer if c1 - c0 == buffer.shape[1] else np.empty((stop - start, c1 - c0), np.float32)
            product(block_rows, c0, c1, sims)
            if transform is not None:
                transform(sims, start, stop, c0, c1)
            for state in states:
                state.update(sims, c0)
        for state in states:
            state.finish()

    row_bounds = _bounds(n, row_block if fixed_blocks else row_block_size(n, row_block))
    run_blocks(work, row_bounds, progress=progress, desc=desc, single_threaded_blas=fixed_blocks)
