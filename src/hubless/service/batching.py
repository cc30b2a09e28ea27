"""Concurrent searches of one index run as batches (:class:`Batcher`)."""

from __future__ import annotations

import os
import threading

import numpy as np

__all__ = ["Batcher", "omp_threads_for"]

#: Below this many queries a search runs its FAISS part on the calling thread alone: one query
#: gains nothing from a thread team, and on a small machine the team's spinning threads take
#: the cores the server's event loop needs (measured: a worker thread's single-query IVF search
#: took ~1 ms more with the default team than with one thread, on 2 cores).
SMALL_BATCH = 8


def omp_threads_for(rows: int) -> None:
    """Set the calling thread's OpenMP team size (a per-thread setting) for a search of ``rows``
    queries: 1 for small batches, every core for large ones."""
    try:
        import faiss
    except ImportError:  # pragma: no cover - faiss is a core dependency
        return
    faiss.omp_set_num_threads(1 if rows < SMALL_BATCH else (os.cpu_count() or 1))


class _Pending:
    """One request's queries waiting in a :class:`Batcher`."""

    def __init__(self, index, queries: np.ndarray, key: tuple, weight: dict) -> None:
        self.index, self.queries, self.key, self.weight = index, queries, key, weight
        self.result: tuple[np.ndarray, np.ndarray] | None = None
        self.error: Exception | None = None
        self.done = False


class Batcher:
    """Concurrent searches of one index run as batches: one search at a time, and while it
    runs the requests that arrive queue up; the next search takes every queued request with the
    same parameters at once (up to ``max_rows`` queries). No request ever waits for a timer: a
    lone request is searched at once, and under load batches grow by themselves. Against a Flat
    gallery a batch of 32 reads the gallery once where 32 single queries read it 32 times.
    Each request's queries are validated before they queue, so one bad request never fails the
    others."""

    def __init__(self, max_rows: int = 256) -> None:
        self.max_rows = max_rows
        self.cond = threading.Condition()
        self.queue: list[_Pending] = []
        self.busy = False

    def search(self, index, queries: np.ndarray, top_k: int, weight: dict):
        mine = _Pending(index, queries, (id(index), top_k, tuple(sorted(weight.items()))), weight)
        with self.cond:
            self.queue.append(mine)
            while not mine.done:
                if self.busy:
                    self.cond.wait()
                    continue
                self.busy = True  # this thread runs the next batch (which may or may not hold its own request)
                batch: list[_Pending] = []
                rows = 0
                for item in list(self.queue):
                    if item.key == self.queue[0].key and (not batch or rows + item.queries.shape[0] <= self.max_rows):
                        batch.append(item)
                        rows += item.queries.shape[0]
                for item in batch:
                    self.queue.remove(item)
                self.cond.release()
                try:
                    self._run(batch)
                finally:
                    self.cond.acquire()
                    self.busy = False
                    self.cond.notify_all()
        if mine.error is not None:
            raise mine.error
        return mine.result

    @staticmethod
    def _run(batch: list[_Pending]) -> None:
        first = batch[0]
        try:
            omp_threads_for(sum(p.queries.shape[0] for p in batch))
            scores, ids = first.index.search(np.concatenate([p.queries for p in batch]), first.key[1], **first.weight)
            start = 0
            for p in batch:
                n = p.queries.shape[0]
                p.result = (scores[start : start + n], ids[start : start + n])
                start += n
        except Exception as exc:  # noqa: BLE001 - handed to every request of the batch
            for p in batch:
                p.error = exc
        for p in batch:
            p.done = True
