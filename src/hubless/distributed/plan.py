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
  :func:`~hubless.engine.merge.merge_bank_parts` (top-k of top-k lists, logaddexp in float64,
  re-weighted bank means);
* a bank shard's activation lists over the gallery shards:
  :func:`~hubless.engine.merge.merge_topk_ids` (value descending, lower gallery id first: exact
  in any order);
* each gallery shard, once complete, copied into the result's arrays (no pairwise stacking: a
  gallery of 30,000 shards is merged in linear time and memory), the gallery mean combined in
  gallery order as :func:`~hubless.engine.merge.merge_gallery_parts` combines it.

The result equals :func:`~hubless.engine.compute_statistics` on the whole arrays: top-k values,
activation ids and scores bitwise for any tile sizes and cuts, log-sum-exps and means to float
rounding (about 1e-7 relative: a tile centres its sums on its own maximum), the same in every
arrival order, so items that tie in one pass (duplicated rows) tie in every run and go to the
lower gallery id (``tests/test_distributed_ties.py``). Tiles on block boundaries (sizes that
are multiples of COL_BLOCK, as the defaults are) read and compute nothing extra; a tile cut
inside a block computes up to one more block at each end. GC's sorted probes are
n_gallery x n_bank numbers: the plan refuses them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hubless.engine.merge import merge_bank_parts, merge_mean, merge_topk_ids, offset_ids
from hubless.engine.statistics import BankStatistics, StatisticsRequest
from hubless.engine.stream import COL_BLOCK, ROW_BLOCK, LogSumExp, Reducer, ReducerState, TopK, stream_reduce
from hubless.engine.updates import side_request
from hubless.errors import InvalidInput

__all__ = ["Tile", "TileMerger", "compute_tile", "compute_tile_streamed", "cut_points", "plan_tiles", "tile_span"]

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


