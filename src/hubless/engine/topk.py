"""Per-row top-k over column blocks that arrive one after another.

The expensive part of a top-k over a long row is looking at every element once. After the first
block, only elements above the current k-th best can enter, and for a long row there are few
(about ``k * block / seen``), so each later block costs one vectorised comparison plus a small
merge instead of a partition of the whole block.
"""

from __future__ import annotations

import numpy as np

from hubless.errors import InvalidInput

__all__ = ["RunningTopK", "NO_ID"]

#: Id stored in slots that hold no element yet (sorts after every real id).
NO_ID = np.iinfo(np.int64).max
#: Columns per group when bounding the first block's k-th value by group maxima.
_GROUP = 16


class RunningTopK:
    """Running top-``k`` of each of ``n_rows`` rows.

    ``with_ids=False`` keeps values only (which of two equal values is kept does not matter).
    ``with_ids=True`` also keeps column ids and orders by (value descending, id ascending): ties
    go to the lower id whatever order the blocks arrive in.
    """

    def __init__(
        self,
        n_rows: int,
        k: int,
        *,
        with_ids: bool = False,
        initial: tuple[np.ndarray, np.ndarray | None] | None = None,
    ) -> None:
        self.k = k
        self.values = np.full((n_rows, k), -np.inf, dtype=np.float32)
        self.ids = np.full((n_rows, k), NO_ID, dtype=np.int64) if with_ids else None
        # k-th best value so far; -inf until every row has seen k columns.
        self.threshold = np.full(n_rows, -np.inf, dtype=np.float32)
        self._seen = 0
        if initial is not None:
            self._seed(*initial)

    def _seed(self, values: np.ndarray, ids: np.ndarray | None) -> None:
        """Start from an earlier top-k (with ids: sorted by value descending, id ascending):
        later blocks merge into it, so a top-k over new columns extends one over old columns."""
        if values.shape != self.values.shape or (self.ids is not None) != (ids is not None):
            raise InvalidInput(f"initial top-k must be {self.values.shape} values{' with ids' if self.ids is not None else ''}")
        self.values[:] = values
        if ids is not None and self.ids is not None:
            self.ids[:] = ids
        self.threshold[:] = values.min(axis=1)
        self._seen = self.k

    def update(self, block: np.ndarray, col_offset: int = 0) -> None:
        """Merge ``block`` (n_rows, width) whose column j has id ``col_offset + j``."""
        n, width = block.shape
        k = self.k
        full = self._seen >= k
        self._seen += width
        if full:
            # Equal values may need their ids compared; values alone never do.
            thr, inclusive = self.threshold, self.ids is not None
        elif width >= _GROUP * 4 * k:
            # First wide block: the k-th largest of the maxima of disjoint column groups is a
            # safe lower bound for each row's k-th largest value (k distinct elements reach it),
            # and it admits few more than k candidates. Far cheaper than a full partition. The
            # groups cover the first width - width % _GROUP columns (a subset: still a bound).
            covered = width - width % _GROUP
            group_max = block[:, :covered].reshape(n, _GROUP, covered // _GROUP).max(axis=1)
            g = group_max.shape[1]
            thr, inclusive = np.partition(group_max, g - k, axis=1)[:, g - k], True
        elif width > 2 * k:
            # First block: its own k-th largest value is a safe lower bound for each row.
            thr, inclusive = np.partition(block, width - k, axis=1)[:, width - k], True
        else:
            self._merge_all(block, col_offset)
            return
        mask = block >= thr[:, None] if inclusive else block > thr[:, None]
        # flatnonzero on the flat view is an order of magnitude faster than 2-D nonzero
        flat = np.flatnonzero(mask.ravel())
        if flat.size == 0:
            return
        rows, cols = np.divmod(flat, width)
        counts = np.bincount(rows, minlength=n)
        active = np.flatnonzero(counts)
        slot = np.cumsum(counts > 0) - 1  # row -> position among active rows
        starts = np.cumsum(counts) - counts
        extra = int(counts.max())
        vals = np.full((active.size, k + extra), -np.inf, dtype=np.float32)
        vals[:, :k] = self.values[active]
        pos = k + np.arange(rows.size) - starts[rows]
        vals[slot[rows], pos] = block[rows, cols]
        if self.ids is None:
            top = np.partition(vals, extra, axis=1)[:, extra:]
            self.values[active] = top
            self.threshold[active] = top.min(axis=1)
        else:
            ids = np.full(vals.shape, NO_ID, dtype=np.int64)
            ids[:, :k] = self.ids[active]
            ids[slot[rows], pos] = cols + col_offset
            self._keep_best(active, vals, ids)

    def _merge_all(self, block: np.ndarray, col_offset: int) -> None:
        """Merge a block narrower than 2k (or the very first tiny blocks) without thresholds."""
        rows = np.arange(block.shape[0])
        vals = np.concatenate([self.values, block], axis=1)
        if self.ids is None:
            extra = vals.shape[1] - self.k
            top = np.partition(vals, extra, axis=1)[:, extra:]
            self.values[:] = top
            self.threshold[:] = top.min(axis=1)
        else:
            new_ids = np.broadcast_to(np.arange(block.shape[1], dtype=np.int64) + col_offset, block.shape)
            ids = np.concatenate([self.ids, new_ids], axis=1)
            self._keep_best(rows, vals, ids)

    def _keep_best(self, rows: np.ndarray, vals: np.ndarray, ids: np.ndarray) -> None:
        order = np.lexsort((ids, -vals), axis=1)[:, : self.k]
        best_vals = np.take_along_axis(vals, order, axis=1)
        self.values[rows] = best_vals
        assert self.ids is not None  # only called when ids are kept
        self.ids[rows] = np.take_along_axis(ids, order, axis=1)
        self.threshold[rows] = best_vals[:, -1]

    def sorted(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Values sorted descending per row (and their ids, ties by lower id)."""
        if self.ids is not None:  # kept sorted by every merge
            return self.values, self.ids
        return -np.sort(-self.values, axis=1), None
