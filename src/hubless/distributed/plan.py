"""The engine-free plan of a tiled bank-statistics fit: which tiles, what each computes, how
their partial statistics merge. Nothing here knows about Ray (:mod:`hubless.distributed.fit`
runs the plan on it; a test runs it in a plain loop).

The gallery is cut into row shards and each bank into column shards; a tile is one gallery shard
against one bank shard, and computes that pair's partial statistics with the streamed engine
(the passes of :func:`hubless.engine.compute_statistics`): the gallery rows' top-k and
log-sum-exps over the bank shard, and the bank shard's items' top-k_a gallery rows (their
activation lists, with global gallery ids). A tile reads its rows padded out to the engine's
blocks (:func:`tile_span`) and computes whole blocks of the single pass's grid, reducing only its
own rows and columns, so its similarities are bitwise those of one pass whatever the cut.
Partials merge with :mod:`hubless.engine.merge`, arriving in any order:

* a gallery shard's row statistics over its bank shards, folded in bank order:
  :func:`merge_tile_parts` (top-k of top-k lists and re-weighted bank means,
  :func:`~hubless.engine.merge.merge_bank_parts`; log-sum-exps as :class:`LseBlocks`, each
  column block's float64 sums around the single pass's shift, added in bank order by the
  pass's own arithmetic);
* a bank shard's activation lists over the gallery shards:
  :func:`~hubless.engine.merge.merge_topk_ids` (value descending, lower gallery id first: exact
  in any order);
* each gallery shard, once complete, copied into the result's arrays (no pairwise stacking: a
  gallery of 30,000 shards is merged in linear time and memory), the gallery mean combined in
  gallery order as :func:`~hubless.engine.merge.merge_gallery_parts` combines it.

The result equals :func:`~hubless.engine.compute_statistics` on the whole arrays: top-k values,
log-sum-exps, activation ids and scores bitwise for any tile sizes and cuts (means to float
rounding), the same in every arrival order, so items that tie in one pass (duplicated rows) tie
in every run and go to the lower gallery id (``tests/distributed/test_distributed_ties.py``). Log-sum-exps
need the pass's own sums: the BLAS rounds identical rows at different positions of one product
differently in the last bit, so copies' sums agree only over the very same terms, summed in the
very same order. Each tile therefore sums the whole column blocks that start among its items
(:func:`compute_tile`), around the pass's shift (the row maximum of the bank's first block,
:func:`first_block_max`: one more block product for a tile that starts later), and hands back
each block's sums. The one exception: the pass moves a row's shift where a term would overflow
float32, and a tile after such a block is exact to float rounding only. Tiles on block
boundaries (sizes that are multiples of COL_BLOCK, as the defaults are) read and compute nothing
extra; a tile cut inside a block computes up to one more block at each end. GC's sorted probes are
n_gallery x n_bank numbers: the plan refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hubless.engine.merge import merge_bank_parts, merge_mean, merge_topk_ids, offset_ids
from hubless.engine.statistics import BankStatistics, StatisticsRequest
from hubless.engine.stream import COL_BLOCK, EXP_MIN_BETA, ROW_BLOCK, LogSumExp, Reducer, ReducerState, TopK, stream_reduce
from hubless.engine.updates import side_request
from hubless.errors import InvalidInput

__all__ = [
    "LseBlocks",
    "Tile",
    "TileMerger",
    "TilePart",
    "compute_tile",
    "compute_tile_streamed",
    "cut_points",
    "first_block_max",
    "merge_tile_parts",
    "plan_tiles",
    "tile_span",
]

#: Default gallery rows per tile (a multiple of the engine's row block).
GALLERY_ROWS = 64 * ROW_BLOCK
#: Default bank items per tile (a multiple of the engine's column block).
BANK_COLS = 4 * COL_BLOCK
#: Bank items a tile reads and computes at a time (:func:`compute_tile_streamed`): a tile of
#: any width holds only this many bank items (128 MiB at d = 512).
BANK_READ = 4 * COL_BLOCK
SIDES = ("query", "gallery")


@dataclass(frozen=True)
class Tile:
    """Gallery rows ``[g0, g1)`` against items ``[b0, b1)`` of the ``side`` bank."""

    side: str
    g0: int
    g1: int
    b0: int
    b1: int

    @property
    def key(self) -> str:
        return f"{self.side}-g{self.g0}-{self.g1}-b{self.b0}-{self.b1}"


def cut_points(n: int, size: int | Sequence[int], name: str) -> list[int]:
    """Shard boundaries ``[0, ..., n]``: every ``size`` rows, or the given cut points (those
    past ``n`` ignored, so one list can cut banks of different sizes)."""
    if isinstance(size, (int, np.integer)):
        if size < 1:
            raise InvalidInput(f"{name} must be >= 1; got {size}")
        return [*range(0, n, int(size)), n] if n else [0, 0]
    cuts = [int(c) for c in size]
    if any(c < 0 for c in cuts):
        raise InvalidInput(f"{name} cut points must be >= 0; got {cuts}")
    return sorted({c for c in cuts if c < n} | {0, n})  # cut points past the end are ignored


def plan_tiles(
    request: StatisticsRequest,
    n_gallery: int,
    n_query_bank: int | None,
    n_gallery_bank: int | None,
    *,
    gallery_rows: int | Sequence[int] = GALLERY_ROWS,
    bank_cols: int | Sequence[int] = BANK_COLS,
) -> list[Tile]:
    """Every tile: each gallery shard against each shard of each bank given (a tile whose side
    has nothing requested computes only the means, which DN reads)."""
    if request.query_probes:
        raise InvalidInput(
            "GC needs every gallery item's sorted similarities to the whole query bank (n_gallery x n_bank numbers): "
            "it cannot be fitted from tiles; fit it on one machine"
        )
    g_cuts = cut_points(n_gallery, gallery_rows, "gallery_rows")
    tiles = []
    for side, n_bank in (("query", n_query_bank), ("gallery", n_gallery_bank)):
        if not n_bank:
            continue
        b_cuts = cut_points(n_bank, bank_cols, "bank_cols")
        for g0, g1 in zip(g_cuts, g_cuts[1:]):
            for b0, b1 in zip(b_cuts, b_cuts[1:]):
                if g1 > g0 and b1 > b0:
                    tiles.append(Tile(side, g0, g1, b0, b1))
    return tiles


def tile_span(tile: Tile, n_gallery: int, n_bank: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The gallery rows and bank items a tile reads: its own, padded out to the engine's column
    blocks (``COL_BLOCK``, a multiple of ``ROW_BLOCK``) and cut at the ends of the data. Every
    block product of the tile is then the very call one single-machine pass makes (same rows,
    same columns, same shape), so its similarities are bitwise the same whatever the cut: a BLAS
    rounds a product differently in the last bit depending on the shape of the call (a 1-row
    product takes another code path), and an item duplicated across a cut would otherwise tie
    in one pass and not in the other. Tiles on block boundaries read nothing more."""

    def padded(lo: int, hi: int, n: int) -> tuple[int, int]:
        return lo - lo % COL_BLOCK, min(n, -(-hi // COL_BLOCK) * COL_BLOCK)

    return padded(tile.g0, tile.g1, n_gallery), padded(tile.b0, tile.b1, n_bank)


class _Window(Reducer):
    """Feeds ``inner`` only the columns ``[lo, hi)`` of each block (a tile's own columns of a
    block computed whole)."""

    def __init__(self, inner: Reducer, lo: int, hi: int) -> None:
        self.inner, self.lo, self.hi = inner, lo, hi

    def start(self, start: int, stop: int) -> ReducerState:
        return _WindowState(self.inner.start(start, stop), self.lo, self.hi)


class _WindowState(ReducerState):
    def __init__(self, inner: ReducerState, lo: int, hi: int) -> None:
        self.inner, self.lo, self.hi = inner, lo, hi

    def update(self, block: np.ndarray, col_offset: int) -> None:
        a, b = max(self.lo - col_offset, 0), min(self.hi - col_offset, block.shape[1])
        if a < b:
            self.inner.update(block[:, a:b], col_offset + a)

    def finish(self) -> None:
        self.inner.finish()


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
    block's sums can only be added once everything before them is (:func:`_fold`)."""

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


def _fold(betas, peak, sums, count, rec_peak, rec_sums, rec_count):
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


def _merge_lse(a: LseBlocks, b: LseBlocks) -> LseBlocks:
    """``a``'s blocks followed by ``b``'s: folded into ``a``'s state when ``a`` starts at block
    0, else kept as records after ``a``'s."""
    if a.stop != b.first or a.betas != b.betas:
        raise InvalidInput(f"log-sum-exp blocks {a.first}-{a.stop} and {b.first}-{b.stop} do not follow each other")
    if a.first:
        return LseBlocks(
            a.betas, a.first, b.stop, np.concatenate([a.peaks, b.peaks], axis=1), np.concatenate([a.sums, b.sums], axis=1),
            np.concatenate([a.counts, b.counts]),
        )  # fmt: skip
    n = a.peaks.shape[0]
    if a.counts.size:
        peak, sums, count = a.peaks[:, 0], a.sums[:, 0], int(a.counts[0])
    else:
        peak, sums, count = np.full(n, -np.inf), np.zeros((n, len(a.betas))), 0
    for j in range(b.counts.size):  # block by block, in bank order (a few blocks per tile: no loop over items)
        peak, sums, count = _fold(a.betas, peak, sums, count, b.peaks[:, j], b.sums[:, j], int(b.counts[j]))
    return LseBlocks(a.betas, 0, b.stop, peak[:, None], sums[:, None], np.array([count], np.int64))


def _finish_lse(run: LseBlocks, n_blocks: int) -> dict[float, np.ndarray]:
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


class _BlockSums(Reducer):
    """Each column block's :class:`LogSumExp` record (shift and sums) over rows that are whole row
    blocks of the single pass, entering each block with the shift the pass has there: ``shift``
    (the rows' first-block maxima, :func:`first_block_max`) before the tile's first block, then
    the shift the previous block left (None: the tile starts at block 0, where the pass takes
    the block's row maximum). Every block is summed by a state of the pass's own reducer, so its
    per-block arithmetic is the pass's whatever it is."""

    def __init__(self, n_rows: int, betas: Sequence[float], n_blocks: int, shift: np.ndarray | None) -> None:
        self.lse, self.shift = LogSumExp(n_rows, betas), shift
        self.peaks = np.empty((n_rows, n_blocks))
        self.sums = np.empty((n_rows, n_blocks, len(betas)))
        self.counts = np.zeros(n_blocks, np.int64)

    def start(self, start: int, stop: int) -> ReducerState:
        return _BlockSumsState(self, start, stop)


class _BlockSumsState(ReducerState):
    def __init__(self, parent: _BlockSums, start: int, stop: int) -> None:
        self.parent, self.start, self.stop = parent, start, stop
        self.peak = None if parent.shift is None else parent.shift[start:stop]
        self.block = 0

    def _state(self, count: int) -> Any:
        state: Any = self.parent.lse.start(self.start, self.stop)  # shift, sums 0, columns so far
        if self.peak is not None:
            state.peak[:] = self.peak
        state.count = count
        return state

    def update(self, block: np.ndarray, col_offset: int) -> None:
        p, j = self.parent, self.block
        if self.peak is None:  # the pass's first block: its row maxima become the shift
            state = self._state(0)
            state.update(block, col_offset)
        else:  # a later block: the pass keeps the shift (count > 0), unless a term overflows
            state = self._state(1)
            state.update(block, col_offset)
            moved = state.peak != self.peak
            if moved.any():  # summed again around max(shift, row max): take those rows without the
                again = self._state(0)  # re-centring of the (empty) sums before, which count = 1 added
                again.update(block, col_offset)
                state.peak[moved], state.sums[moved] = again.peak[moved], again.sums[moved]
        p.peaks[self.start : self.stop, j], p.sums[self.start : self.stop, j] = state.peak, state.sums
        p.counts[j] = block.shape[1]
        self.peak, self.block = state.peak, j + 1

    def finish(self) -> None:
        pass


class _FirstBlockMax(Reducer):
    """Each row's maximum over the first column block (``values``, float64)."""

    def __init__(self, n_rows: int) -> None:
        self.values = np.full(n_rows, -np.inf)

    def start(self, start: int, stop: int) -> ReducerState:
        return _FirstBlockMaxState(self.values[start:stop])


class _FirstBlockMaxState(ReducerState):
    def __init__(self, values: np.ndarray) -> None:
        self.values = values

    def update(self, block: np.ndarray, col_offset: int) -> None:
        if col_offset == 0:
            self.values[:] = block.max(axis=1)

    def finish(self) -> None:
        pass


def first_block_max(rows: np.ndarray, first_block: np.ndarray) -> np.ndarray:
    """The shift the single pass's log-sum-exp keeps for ``rows`` (whole row blocks of the pass,
    from a multiple of ``ROW_BLOCK``): each row's maximum similarity to ``first_block``, the
    bank's items 0 up to ``COL_BLOCK`` (fewer in a smaller bank), computed by the pass's own block
    product (float64 (n_rows,)). A tile whose bank items start later needs it to sum its blocks
    around the pass's shift; it costs one block product per row block, no exponentials."""
    out = _FirstBlockMax(len(rows))
    stream_reduce(rows, first_block[:COL_BLOCK], [out], progress=False, fixed_blocks=True)
    return out.values


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
        out.lse_blocks[side] = _merge_lse(a.lse_blocks[side], b.lse_blocks[side])
    return out


def _row_span(tile: Tile, gallery_from: int, n_given: int) -> tuple[int, int]:
    """The tile's gallery rows padded to the pass's row blocks (cut where the given rows end)."""
    return tile.g0 - tile.g0 % ROW_BLOCK, min(-(-tile.g1 // ROW_BLOCK) * ROW_BLOCK, gallery_from + n_given)


def _lse_blocks(tile: Tile) -> tuple[int, int]:
    """The column blocks whose log-sum-exp sums the tile computes: those that start among its
    bank items (whole, past its last item if need be: :func:`tile_span` reads them), so every
    block is summed by exactly one tile of a gallery shard, whole, as the single pass sums it."""
    return -(-tile.b0 // COL_BLOCK), -(-tile.b1 // COL_BLOCK)


def compute_tile(
    tile: Tile,
    gallery: np.ndarray,
    bank: np.ndarray,
    request: StatisticsRequest,
    *,
    gallery_from: int = 0,
    bank_from: int = 0,
    first_block: np.ndarray | None = None,
) -> TilePart:
    """The partial statistics of one tile: its gallery rows ``[g0, g1)`` against its items
    ``[b0, b1)`` of the side's bank. ``gallery`` holds validated float32 gallery rows from
    ``gallery_from`` on and ``bank`` the side's bank items from ``bank_from`` on, covering at
    least the tile's :func:`tile_span` (whole arrays with 0 do). Each block is computed on the
    single pass's block grid and only the tile's own rows and columns are reduced, so top-k
    values, activation ids and scores are bitwise those of one pass. Activation ids are global
    gallery ids; a tile with fewer than k_a gallery rows fills its lists with empty slots (-inf,
    ``NO_ID``).

    Log-sum-exps: the tile sums the whole column blocks that start among its items
    (:func:`_lse_blocks`) around the single pass's shift, block by block (:class:`LseBlocks`;
    the merger folds them in bank order), so the merged values are bitwise the pass's. A tile
    after the first block needs that shift, :func:`first_block_max` of its rows: from
    ``first_block``, the bank's items 0 up to ``COL_BLOCK`` (or ``bank`` when it starts at item
    0). The pass moves a
    row's shift only where a term would overflow float32 (exp(beta (s - m)) > 3.4e38: with unit
    vectors, only for beta > 44); a tile after such a block enters with the first block's shift
    and its rows are then exact to float rounding, not bitwise."""
    if first_block is None and not bank_from:
        first_block = bank
    part, _ = _tile_part(tile, gallery, bank, request, gallery_from, bank_from, None, first_block)
    return part


def _tile_part(
    tile: Tile,
    gallery: np.ndarray,
    bank: np.ndarray,
    request: StatisticsRequest,
    gallery_from: int,
    bank_from: int,
    lse_shift: np.ndarray | None,
    first_block: np.ndarray | None = None,
) -> tuple[TilePart, np.ndarray | None]:
    """:func:`compute_tile` with the shift its rows :func:`_row_span` enter its first
    log-sum-exp block with (``lse_shift``, or :func:`first_block_max` over ``first_block``), and
    the shift its last block leaves (None when it sums none)."""
    side, g0, g1, b0, b1 = tile.side, tile.g0, tile.g1, tile.b0, tile.b1
    if gallery_from % COL_BLOCK or bank_from % COL_BLOCK or gallery_from > g0 or bank_from > b0:
        raise InvalidInput(f"tile {tile.key}: its inputs must start on the engine's column blocks at or before the tile")
    if gallery_from + len(gallery) < g1 or bank_from + len(bank) < b1:
        raise InvalidInput(f"tile {tile.key}: its inputs end before the tile")
    request = side_request(request, side)
    dim = gallery.shape[1]
    items = bank[b0 - bank_from : b1 - bank_from]
    part = TilePart(
        n_gallery=g1 - g0,
        n_query_bank=b1 - b0 if side == "query" else 0,
        n_gallery_bank=b1 - b0 if side == "gallery" else None,
        query_bank_mean=items.mean(axis=0, dtype=np.float64) if side == "query" else np.zeros(dim),
        gallery_mean=gallery[g0 - gallery_from : g1 - gallery_from].mean(axis=0, dtype=np.float64),
        gallery_bank_mean=items.mean(axis=0, dtype=np.float64) if side == "gallery" else None,
    )
    # the gallery rows' statistics over the bank: whole row blocks of the pass, the tile's columns
    # (top-k) and the whole column blocks that start among them (log-sum-exp)
    k = request.query_topk if side == "query" else 0
    betas = sorted(request.query_betas if side == "query" else request.gallery_betas)
    r0, r1 = _row_span(tile, gallery_from, len(gallery))
    rows = gallery[r0 - gallery_from : r1 - gallery_from]
    topk = TopK(r1 - r0, k) if k else None
    reducers: list[Reducer] = [] if topk is None else [_Window(topk, b0 - bank_from, b1 - bank_from)]
    first, stop = _lse_blocks(tile)
    sums = None
    if betas and first < stop:
        if first and lse_shift is None:
            if first_block is None:
                raise InvalidInput(f"tile {tile.key}: its log-sum-exps need the bank's first block (first_block=)")
            lse_shift = first_block_max(rows, first_block)
        if lse_shift is not None and len(lse_shift) != r1 - r0:
            raise InvalidInput(f"tile {tile.key}: its shift has {len(lse_shift)} rows; its row blocks have {r1 - r0}")
        sums = _BlockSums(r1 - r0, betas, stop - first, lse_shift if first else None)
        reducers.append(_Window(sums, first * COL_BLOCK - bank_from, min(stop * COL_BLOCK, bank_from + len(bank)) - bank_from))
    if reducers:
        stream_reduce(rows, bank, reducers, progress=False, fixed_blocks=True)
    own = slice(g0 - r0, g1 - r0)
    if topk is not None:
        part.query_topk = topk.values[own]
    end = None
    if betas:
        run = LseBlocks.empty(betas, first, g1 - g0)
        if sums is not None:
            run = LseBlocks(tuple(betas), first, stop, sums.peaks[own], sums.sums[own], sums.counts)
            end = sums.peaks[:, -1]
        part.lse_blocks[side] = run if first else _merge_lse(LseBlocks.empty(betas, 0, g1 - g0), run)
    # the bank items' nearest gallery rows: whole row blocks of the bank, the tile's gallery columns
    k_a = getattr(request, f"{side}_activation_k")
    if k_a:
        a0, a1 = b0 - b0 % ROW_BLOCK, min(-(-b1 // ROW_BLOCK) * ROW_BLOCK, bank_from + len(bank))
        nearest = TopK(a1 - a0, k_a, with_ids=True)
        window = _Window(nearest, g0 - gallery_from, g1 - gallery_from)
        stream_reduce(bank[a0 - bank_from : a1 - bank_from], gallery, [window], progress=False, fixed_blocks=True)
        mine = slice(b0 - a0, b1 - a0)
        setattr(part, f"{side}_activation", offset_ids(nearest.ids_[mine], gallery_from))
        setattr(part, f"{side}_activation_scores", nearest.values[mine])
    return part, end


def compute_tile_streamed(
    tile: Tile,
    read_gallery: Callable[[int, int], np.ndarray],
    read_bank: Callable[[int, int], np.ndarray],
    request: StatisticsRequest,
    n_gallery: int,
    n_bank: int,
    *,
    bank_read: int = BANK_READ,
) -> TilePart:
    """:func:`compute_tile` with bounded memory however wide the tile: the gallery rows are read
    once (``read_gallery(start, stop)``, validated float32) and the tile's bank items
    ``bank_read`` at a time (cut on multiples of ``bank_read``, a multiple of the engine's column
    block), each piece's partial folded in bank order into the tile's, as the merger folds
    tiles; each piece enters its log-sum-exp blocks with the shift the piece before left (the
    first with :func:`first_block_max`, reading the bank's first block, unless the tile starts
    at item 0). So a tile may span the whole bank (one tile per gallery shard: few tiles, one
    small partial per gallery row kept in the work dir) while a task holds its gallery shard and
    one piece of the bank."""
    if bank_read < 1 or bank_read % COL_BLOCK:
        raise InvalidInput(f"bank_read must be a positive multiple of {COL_BLOCK}; got {bank_read}")
    (g0, g1), _ = tile_span(tile, n_gallery, n_bank)
    rows = read_gallery(g0, g1)
    shift = None
    first, stop = _lse_blocks(tile)
    side_betas = getattr(side_request(request, tile.side), f"{tile.side}_betas")
    if side_betas and 0 < first < stop:
        r0, r1 = _row_span(tile, g0, len(rows))
        shift = first_block_max(rows[r0 - g0 : r1 - g0], read_bank(0, min(COL_BLOCK, n_bank)))
    cuts = sorted({tile.b0, tile.b1} | set(range(tile.b0 - tile.b0 % bank_read + bank_read, tile.b1, bank_read)))
    out: TilePart | None = None
    for c0, c1 in zip(cuts, cuts[1:]):
        piece = Tile(tile.side, tile.g0, tile.g1, c0, c1)
        _, (b0, b1) = tile_span(piece, n_gallery, n_bank)
        part, end = _tile_part(piece, rows, read_bank(b0, b1), request, g0, b0, shift)
        shift = shift if end is None else end
        out = part if out is None else merge_tile_parts(out, part, tile.side)
    assert out is not None  # a tile spans at least one bank item
    return out


def _without_activation(stats: TilePart, side: str) -> TilePart:
    dropped: dict[str, Any] = {f"{side}_activation": None, f"{side}_activation_scores": None}
    return replace(stats, **dropped)


class TileMerger:
    """Merges tile partials as they arrive, in any order, into the statistics of the whole
    gallery against the whole banks (:meth:`result`), the same whatever the order: a gallery
    shard's partials are folded in bank order (a partial that arrives early waits for the ones
    before it), so every item's log-sum-exp is rounded the same way whichever tile finishes
    first, and items that tie in one run tie in every run; activation lists merge exactly (value
    descending, lower gallery id first); means are combined in gallery and bank order.

    Memory: once a gallery shard has all its partials on a side, its per-item arrays are copied
    into the result's arrays (allocated once, n_gallery rows) and the partials dropped, so the
    merger holds the result (4 k + 8 x betas bytes per gallery item), the shards still being
    folded, one activation list per bank shard and one mean per shard. With ``sink``, a
    finished shard's per-item arrays go to ``sink(side, g0, g1, {name: array})`` instead (names as
    :meth:`BankStatistics.to_arrays` gives them) and the merger keeps no per-item numbers: the
    result then holds the sizes, means and activation lists only."""

    def __init__(
        self, tiles: Sequence[Tile], request: StatisticsRequest, n_gallery: int, dim: int, *, sink: Callable | None = None
    ) -> None:
        self.request, self.n_gallery, self.dim, self.sink = request, n_gallery, dim, sink
        self.expected = {t.key for t in tiles}
        self.seen: set[str] = set()
        self.bank_order: dict[tuple[str, int], list[int]] = {}  # (side, g0) -> its tiles' b0, in bank order
        self.bank_blocks: dict[str, int] = {}  # side -> column blocks of its bank
        for t in sorted(tiles, key=lambda t: t.b0):
            self.bank_order.setdefault((t.side, t.g0), []).append(t.b0)
            self.bank_blocks[t.side] = max(self.bank_blocks.get(t.side, 0), _lse_blocks(t)[1])
        self.waiting: dict[tuple[str, int], dict[int, TilePart]] = {}  # (side, g0) -> {b0: partial}
        self.rows: dict[tuple[str, int], TilePart] = {}  # (side, g0) -> rows merged over a prefix of bank shards
        self.merged: dict[tuple[str, int], int] = {}  # (side, g0) -> bank shards merged into rows
        self.items: dict[str, np.ndarray] = {}  # "query_topk", "query_lse@beta", ... -> (n_gallery, ...) result arrays
        self.gallery_means: dict[int, tuple[np.ndarray, int]] = {}  # g0 -> (mean of the shard's rows, rows)
        self.activation: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}  # (side, b0) -> (scores, ids)
        self.bank_means: dict[tuple[str, int], tuple[np.ndarray, int]] = {}  # (side, b0) -> (mean, rows)

    def add(self, tile: Tile, part: TilePart) -> None:
        if tile.key not in self.expected:
            raise InvalidInput(f"tile {tile.key} is not part of this plan")
        if tile.key in self.seen:
            raise InvalidInput(f"tile {tile.key} was merged twice")
        side = tile.side
        if not isinstance(part, TilePart):  # statistics made elsewhere (a benchmark's): without log-sum-exps only
            if getattr(part, f"{side}_lse"):
                raise InvalidInput(f"tile {tile.key}: its log-sum-exps must come as blocks (a TilePart from compute_tile)")
            part = TilePart(**vars(part))
        self.seen.add(tile.key)
        # what is kept is copied: a partial may be a view of a task's result (Ray's zero-copy
        # arrays), and one kept slice would pin the whole result in the driver's memory
        self.bank_means.setdefault((side, tile.b0), (np.array(getattr(part, f"{side}_bank_mean")), tile.b1 - tile.b0))
        ids = getattr(part, f"{side}_activation")
        if ids is not None:
            mine = (np.array(getattr(part, f"{side}_activation_scores")), np.array(ids))
            have = self.activation.get((side, tile.b0))
            self.activation[(side, tile.b0)] = mine if have is None else merge_topk_ids(have, mine)
            part = _without_activation(part, side)
        key = (side, tile.g0)
        waiting = self.waiting.setdefault(key, {})
        waiting[tile.b0] = part
        order, done = self.bank_order[key], self.merged.get(key, 0)
        while done < len(order) and order[done] in waiting:  # fold the next bank shards in order
            nxt = waiting.pop(order[done])
            merged = self.rows.get(key)
            self.rows[key] = nxt if merged is None else merge_tile_parts(merged, nxt, side)
            done += 1
        self.merged[key] = done
        if done == len(order):  # the shard is complete on this side: into the result
            del self.waiting[key]
            self._store(side, tile.g0, tile.g1, self.rows.pop(key))

    def _store(self, side: str, g0: int, g1: int, part: TilePart) -> None:
        self.gallery_means.setdefault(g0, (np.array(part.gallery_mean), g1 - g0))
        arrays = {"query_topk": part.query_topk} if side == "query" and part.query_topk is not None else {}
        if side in part.lse_blocks:  # folded over every block of the bank: finished as the single pass finishes
            lse = _finish_lse(part.lse_blocks[side], self.bank_blocks[side])
            arrays.update({f"{side}_lse@{beta!r}": v for beta, v in lse.items()})
        if self.sink is not None:
            self.sink(side, g0, g1, arrays)
            return
        for name, values in arrays.items():
            out = self.items.get(name)
            if out is None:
                out = self.items[name] = np.empty((self.n_gallery, *values.shape[1:]), dtype=values.dtype)
            out[g0:g1] = values

    @property
    def missing(self) -> set[str]:
        return self.expected - self.seen

    def result(self) -> BankStatistics:
        """The merged statistics (every tile must have been added)."""
        if self.missing:
            raise InvalidInput(f"{len(self.missing)} tile(s) were not merged, e.g. {sorted(self.missing)[0]}")
        zeros = np.zeros(self.dim)
        if not self.gallery_means:  # no bank at all (the baseline): only the gallery's size matters
            return BankStatistics(self.n_gallery, 0, None, zeros, zeros)
        mean, rows = None, 0
        for _, (m, n) in sorted(self.gallery_means.items()):  # in gallery order, as merge_gallery_parts combines them
            mean, rows = (m, n) if mean is None else (merge_mean(mean, rows, m, n), rows + n)
        banks: dict[str, tuple[int, np.ndarray]] = {}
        for side in SIDES:  # merged over every bank shard, in bank order
            means = sorted((b0, m, n) for (s, b0), (m, n) in self.bank_means.items() if s == side)
            if means:
                total = sum(n for _, _, n in means)
                banks[side] = (total, np.asarray(sum(np.asarray(m, np.float64) * n for _, m, n in means) / total))
        n_query, query_mean = banks.get("query", (0, zeros))
        n_gallery_bank, gallery_bank_mean = banks.get("gallery", (None, None))
        out = BankStatistics(self.n_gallery, n_query, n_gallery_bank, query_mean, np.asarray(mean, np.float64), gallery_bank_mean)
        out.query_topk = self.items.get("query_topk")
        for name, values in self.items.items():
            if "@" in name:
                field_name, beta = name.split("@")
                getattr(out, field_name)[float(beta)] = values
        for side in SIDES:
            k = getattr(self.request, f"{side}_activation_k")
            if not k or not any(s == side for s, _ in self.activation):
                continue
            lists = [self.activation[key] for key in sorted(key for key in self.activation if key[0] == side)]
            width = min(k, self.n_gallery)
            setattr(out, f"{side}_activation_scores", np.concatenate([s for s, _ in lists])[:, :width])
            setattr(out, f"{side}_activation", np.concatenate([i for _, i in lists])[:, :width])
        return out