def compute_tile(
    tile: Tile, gallery: np.ndarray, bank: np.ndarray, request: StatisticsRequest, *, gallery_from: int = 0, bank_from: int = 0
) -> BankStatistics:
    """The partial statistics of one tile: its gallery rows ``[g0, g1)`` against its items
    ``[b0, b1)`` of the side's bank. ``gallery`` holds validated float32 gallery rows from
    ``gallery_from`` on and ``bank`` the side's bank items from ``bank_from`` on, covering at
    least the tile's :func:`tile_span` (whole arrays with 0 do). Each block is computed on the
    single pass's block grid and only the tile's own rows and columns are reduced, so top-k
    values, activation ids and scores are bitwise those of one pass (log-sum-exps and means to
    float rounding). Activation ids are global gallery ids; a tile with fewer than k_a gallery
    rows fills its lists with empty slots (-inf, ``NO_ID``)."""
    side, g0, g1, b0, b1 = tile.side, tile.g0, tile.g1, tile.b0, tile.b1
    if gallery_from % COL_BLOCK or bank_from % COL_BLOCK or gallery_from > g0 or bank_from > b0:
        raise InvalidInput(f"tile {tile.key}: its inputs must start on the engine's column blocks at or before the tile")
    if gallery_from + len(gallery) < g1 or bank_from + len(bank) < b1:
        raise InvalidInput(f"tile {tile.key}: its inputs end before the tile")
    request = side_request(request, side)
    dim = gallery.shape[1]
    items = bank[b0 - bank_from : b1 - bank_from]
    part = BankStatistics(
        n_gallery=g1 - g0,
        n_query_bank=b1 - b0 if side == "query" else 0,
        n_gallery_bank=b1 - b0 if side == "gallery" else None,
        query_bank_mean=items.mean(axis=0, dtype=np.float64) if side == "query" else np.zeros(dim),
        gallery_mean=gallery[g0 - gallery_from : g1 - gallery_from].mean(axis=0, dtype=np.float64),
        gallery_bank_mean=items.mean(axis=0, dtype=np.float64) if side == "gallery" else None,
    )
    # the gallery rows' statistics over the bank: whole row blocks of the pass, the tile's columns
    k = request.query_topk if side == "query" else 0
    betas = sorted(request.query_betas if side == "query" else request.gallery_betas)
    r0, r1 = g0 - g0 % ROW_BLOCK, min(-(-g1 // ROW_BLOCK) * ROW_BLOCK, gallery_from + len(gallery))
    topk = TopK(r1 - r0, k) if k else None
    lse = LogSumExp(r1 - r0, betas) if betas else None
    reducers = [_Window(r, b0 - bank_from, b1 - bank_from) for r in (topk, lse) if r is not None]
    if reducers:
        stream_reduce(gallery[r0 - gallery_from : r1 - gallery_from], bank, reducers, progress=False, fixed_blocks=True)
    own = slice(g0 - r0, g1 - r0)
    if topk is not None:
        part.query_topk = topk.values[own]
    if lse is not None:
        setattr(part, f"{side}_lse", {beta: lse.values[own, t] for t, beta in enumerate(betas)})
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
    return part


def compute_tile_streamed(
    tile: Tile,
    read_gallery: Callable[[int, int], np.ndarray],
    read_bank: Callable[[int, int], np.ndarray],
    request: StatisticsRequest,
    n_gallery: int,
    n_bank: int,
    *,
    bank_read: int = BANK_READ,
) -> BankStatistics:
    """:func:`compute_tile` with bounded memory however wide the tile: the gallery rows are read
    once (``read_gallery(start, stop)``, validated float32) and the tile's bank items
    ``bank_read`` at a time (cut on multiples of ``bank_read``, a multiple of the engine's column
    block), each piece's partial folded in bank order into the tile's, as the merger folds
    tiles. So a tile may span the whole bank (one tile per gallery shard: few tiles, one small
    partial per gallery row kept in the work dir) while a task holds its gallery shard and one
    piece of the bank."""
    if bank_read < 1 or bank_read % COL_BLOCK:
        raise InvalidInput(f"bank_read must be a positive multiple of {COL_BLOCK}; got {bank_read}")
    (g0, g1), _ = tile_span(tile, n_gallery, n_bank)
    rows = read_gallery(g0, g1)
    cuts = sorted({tile.b0, tile.b1} | set(range(tile.b0 - tile.b0 % bank_read + bank_read, tile.b1, bank_read)))
    out: BankStatistics | None = None
    for c0, c1 in zip(cuts, cuts[1:]):
        piece = Tile(tile.side, tile.g0, tile.g1, c0, c1)
        _, (b0, b1) = tile_span(piece, n_gallery, n_bank)
        part = compute_tile(piece, rows, read_bank(b0, b1), request, gallery_from=g0, bank_from=b0)
        out = part if out is None else merge_bank_parts(out, part, tile.side)
    assert out is not None  # a tile spans at least one bank item
    return out


def _without_activation(stats: BankStatistics, side: str) -> BankStatistics:
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
        for t in sorted(tiles, key=lambda t: t.b0):
            self.bank_order.setdefault((t.side, t.g0), []).append(t.b0)
        self.waiting: dict[tuple[str, int], dict[int, BankStatistics]] = {}  # (side, g0) -> {b0: partial}
        self.rows: dict[tuple[str, int], BankStatistics] = {}  # (side, g0) -> rows merged over a prefix of bank shards
        self.merged: dict[tuple[str, int], int] = {}  # (side, g0) -> bank shards merged into rows
        self.items: dict[str, np.ndarray] = {}  # "query_topk", "query_lse@beta", ... -> (n_gallery, ...) result arrays
        self.gallery_means: dict[int, tuple[np.ndarray, int]] = {}  # g0 -> (mean of the shard's rows, rows)
        self.activation: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}  # (side, b0) -> (scores, ids)
        self.bank_means: dict[tuple[str, int], tuple[np.ndarray, int]] = {}  # (side, b0) -> (mean, rows)

    def add(self, tile: Tile, part: BankStatistics) -> None:
        if tile.key not in self.expected:
            raise InvalidInput(f"tile {tile.key} is not part of this plan")
        if tile.key in self.seen:
            raise InvalidInput(f"tile {tile.key} was merged twice")
        self.seen.add(tile.key)
        side = tile.side
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
            self.rows[key] = nxt if merged is None else merge_bank_parts(merged, nxt, side)
            done += 1
        self.merged[key] = done
        if done == len(order):  # the shard is complete on this side: into the result
            del self.waiting[key]
            self._store(side, tile.g0, tile.g1, self.rows.pop(key))

    def _store(self, side: str, g0: int, g1: int, part: BankStatistics) -> None:
        self.gallery_means.setdefault(g0, (np.array(part.gallery_mean), g1 - g0))
        arrays = {"query_topk": part.query_topk} if side == "query" and part.query_topk is not None else {}
        arrays.update({f"{side}_lse@{beta!r}": v for beta, v in getattr(part, f"{side}_lse").items()})
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
