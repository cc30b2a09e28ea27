"""Concurrent searches of one index run as batches (:class:`Batcher`)."""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["Batcher"]


class _Pending:
    """One request's queries waiting in a :class:`Batcher`."""

    def __init__(self, index, queries: np.ndarray, key: tuple, weight: dict) -> None:
        self.index, self.queries, self.key, self.weight = index, queries, key, weight
        self.result = self.error = None
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
                batch, rows = [], 0
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
