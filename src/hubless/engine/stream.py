"""The streamed similarity engine: rows x columns in BLAS-sized blocks, reduced row by row.

Every statistic hubless needs has the same shape: for each row vector (a gallery item, a query),
stream the similarities to every column vector (a bank, the gallery) and reduce them to a few
numbers (the top-k, a log-sum-exp, sorted probes). :func:`stream_reduce` computes one block of
similarities at a time with a single GEMM, hands it to each reducer, and never holds more than
``row_block x col_block`` similarities per thread, however large either side is.

A ``transform`` may rewrite each block in place before the reducers see it: exact search of a
correction passes its ranking hook (``Correction.rank``), so a searched block is ranked exactly
as a scored one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hubless.engine.device import block_product
from hubless.engine.parallel import num_threads, run_blocks
from hubless.engine.topk import RunningTopK

__all__ = [
    "ROW_BLOCK",
    "COL_BLOCK",
    "Reducer",
    "ReducerState",
    "TopK",
    "LogSumExp",
    "SortedRows",
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
        if ids is not None:
            self.parent.ids[self.start : self.stop] = ids


class LogSumExp(Reducer):
    """``log sum_j exp(beta * s_ij)`` of each row for several ``betas`` (>= 0), in float64.

    Streamed in a centred form that stays exact for every beta in [1e-6, 1e6]: with m the running
    row maximum of s and c the number of columns seen, it accumulates the deviation
    D = sum_j expm1(beta (s_ij - m)) and returns beta m + log(c + D). Every exponent is <= 0 (no
    overflow); s_ij - m is formed before scaling by beta (a large beta does not magnify the
    rounding of beta * s); and expm1 keeps the digits of exp(beta (s - m)) - 1 that a tiny beta
    puts far below float32's resolution of exp near 1. ``values[:, t]`` belongs to ``betas[t]``;
    beta = 0 gives log(n_cols).
    """

    def __init__(self, n_rows: int, betas: Sequence[float]) -> None:
        self.betas = [float(b) for b in betas]
        self.values = np.empty((n_rows, len(self.betas)), dtype=np.float64)

    def start(self, start: int, stop: int) -> ReducerState:
        return _LogSumExpState(self, start, stop)


class _LogSumExpState(ReducerState):
    def __init__(self, parent: LogSumExp, start: int, stop: int) -> None:
        self.parent, self.start, self.stop = parent, start, stop
        self.peak = np.full(stop - start, -np.inf)  # running max m of s
        self.deviation = np.zeros((stop - start, len(parent.betas)))  # D = sum expm1(beta (s - m))
        self.count = 0
        self.scratch: np.ndarray | None = None

    def update(self, block: np.ndarray, col_offset: int) -> None:
        if self.scratch is None or self.scratch.shape != block.shape:
            self.scratch = np.empty_like(block)
        tmp = self.scratch
        new_peak = np.maximum(self.peak, block.max(axis=1).astype(np.float64))
        peak32 = new_peak.astype(np.float32)[:, None]
        for t, beta in enumerate(self.parent.betas):
            if beta == 0.0:
                continue
            if self.count:  # re-centre what was summed so far on the new maximum
                shift = beta * (self.peak - new_peak)
                self.deviation[:, t] = self.count * np.expm1(shift) + self.deviation[:, t] * np.exp(shift)
            np.subtract(block, peak32, out=tmp)  # s - m <= 0, formed before scaling by beta
            tmp *= np.float32(beta)
            np.expm1(tmp, out=tmp)
            self.deviation[:, t] += tmp.sum(axis=1, dtype=np.float64)
        self.peak = new_peak
        self.count += block.shape[1]

    def finish(self) -> None:
        out = self.parent.values[self.start : self.stop]
        for t, beta in enumerate(self.parent.betas):
            out[:, t] = np.log(self.count) if beta == 0.0 else beta * self.peak + np.log(self.count + self.deviation[:, t])


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
    device: str | None = None,
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
