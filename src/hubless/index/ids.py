"""Stable item ids: validation, and the map from an id to its row in a live index.

Every item of an index has an int64 id >= 0 that never changes: given by the user (a database
key) or assigned, counting up from the index's ``next_id``, which only grows, so an assigned id
is never used twice, even after its item was removed. A user may add an id again after removing
it (a key re-inserted); an id that is present cannot be added again without ``upsert``.

Rows are positions in the index's physical order (the base's rows, then each write's); a
removed item's row stays until compaction, marked dead. :class:`IdMap` finds the row of an id:
the base's ids in a sorted array (searched in O(log n), built once per base) and the later
writes' in a dict (O(batch) per write).
"""

from __future__ import annotations

import numpy as np

from hubless.errors import InvalidInput, InvalidType

__all__ = ["MAX_ID", "IdMap", "assigned_ids", "check_ids", "first_few"]

#: The largest id (ids are int64 >= 0; -1 marks an unfilled search slot).
MAX_ID = np.iinfo(np.int64).max - 1


def first_few(values, limit: int = 5) -> str:
    """``values`` for an error message: the first ``limit``, then how many more."""
    values = [int(v) for v in np.asarray(values).ravel()]
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f" (and {len(values) - limit} more)" if len(values) > limit else "")


def assigned_ids(next_id: int, n: int) -> np.ndarray:
    """The ``n`` ids an index assigns from ``next_id`` (int64); an InvalidInput naming the limit
    when they would pass :data:`MAX_ID` (after an item was given an id near it: pass ids)."""
    if next_id + n - 1 > MAX_ID:
        raise InvalidInput(
            f"the index cannot assign {n} more ids: its next id is {next_id} and ids end at 2**63 - 2 ({MAX_ID}); pass the new items' ids"
        )
    return np.arange(next_id, next_id + n, dtype=np.int64)


def check_ids(ids, n: int | None = None, *, name: str = "ids") -> np.ndarray:
    """``ids`` as a 1-D int64 array of ids >= 0 without repeats (``n`` of them when given)."""
    array = np.asarray(ids)
    if array.ndim == 0:
        array = array.reshape(1)
    if array.size == 0 and array.dtype.kind not in "iu":
        array = array.astype(np.int64)
    if array.dtype.kind not in "iu" or array.dtype == np.bool_:
        if array.dtype.kind == "f" and np.all(np.isfinite(array)) and np.all(array == np.round(array)):
            if np.abs(array).max() >= 2**53:  # where floats stop holding every whole number (and int64 ends soon after)
                raise InvalidInput(f"{name} given as floats must be below 2**53 (whole numbers held exactly); pass integers for larger ids")
            array = array.astype(np.int64)
        else:
            raise InvalidType(f"{name} must be integers (int64 item ids); got {array.dtype} values")
    if array.ndim != 1:
        raise InvalidInput(f"{name} must be a flat list of item ids; got shape {array.shape}")
    if array.dtype == np.uint64 and array.size and array.max() > MAX_ID:
        raise InvalidInput(f"{name} must be at most 2**63 - 2 ({MAX_ID}); got {first_few(array[array > MAX_ID])}")
    array = array.astype(np.int64)
    if n is not None and array.size != n:
        raise InvalidInput(f"{name}: {array.size} ids for {n} items")
    if array.size and array.max() > MAX_ID:  # int64's largest: next_id (max id + 1) must stay an int64
        raise InvalidInput(f"{name} must be at most 2**63 - 2 ({MAX_ID}); got {first_few(array[array > MAX_ID])}")
    negative = array[array < 0]
    if negative.size:
        raise InvalidInput(f"{name} must be >= 0; got {first_few(negative)}")
    uniq, counts = np.unique(array, return_counts=True)
    if (counts > 1).any():
        raise InvalidInput(f"{name} repeat {first_few(uniq[counts > 1])}; each id may appear once")
    return array


class IdMap:
    """id -> physical row of a live index (see the module docstring). Immutable for the rows
    it was made with: :meth:`extended` returns a map that also knows later rows (sharing the
    base's arrays, and the dict when it only grows)."""

    def __init__(self, base_ids: np.ndarray) -> None:
        base_ids = np.asarray(base_ids, dtype=np.int64)
        self.n_base = base_ids.size
        if base_ids.size < 2 or bool(np.all(base_ids[1:] > base_ids[:-1])):
            self._sorted, self._rows = base_ids, None  # already in order (ids assigned in order): no copy
        else:
            order = np.argsort(base_ids, kind="stable")
            self._sorted, self._rows = base_ids[order], order
        self._tail = _Tail(self.n_base)

    def extended(self, start: int, ids: np.ndarray) -> IdMap:
        """A map that also maps ``ids`` to rows ``start, start + 1, ...`` (later rows win)."""
        new = object.__new__(IdMap)
        new.n_base, new._sorted, new._rows = self.n_base, self._sorted, self._rows
        items = dict(zip(ids.tolist(), range(start, start + ids.size)))
        if self._tail.end == start and not (items.keys() & self._tail.keys()):
            new._tail = self._tail  # only grows past every older map's rows: share the dict
        else:  # another map grew it already (a copy of the index), or an id moves: copy
            new._tail = _Tail(start, {k: v for k, v in self._tail.items() if v < start})
        new._tail.update(items)
        new._tail.end = start + ids.size
        return new

    def rows(self, ids: np.ndarray, n_rows: int) -> np.ndarray:
        """The latest row (< ``n_rows``) of each id, -1 for an id never seen there."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(ids.size, -1, dtype=np.int64)
        if self._sorted.size:
            at = np.searchsorted(self._sorted, ids)
            at = np.minimum(at, self._sorted.size - 1)
            found = self._sorted[at] == ids
            rows = at if self._rows is None else self._rows[at]
            out[found] = rows[found]
        if len(self._tail):
            tail = self._tail
            later = np.fromiter((tail.get(i, -1) for i in ids.tolist()), dtype=np.int64, count=ids.size)
            later[later >= n_rows] = -1
            out = np.where(later >= 0, later, out)
        return out


class _Tail(dict):
    """id -> row of the rows after the base; ``end``: the row after the last one it maps."""

    def __init__(self, end: int, items=()) -> None:
        super().__init__(items)
        self.end = end
