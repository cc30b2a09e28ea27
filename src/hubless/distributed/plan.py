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
  :func:`~hubless.distributed.tile_parts.merge_tile_parts` (top-k of top-k lists and
  re-weighted bank means, :func:`~hubless.engine.merge.merge_bank_parts`; log-sum-exps as
  :class:`~hubless.distributed.tile_parts.LseBlocks`, each column block's float64 sums around
  the single pass's shift, added in bank order by the pass's own arithmetic);
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
(:func:`~hubless.distributed.tile_compute.compute_tile`), around the pass's shift (the row
maximum of the bank's first block, :func:`~hubless.distributed.tile_compute.first_block_max`:
one more block product for a tile that starts later), and hands back each block's sums. The one exception: the pass moves a row's shift where a term would overflow
float32, and a tile after such a block is exact to float rounding only. Tiles on block
boundaries (sizes that are multiples of COL_BLOCK, as the defaults are) read and compute nothing
extra; a tile cut inside a block computes up to one more block at each end. GC's sorted probes are
n_gallery x n_bank numbers: the plan refuses them.

This module plans the tiles (:func:`plan_tiles`, :func:`tile_span`); a tile's partial statistics
and how two merge are in :mod:`hubless.distributed.tile_parts`, computing a tile in
:mod:`hubless.distributed.tile_compute`, merging the partials as they arrive in
:mod:`hubless.distributed.tile_merge`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hubless.engine.statistics import StatisticsRequest
from hubless.engine.stream import COL_BLOCK, ROW_BLOCK
from hubless.errors import InvalidInput

__all__ = ["BANK_COLS", "BANK_READ", "GALLERY_ROWS", "SIDES", "Tile", "cut_points", "lse_block_range", "plan_tiles", "tile_span"]

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


def lse_block_range(tile: Tile) -> tuple[int, int]:
    """The column blocks whose log-sum-exp sums the tile computes: those that start among its
    bank items (whole, past its last item if need be: :func:`tile_span` reads them), so every
    block is summed by exactly one tile of a gallery shard, whole, as the single pass sums it."""
    return -(-tile.b0 // COL_BLOCK), -(-tile.b1 // COL_BLOCK)
