"""The engine-free plan of a tiled bank-statistics fit: which tiles, what each computes, how
their partial statistics merge. Nothing here knows about Ray (:mod:`hubless.distributed.fit`
runs the plan on it; a test runs it in a plain loop).

The gallery is cut into row shards and each bank into column shards; a tile is one gallery shard
against one bank shard, and computes that pair's partial statistics with the streamed engine
(:func:`hubless.engine.compute_statistics`): the gallery rows' top-k and log-sum-exps over the
bank shard, and the bank shard's items' top-k_a gallery rows (their activation lists, with global
gallery ids). Partials merge with :mod:`hubless.engine.merge` in any order:

* a gallery shard's row statistics over its bank shards: :func:`~hubless.engine.merge.merge_bank_parts`
  (top-k of top-k lists, logaddexp in float64, re-weighted bank means);
* a bank shard's activation lists over the gallery shards:
  :func:`~hubless.engine.merge.merge_topk_ids` (value descending, lower gallery id first);
* then the gallery shards in order: :func:`~hubless.engine.merge.merge_gallery_parts`.

The result equals :func:`~hubless.engine.compute_statistics` on the whole arrays: top-k values,
activation ids and scores bitwise when each tile's similarities come from the same BLAS calls
as one pass (the statistics use fixed blocks, so shards must start on block boundaries: gallery
and bank shards multiples of COL_BLOCK, since the gallery is the column side of the activation
pass; the defaults are), log-sum-exps and means to float rounding. GC's sorted probes
are n_gallery x n_bank numbers: the plan refuses them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from hubless.engine.merge import merge_bank_parts, merge_gallery_parts, merge_topk_ids
from hubless.engine.statistics import BankStatistics, StatisticsRequest, compute_statistics
from hubless.engine.stream import COL_BLOCK, ROW_BLOCK
from hubless.engine.topk import NO_ID
from hubless.engine.updates import side_request
from hubless.errors import InvalidInput

__all__ = ["Tile", "TileMerger", "compute_tile", "cut_points", "plan_tiles"]

#: Default gallery rows per tile (a multiple of the engine's row block).
GALLERY_ROWS = 64 * ROW_BLOCK
#: Default bank items per tile (a multiple of the engine's column block).
BANK_COLS = 4 * COL_BLOCK
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


def compute_tile(tile: Tile, rows: np.ndarray, bank: np.ndarray, request: StatisticsRequest) -> BankStatistics:
    """The partial statistics of one tile (validated float32 ``rows`` = gallery[g0:g1], ``bank``
    = the side's bank[b0:b1]); activation ids are global gallery ids, padded to the requested
    k_a with empty slots (-inf, ``NO_ID``) when the shard has fewer rows."""
    part_request = side_request(request, tile.side)
    banks = (bank, None) if tile.side == "query" else (None, bank)
    part = compute_statistics(rows, *banks, part_request, progress=False)
    k = getattr(part_request, f"{tile.side}_activation_k")
    if k:
        ids = getattr(part, f"{tile.side}_activation")
        scores = getattr(part, f"{tile.side}_activation_scores")
        pad = k - ids.shape[1]
        setattr(part, f"{tile.side}_activation", np.pad(ids + tile.g0, ((0, 0), (0, pad)), constant_values=NO_ID))
        setattr(part, f"{tile.side}_activation_scores", np.pad(scores, ((0, 0), (0, pad)), constant_values=-np.inf))
    return part


def _without_activation(stats: BankStatistics, side: str) -> BankStatistics:
    return replace(stats, **{f"{side}_activation": None, f"{side}_activation_scores": None})


class TileMerger:
    """Merges tile partials as they arrive, in any order, into the statistics of the whole
    gallery against the whole banks (:meth:`result`). Holds one running partial per gallery
    shard and side, and one activation list per bank shard."""

    def __init__(self, tiles: Sequence[Tile], request: StatisticsRequest, n_gallery: int, dim: int) -> None:
        self.request, self.n_gallery, self.dim = request, n_gallery, dim
        self.expected = {t.key for t in tiles}
        self.seen: set[str] = set()
        self.rows: dict[tuple[str, int], BankStatistics] = {}  # (side, g0) -> rows merged over bank shards
        self.activation: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}  # (side, b0) -> (scores, ids)
        self.bank_means: dict[tuple[str, int], tuple[np.ndarray, int]] = {}  # (side, b0) -> (mean, rows)
        self.gallery_shards: dict[int, int] = {}  # g0 -> g1

    def add(self, tile: Tile, part: BankStatistics) -> None:
        if tile.key not in self.expected:
            raise InvalidInput(f"tile {tile.key} is not part of this plan")
        if tile.key in self.seen:
            raise InvalidInput(f"tile {tile.key} was merged twice")
        self.seen.add(tile.key)
        side = tile.side
        self.gallery_shards[tile.g0] = tile.g1
        self.bank_means.setdefault((side, tile.b0), (getattr(part, f"{side}_bank_mean"), tile.b1 - tile.b0))
        ids = getattr(part, f"{side}_activation")
        if ids is not None:
            mine = (getattr(part, f"{side}_activation_scores"), ids)
            have = self.activation.get((side, tile.b0))
            self.activation[(side, tile.b0)] = mine if have is None else merge_topk_ids(have, mine)
            part = _without_activation(part, side)
        have = self.rows.get((side, tile.g0))
        self.rows[(side, tile.g0)] = part if have is None else merge_bank_parts(have, part, side)

    @property
    def missing(self) -> set[str]:
        return self.expected - self.seen

    def result(self) -> BankStatistics:
        """The merged statistics (every tile must have been added)."""
        if self.missing:
            raise InvalidInput(f"{len(self.missing)} tile(s) were not merged, e.g. {sorted(self.missing)[0]}")
        req = self.request
        shards = sorted(self.gallery_shards.items())
        out = None
        for g0, g1 in shards:
            part = self._gallery_shard(g0, g1)
            out = part if out is None else merge_gallery_parts(out, part)
        if out is None:  # no bank at all (the baseline): only the gallery's size matters
            zeros = np.zeros(self.dim)
            return BankStatistics(self.n_gallery, 0, None, zeros, zeros)
        for side in SIDES:
            k = getattr(req, f"{side}_activation_k")
            if not k or not any(s == side for s, _ in self.activation):
                continue
            lists = [self.activation[key] for key in sorted(key for key in self.activation if key[0] == side)]
            width = min(k, self.n_gallery)
            setattr(out, f"{side}_activation_scores", np.concatenate([s for s, _ in lists])[:, :width])
            setattr(out, f"{side}_activation", np.concatenate([i for _, i in lists])[:, :width])
        return out

    def _gallery_shard(self, g0: int, g1: int) -> BankStatistics:
        """One gallery shard's statistics against both banks (gallery means from its tiles)."""
        query, gallery = self.rows.get(("query", g0)), self.rows.get(("gallery", g0))
        base = query if query is not None else gallery
        if query is None:
            base = replace(base, n_query_bank=0, query_bank_mean=np.zeros(self.dim))
        if gallery is not None and query is not None:
            base = replace(
                base,
                n_gallery_bank=gallery.n_gallery_bank,
                gallery_bank_mean=gallery.gallery_bank_mean,
                gallery_lse=gallery.gallery_lse,
            )
        # the bank means: merged over every bank shard, the same for all gallery shards
        for side in SIDES:
            means = sorted((b0, m, n) for (s, b0), (m, n) in self.bank_means.items() if s == side)
            if means:
                total = sum(n for _, _, n in means)
                mean = sum(np.asarray(m, np.float64) * n for _, m, n in means) / total
                base = replace(base, **{f"n_{side}_bank": total, f"{side}_bank_mean": mean})
        return base
