"""Computing one tile's partial statistics (:func:`compute_tile`, and :func:`compute_tile_streamed`
with bounded memory however wide the tile) with the streamed engine, on the single pass's block
grid: each block product is the very call one pass makes, only the tile's own rows and columns
are reduced (:class:`_Window`), and its log-sum-exps are summed block by block around the pass's
shift (:class:`_BlockSums`, :func:`first_block_max`). See :mod:`hubless.distributed.plan`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hubless.distributed.plan import BANK_READ, Tile, lse_block_range, tile_span
from hubless.distributed.tile_parts import LseBlocks, TilePart, merge_lse_blocks, merge_tile_parts
from hubless.engine.merge import offset_ids
from hubless.engine.statistics import StatisticsRequest
from hubless.engine.stream import COL_BLOCK, ROW_BLOCK, LogSumExp, Reducer, ReducerState, TopK, stream_reduce
from hubless.engine.updates import side_request
from hubless.errors import InvalidInput

__all__ = ["compute_tile", "compute_tile_streamed", "first_block_max"]


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


def _row_span(tile: Tile, gallery_from: int, n_given: int) -> tuple[int, int]:
    """The tile's gallery rows padded to the pass's row blocks (cut where the given rows end)."""
    return tile.g0 - tile.g0 % ROW_BLOCK, min(-(-tile.g1 // ROW_BLOCK) * ROW_BLOCK, gallery_from + n_given)


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
    (:func:`lse_block_range`) around the single pass's shift, block by block (:class:`LseBlocks`;
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
    first, stop = lse_block_range(tile)
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
        part.lse_blocks[side] = run if first else merge_lse_blocks(LseBlocks.empty(betas, 0, g1 - g0), run)
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
    first, stop = lse_block_range(tile)
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
