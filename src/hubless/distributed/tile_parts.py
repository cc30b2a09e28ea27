"""A tile's partial statistics (:class:`TilePart`) and how two merge (:func:`merge_tile_parts`),
their log-sum-exps held as per-block sums (:class:`LseBlocks`) until every block of the bank is
folded in, in bank order, by the very float64 operations of the single pass
(:func:`fold_record`), so the merged values are bitwise the pass's (see
:mod:`hubless.distributed.plan` for why)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hubless.distributed.plan import SIDES
from hubless.engine.merge import merge_bank_parts
from hubless.engine.statistics import BankStatistics
from hubless.engine.stream import EXP_MIN_BETA, LogSumExp
from hubless.errors import InvalidInput

__all__ = ["LseBlocks", "TilePart", "finish_lse_blocks", "fold_record", "merge_lse_blocks", "merge_tile_parts"]


@dataclass
class LseBlocks:
    """Log-sum-exp sums of gallery rows over the column blocks ``[first, stop)`` of a bank (block
    c: bank items ``c * COL_BLOCK`` up to ``(c + 1) * COL_BLOCK``), exactly as the single pass's
    :class:`~hubless.engine.stream.LogSumExp` holds them, record by record: each row's shift m
    (``peaks``, float64), its sums around m at each of ``betas`` (``sums``: S = sum_j exp(beta
    (s_j - m)), or D = sum_j expm1(beta (s_j - m)) below ``EXP_MIN_BETA``) and the record's
    columns (``counts``).

    A run that starts at block 0 is the reducer's running state: one record. A run that starts
    later keeps one record per block: the single pass adds each block's float64 sums to the sum
    of every block before it, in bank order, and float64 additions do not regroup, so a later
    block's sums can only be added once everything before them is (:func:`fold_record`)."""

    betas: tuple[float, ...]
    first: int
    stop: int
    peaks: np.ndarray  # (n_rows, n_records) float64
    sums: np.ndarray  # (n_rows, n_records, n_betas) float64
    counts: np.ndarray  # (n_records,) int64

    @classmethod
    def empty(cls, betas: Sequence[float], block: int, n_rows: int) -> LseBlocks:
        """No block yet, starting at ``block``."""
        return cls(tuple(betas), block, block, np.empty((n_rows, 0)), np.empty((n_rows, 0, len(betas))), np.empty(0, np.int64))


def fold_record(betas, peak, sums, count, rec_peak, rec_sums, rec_count):
    """The state (shift, sums, columns) of a row run extended by one record, by the very float64
    operations :class:`~hubless.engine.stream.LogSumExp` applies when it adds a block: with the
    new shift m' = max(m, m_rec) (= m_rec: a block's shift is never below the one before it),
    S' = S exp(beta (m - m')) + S_rec and D' = (c expm1(beta (m - m')) + D exp(beta (m - m'))) +
    D_rec (the record's own factor exp(beta (m_rec - m')) is exactly 1, its c_rec expm1(0)
    exactly 0). A record below the running shift (an earlier tile's block overflowed, see
    :func:`compute_tile`) is re-centred by the same formula: exact to rounding."""
    new = np.maximum(peak, rec_peak)
    out = np.zeros_like(sums)
    for t, beta in enumerate(betas):
        if beta == 0.0:
            continue  # log(columns): nothing summed
        shift, own = beta * (peak - new), beta * (rec_peak - new)
        if beta >= EXP_MIN_BETA:
            out[:, t] = sums[:, t] * np.exp(shift) + rec_sums[:, t] * np.exp(own)
        else:
            recentred = count * np.expm1(shift) + sums[:, t] * np.exp(shift) if count else sums[:, t]
            out[:, t] = recentred + (rec_count * np.expm1(own) + rec_sums[:, t] * np.exp(own))
    return new, out, count + rec_count


