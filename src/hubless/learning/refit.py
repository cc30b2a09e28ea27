"""A refit on a reservoir's bank, computing only what changed: :class:`PartStatistics`.

Every query-bank statistic is a reduction over (item, bank query) pairs that merges across
disjoint parts of the bank (:func:`hubless.engine.merge.merge_bank_parts`, the merge the
distributed fit and ``add_query_bank`` use): an item's top-k of two parts is the top-k of its two
top-k lists (exact), its log-sum-exp the ``logaddexp`` of the two, the bank mean re-weighted,
and each bank query's own nearest items (DIS, DualDIS activation sets) are stacked in bank order.
A :class:`~hubless.learning.reservoir.BankReservoir` keeps its bank in parts that only grow or
go away, so for the same live items (one version of the index and the versions refitted from
it) a refit computes the statistics of the rows added since the last one (n_items x n_new) and
merges the parts' statistics; parts dropped are simply left out. When the items changed (a write
to the index since), every part is computed again (n_items x n_bank, as an offline fit).

Memory: the cached statistics of each part (per item: the top-k similarities and/or one
log-sum-exp per beta, float32), at most a few dozen parts (see the reservoir).
The result equals an offline fit on the same bank to float rounding: the merges are exact
(log-sum-exps aside), but a part's similarities are other BLAS calls than one pass's, which some
CPUs' kernels round differently in the last bit (tested with ``OPENBLAS_CORETYPE`` Haswell, Zen,
SkylakeX, Sandybridge); two items tied within that rounding may then swap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hubless.engine import BankStatistics, StatisticsRequest, compute_statistics
from hubless.engine.merge import merge_bank_parts
from hubless.engine.parallel import use_threads
from hubless.engine.updates import side_request
from hubless.learning.reservoir import Part

__all__ = ["PartStatistics", "Refit"]


@dataclass
class Refit:
    """The merged statistics of a bank, and how they were obtained."""

    statistics: BankStatistics
    bank: np.ndarray  # the bank, in the order the statistics describe
    computed_rows: int  # bank rows whose similarities were computed now
    reused_rows: int  # bank rows whose statistics were kept from earlier refits


class PartStatistics:
    """The query-bank statistics of each part of a bank against one set of live items, kept
    between refits (see the module docstring). ``threads``: the engine's worker threads for
    the similarities (1 by default: a refit runs beside the searches it must not slow)."""

    def __init__(self, threads: int | None = 1) -> None:
        self.threads = threads
        self.items = None  # what the cache describes (an index version's live items)
        self.cache: dict[int, tuple[int, BankStatistics]] = {}  # part id -> (rows covered, statistics)

    def clear(self) -> None:
        self.items, self.cache = None, {}

    def rebind(self, items) -> None:
        """The cache now describes ``items`` too (a version refitted from the one it described:
        the same live items in the same order)."""
        self.items = items

    def merged(self, items, gallery: np.ndarray, request: StatisticsRequest, parts: list[Part], lock) -> Refit:
        """The statistics of ``gallery`` (the live items of version ``items``, in order) against
        the bank made of ``parts`` (read under ``lock``), for ``request``'s query-bank side."""
        if items is not self.items:
            self.items, self.cache = items, {}
        request = side_request(request, "query")
        with lock:  # a consistent view of the parts: rows are only appended, past n
            views = [(p.id, p.rows) for p in parts]
        self.cache = {pid: self.cache[pid] for pid, _ in views if pid in self.cache}
        computed = reused = 0
        merged: BankStatistics | None = None
        with use_threads(self.threads):
            for pid, rows in views:
                covered, stats = self.cache.get(pid, (0, None))
                if covered > rows.shape[0]:  # cannot happen: parts only grow
                    covered, stats = 0, None
                if covered < rows.shape[0]:
                    new = compute_statistics(gallery, np.ascontiguousarray(rows[covered:]), None, request)
                    stats = new if stats is None else merge_bank_parts(stats, new, "query")
                    computed += rows.shape[0] - covered
                reused += covered
                assert stats is not None  # a part has at least one row
                self.cache[pid] = (rows.shape[0], stats)
                merged = stats if merged is None else merge_bank_parts(merged, stats, "query")
        assert merged is not None  # the caller checks the bank is not empty
        bank = np.concatenate([rows for _, rows in views])
        return Refit(merged, bank, computed, reused)
