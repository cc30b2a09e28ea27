"""Merging tile partials as they arrive, in any order, into the statistics of the whole gallery
against the whole banks: :class:`TileMerger` (see :mod:`hubless.distributed.plan`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from hubless.distributed.plan import SIDES, Tile, lse_block_range
from hubless.distributed.tile_parts import TilePart, finish_lse_blocks, merge_tile_parts
from hubless.engine.merge import merge_mean, merge_topk_ids
from hubless.engine.statistics import BankStatistics, StatisticsRequest
from hubless.errors import InvalidInput

__all__ = ["TileMerger"]


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
            self.bank_blocks[t.side] = max(self.bank_blocks.get(t.side, 0), lse_block_range(t)[1])
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
            lse = finish_lse_blocks(part.lse_blocks[side], self.bank_blocks[side])
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