def merge_lse_blocks(a: LseBlocks, b: LseBlocks) -> LseBlocks:
    """``a``'s blocks followed by ``b``'s: folded into ``a``'s state when ``a`` starts at block
    0, else kept as records after ``a``'s."""
    if a.stop != b.first or a.betas != b.betas:
        raise InvalidInput(f"log-sum-exp blocks {a.first}-{a.stop} and {b.first}-{b.stop} do not follow each other")
    if a.first:
        return LseBlocks(
            a.betas,
            a.first,
            b.stop,
            np.concatenate([a.peaks, b.peaks], axis=1),
            np.concatenate([a.sums, b.sums], axis=1),
            np.concatenate([a.counts, b.counts]),
        )
    n = a.peaks.shape[0]
    if a.counts.size:
        peak, sums, count = a.peaks[:, 0], a.sums[:, 0], int(a.counts[0])
    else:
        peak, sums, count = np.full(n, -np.inf), np.zeros((n, len(a.betas))), 0
    for j in range(b.counts.size):  # block by block, in bank order (a few blocks per tile: no loop over items)
        peak, sums, count = fold_record(a.betas, peak, sums, count, b.peaks[:, j], b.sums[:, j], int(b.counts[j]))
    return LseBlocks(a.betas, 0, b.stop, peak[:, None], sums[:, None], np.array([count], np.int64))


def finish_lse_blocks(run: LseBlocks, n_blocks: int) -> dict[float, np.ndarray]:
    """{beta: log-sum-exp} of a run folded over every block of the bank, finished by the single
    pass's own reducer (beta m + log S, beta m + log(c + D), log c)."""
    if run.first or run.stop != n_blocks or run.counts.size > 1:
        raise InvalidInput(f"log-sum-exp blocks {run.first}-{run.stop} do not cover the bank's {n_blocks} blocks")
    n = run.peaks.shape[0]
    lse = LogSumExp(n, run.betas)
    state: Any = lse.start(0, n)
    if run.counts.size:
        state.peak, state.sums, state.count = run.peaks[:, 0].copy(), run.sums[:, 0].copy(), int(run.counts[0])
    state.finish()
    return {beta: lse.values[:, t] for t, beta in enumerate(run.betas)}


@dataclass
class TilePart(BankStatistics):
    """A tile's partial statistics: :class:`~hubless.engine.statistics.BankStatistics` whose
    log-sum-exps are held as :class:`LseBlocks` (``lse_blocks[side]``, ``{side}_lse`` empty)
    until the merger has folded every block of the bank, in bank order; :meth:`to_arrays` adds
    ``{side}_lse_blocks`` (first, stop), ``_betas``, ``_peaks``, ``_sums`` and ``_counts``."""

    lse_blocks: dict[str, LseBlocks] = field(default_factory=dict)

    def to_arrays(self) -> dict[str, np.ndarray]:
        out = super().to_arrays()
        for side, run in self.lse_blocks.items():
            out[f"{side}_lse_blocks"] = np.array([run.first, run.stop], np.int64)
            out[f"{side}_lse_betas"] = np.array(run.betas, np.float64)
            out[f"{side}_lse_peaks"], out[f"{side}_lse_sums"], out[f"{side}_lse_counts"] = run.peaks, run.sums, run.counts
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> TilePart:
        part = super().from_arrays(arrays)
        assert isinstance(part, TilePart)  # from_arrays builds cls
        for side in SIDES:
            if f"{side}_lse_blocks" in arrays:
                first, stop = (int(v) for v in arrays[f"{side}_lse_blocks"])
                betas = tuple(float(b) for b in arrays[f"{side}_lse_betas"])
                part.lse_blocks[side] = LseBlocks(
                    betas, first, stop, arrays[f"{side}_lse_peaks"], arrays[f"{side}_lse_sums"], arrays[f"{side}_lse_counts"]
                )
        return part


def merge_tile_parts(a: TilePart, b: TilePart, side: str) -> TilePart:
    """:func:`~hubless.engine.merge.merge_bank_parts` of two tile parts (``b``'s bank items right
    after ``a``'s), their log-sum-exp blocks folded or kept in bank order (:class:`LseBlocks`)."""
    out = merge_bank_parts(a, b, side)
    assert isinstance(out, TilePart)  # merge_bank_parts copies a's class
    out.lse_blocks = dict(a.lse_blocks)
    if side in a.lse_blocks:
        out.lse_blocks[side] = merge_lse_blocks(a.lse_blocks[side], b.lse_blocks[side])
    return out
