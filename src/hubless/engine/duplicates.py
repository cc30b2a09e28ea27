"""Exact duplicate rows, found once, so that every copy scores as its first copy does.

A BLAS rounds the product of one row with a block differently in the last bit depending on
where the row falls in its kernel's blocking: two exact copies of a gallery item tie on one CPU
and not on another (OpenBLAS's Sandybridge kernel kept the copies of a test gallery tied, its
Haswell and Zen kernels did not, and a ranking broke the "tie" by last bits), and a torch
device rounds them otherwise again. Real galleries hold exact duplicates (COCO, Flickr30k,
LAION all do), so hubless settles every such tie by one rule that needs no last bit: **each
copy takes its first copy's score** (the first copy: the lowest index of a group of equal rows),
so copies tie exactly and, like any tie, go to the lower index. The rule is applied where
scores are made:

* the ranking pass of the evaluation (:func:`hubless.evaluation.core.rank_queries`, on numpy and
  on a torch device) copies the first copy's column of each block of similarities into its
  copies' columns (:meth:`Duplicates.fill_columns`; each block spans the whole gallery);
* exact search (:func:`hubless.engine.exact_search`, :meth:`hubless.Correction.search`) leaves
  the copies out of its top-k (:meth:`Duplicates.column_mask`) and puts each one back right after
  its first copy with its first copy's score (:meth:`Duplicates.expand_top_k`), whatever block of
  columns the copies fall into; :meth:`hubless.Correction.score` copies the columns of its dense
  matrix;
* the bank statistics give a copy its first copy's per-item statistics (:meth:`Duplicates.spread`:
  top-k, log-sum-exps, probes, so copies get identical biases) and relabel each bank item's
  nearest gallery items so that copies come in index order (:meth:`Duplicates.relabel_top_k`).

Finding them costs one pass over the rows (:func:`find_duplicates`): each row's float32 bits
(with -0.0 read as +0.0, since the two are equal) are hashed by a multiply-and-add over 64-bit
integers (exact: no floating-point rounding), and only rows whose hash repeats are compared
byte for byte; measured 12 ms for 20,000 x 256 rows, against 1.4 s for the product of 2,000
queries with them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["Duplicates", "find_duplicates", "NO_DUPLICATES", "row_hashes"]

#: Rows hashed per step of :func:`find_duplicates` (bounds its temporaries, about 8 MiB).
HASH_ELEMENTS = 1 << 20

#: The multipliers of the row hash: fixed odd 64-bit integers (one per column, cycled), so a hash
#: is the same in every process (the byte comparison decides anyway).
_MULTIPLIERS = np.random.default_rng(0x6875626C657373).integers(1, 2**63, size=4096, dtype=np.uint64) | np.uint64(1)


@dataclass(frozen=True, eq=False)
class Duplicates:
    """The exact duplicate rows of an array of ``n`` rows: ``copies`` (sorted int64), the rows
    equal to an earlier row, and ``firsts``, the first (lowest) row equal to each. Every row
    that is not a copy is its own first copy. Falsy when there are none."""

    n: int
    copies: np.ndarray
    firsts: np.ndarray

    def __bool__(self) -> bool:
        return self.copies.size > 0

    def __len__(self) -> int:
        return int(self.copies.size)

    def first_of(self, ids: np.ndarray) -> np.ndarray:
        """The first copy of each of ``ids`` (an id that is no copy is its own); ids outside
        [0, n) (an unfilled slot) are kept as they are."""
        ids = np.asarray(ids, dtype=np.int64)
        if not self:
            return ids
        at = np.minimum(np.searchsorted(self.copies, ids), self.copies.size - 1)
        return np.where(self.copies[at] == ids, self.firsts[at], ids)

    @functools.cached_property
    def groups(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The groups of equal rows that have copies: ``(heads, indptr, rows)``, each head (a
        first copy, sorted) with its rows ``rows[indptr[i]:indptr[i + 1]]`` in index order, the
        head first (worked out once, on first use)."""
        order = np.lexsort((self.copies, self.firsts))
        heads, starts, counts = np.unique(self.firsts[order], return_index=True, return_counts=True)
        indptr = np.zeros(heads.size + 1, dtype=np.int64)
        np.cumsum(counts + 1, out=indptr[1:])
        rows = np.empty(indptr[-1], dtype=np.int64)
        rows[indptr[:-1]] = heads
        tail = np.ones(rows.size, dtype=bool)
        tail[indptr[:-1]] = False
        rows[tail] = self.copies[order]
        return heads, indptr, rows

    # ------------------------------------------------------------------ blocks of scores
    def fill_columns(self, block) -> None:
        """Give every copy's column of ``block`` (rows x all ``n`` columns; a numpy array or a
        torch tensor with ``copies``/``firsts`` as its index tensors via :meth:`on`) its first
        copy's column, in place."""
        if self:
            block[:, self.copies] = block[:, self.firsts]

    def column_mask(self, c0: int, c1: int) -> np.ndarray:
        """The copies among columns [c0, c1), as positions in that block (int64)."""
        lo, hi = np.searchsorted(self.copies, (c0, c1))
        return self.copies[lo:hi] - c0

    def spread(self, values: np.ndarray) -> np.ndarray:
        """``values`` (one entry or row per item) with every copy's entry its first copy's:
        ``values`` itself when that holds already, else a changed copy."""
        if not self or np.array_equal(values[self.copies], values[self.firsts]):
            return values
        out = values.copy()
        out[self.copies] = values[self.firsts]
        return out

    # ------------------------------------------------------------------ top-k lists
    def expand_top_k(self, values: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` lists with the copies put back: ``(values, ids)`` (rows x any width, best
        first, ties to the lower id) were taken with every copy left out (entries of copies in
        them, masked, are dropped); each first copy's copies join it with its value, and each
        row is ordered by (value descending, id ascending) and cut to ``k``. That is exactly the
        top-k of scores where every copy has its first copy's score: a group's first copy ranks
        before its copies, so every group in that top-k has its first copy in the lists."""
        if not self:
            return values[:, :k], ids[:, :k]
        heads, indptr, rows = self.groups
        group_size = np.diff(indptr)
        n_rows, width = ids.shape
        out_values = np.full((n_rows, k), -np.inf, dtype=values.dtype)
        out_ids = np.full((n_rows, k), np.iinfo(np.int64).max, dtype=np.int64)
        step = max(1, (1 << 22) // max(1, width * min(k, int(group_size.max()))))
        for r0 in range(0, n_rows, step):
            v, i = values[r0 : r0 + step].ravel(), ids[r0 : r0 + step].ravel()
            at = np.minimum(np.searchsorted(heads, i), heads.size - 1)
            size = np.where(heads[at] == i, np.minimum(group_size[at], k), 1)
            size[self.first_of(i) != i] = 0  # a copy: it was left out of the search
            entry = np.repeat(np.arange(i.size), size)
            offset = np.arange(entry.size) - np.repeat(np.cumsum(size) - size, size)  # 0: the entry, 1..: its copies
            new_ids = np.where(offset == 0, i[entry], rows[indptr[at[entry]] + offset])
            new_values = v[entry]
            row_of = entry // width
            order = np.lexsort((new_ids, -new_values.astype(np.float64), row_of))
            counts = np.bincount(row_of, minlength=-(-i.size // width))
            position = np.arange(order.size) - np.repeat(np.cumsum(counts) - counts, counts)
            keep = order[position < k]
            out_values[r0 + row_of[keep], position[position < k]] = new_values[keep]
            out_ids[r0 + row_of[keep], position[position < k]] = new_ids[keep]
        return out_values, out_ids

    def relabel_top_k(self, values: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Top-k lists ``(values, ids)`` taken with the copies competing (each bank item's nearest
        gallery items), relabelled as if every copy had its first copy's score: in each row the
        entries of one group of equal rows become the group's lowest rows in index order, all
        with the group's best value there, and the row is ordered by (value descending, id
        ascending). ``(values, ids)`` themselves when no entry belongs to a group. (Only a value
        from another item within the last bits of a group's could fall between its entries:
        then no rule could order them alike on every machine.)"""
        if not self or not ids.size:
            return values, ids
        heads, indptr, rows = self.groups
        flat_ids, flat_values = ids.ravel(), values.ravel()
        root = self.first_of(flat_ids)
        at = np.minimum(np.searchsorted(heads, root), heads.size - 1)
        grouped = np.flatnonzero((heads[at] == root) & (flat_ids >= 0) & (flat_ids < self.n))
        if not grouped.size:
            return values, ids
        width = ids.shape[1]
        row_of = grouped // width
        order = grouped[np.lexsort((grouped, root[grouped], row_of))]  # by row, group, position
        run = np.ones(order.size, dtype=bool)
        run[1:] = (root[order][1:] != root[order][:-1]) | (order[1:] // width != order[:-1] // width)
        starts = np.flatnonzero(run)
        lengths = np.diff(np.append(starts, order.size))
        rank = np.arange(order.size) - np.repeat(starts, lengths)  # 0, 1, ... within a group's entries of a row
        new_ids, new_values = flat_ids.copy(), flat_values.copy()
        new_ids[order] = rows[indptr[at[order]] + rank]
        new_values[order] = np.repeat(np.maximum.reduceat(flat_values[order], starts), lengths)
        new_ids, new_values = new_ids.reshape(ids.shape), new_values.reshape(values.shape)
        resort = np.lexsort((new_ids, -new_values.astype(np.float64)), axis=1)
        return np.take_along_axis(new_values, resort, axis=1), np.take_along_axis(new_ids, resort, axis=1)


#: The duplicates of an array without any (or of rows without coordinates).
NO_DUPLICATES = Duplicates(0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))


def row_hashes(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row of ``rows`` (n, d) float32, uint64: equal rows (-0.0 equal to
    +0.0) always get equal hashes, on any machine and wherever they sit (integer arithmetic,
    no rounding: sum_j bits(x_j) * m_j mod 2^64 with fixed odd multipliers m_j); unequal rows
    rarely do, so an equal hash is confirmed by comparing the rows."""
    rows = np.asarray(rows, dtype=np.float32)
    n, d = rows.shape
    multipliers = np.resize(_MULTIPLIERS, d)
    hashes = np.empty(n, dtype=np.uint64)
    step = max(1, HASH_ELEMENTS // max(1, d))
    for s in range(0, n, step):
        bits = (rows[s : s + step] + np.float32(0)).view(np.uint32)  # -0.0 + 0 is +0.0: equal rows, equal bits
        hashes[s : s + step] = (bits * multipliers).sum(axis=1)  # uint64 wraps: a hash mod 2^64
    return hashes


def find_duplicates(rows: np.ndarray) -> Duplicates:
    """The exact duplicate rows of ``rows`` (n, d) float32 (equal values: -0.0 equals +0.0),
    in one pass over them (see the module docstring). Rows of no coordinates (d = 0, a
    correction fitted on score matrices) have none."""
    n = rows.shape[0]
    if n < 2 or rows.ndim != 2 or rows.shape[1] == 0:
        return Duplicates(n, NO_DUPLICATES.copies, NO_DUPLICATES.firsts)
    d = rows.shape[1]
    hashes = row_hashes(rows)
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    repeated = np.zeros(n, dtype=bool)
    same = sorted_hashes[1:] == sorted_hashes[:-1]
    repeated[1:] |= same
    repeated[:-1] |= same
    candidates = np.sort(order[repeated])
    if not candidates.size:
        return Duplicates(n, NO_DUPLICATES.copies, NO_DUPLICATES.firsts)
    exact = np.ascontiguousarray(rows[candidates] + np.float32(0)).view(np.dtype((np.void, 4 * d))).ravel()
    _, first_at, group = np.unique(exact, return_index=True, return_inverse=True)  # first occurrence: the lowest row
    firsts = candidates[first_at[group.ravel()]]
    is_copy = firsts != candidates
    return Duplicates(n, candidates[is_copy], firsts[is_copy])
