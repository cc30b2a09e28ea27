"""Append-only row buffers: what lets a live index add rows in O(batch).

A :class:`Growable` holds rows in an array with spare capacity (doubling, as a vector does), so
appending ``b`` rows costs O(b) amortised instead of the O(n) copy of ``np.concatenate``.
Snapshots of a live index hold *views* of the first ``n`` rows; appending writes only past
every view a snapshot holds, so a search reading an older snapshot never sees the change.

Two owners never write the same slots: :meth:`Growable.extended` appends in place only when
the caller's length is the buffer's current end (it extends the newest snapshot); otherwise
(a copy of the index grows too, or an earlier write failed after appending) it copies the
caller's rows into a new buffer first.
"""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["Growable"]


class Growable:
    """Rows of one dtype and trailing shape, appended in amortised O(batch)."""

    def __init__(self, rows: np.ndarray, *, spare: float = 0.25) -> None:
        rows = np.asarray(rows)
        capacity = max(16, int(rows.shape[0] * (1 + spare)))
        self._data = np.empty((capacity, *rows.shape[1:]), dtype=rows.dtype)
        self._data[: rows.shape[0]] = rows
        self.length = rows.shape[0]
        self._lock = threading.Lock()

    @property
    def dtype(self):
        return self._data.dtype

    def view(self, n: int | None = None) -> np.ndarray:
        """The first ``n`` rows (default: all), as a view that later appends never change."""
        return self._data[: self.length if n is None else n]

    def extended(self, n: int, rows: np.ndarray) -> tuple[Growable, np.ndarray]:
        """``rows`` appended after the first ``n`` rows: ``(buffer, view of all n + b rows)``.
        The buffer is ``self`` when ``n`` is its end (appended in place, amortised O(b)), else
        a new buffer holding a copy of the first ``n`` rows (never overwrites rows that a view
        of ``self`` may show)."""
        rows = np.asarray(rows, dtype=self._data.dtype)
        with self._lock:
            if n == self.length:
                if n + rows.shape[0] > self._data.shape[0]:
                    grown = np.empty((max(2 * self._data.shape[0], n + rows.shape[0]), *self._data.shape[1:]), self._data.dtype)
                    grown[:n] = self._data[:n]
                    self._data = grown  # old views keep the old array alive
                self._data[n : n + rows.shape[0]] = rows
                self.length = n + rows.shape[0]
                return self, self._data[: self.length]
        fresh = Growable(np.concatenate([self._data[:n], rows]))
        return fresh, fresh.view()
