"""Embedding sources that fail the way machines do, for tests/distributed/test_distributed_fit.py (run in a
driver process of their own): one kills the worker reading it, one is slow after its first rows."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hubless.storage.sources import EmbeddingSource


@dataclass(frozen=True)
class DiesOnce(EmbeddingSource):
    marker: str = ""

    def read(self, start, stop, **options):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return super().read(start, stop, **options)


@dataclass(frozen=True)
class SlowAfterFirst(EmbeddingSource):
    """The first ``fast_reads`` reads (counted across worker processes with marker files
    ``counter.0``, ``counter.1``, ...) return at once, later ones after ``delay`` seconds: a fit
    whose first tiles finish while the others are still running (to be killed mid-run)."""

    fast_reads: int = 0
    counter: str = ""
    delay: float = 0.0

    def read(self, start, stop, **options):
        for i in range(self.fast_reads):
            try:
                os.close(os.open(f"{self.counter}.{i}", os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                continue
            return super().read(start, stop, **options)
        import time

        time.sleep(self.delay)
        return super().read(start, stop, **options)


@dataclass(frozen=True)
class FailsOnRows(EmbeddingSource):
    """Refuses to read exactly rows ``[start, stop)`` (as a disk error would): a job that stops
    after its other pieces are written."""

    fail_start: int = 0
    fail_stop: int = 0

    def read(self, start, stop, **options):
        if (start, stop) == (self.fail_start, self.fail_stop):
            raise OSError(f"rows [{start}, {stop}) could not be read")
        return super().read(start, stop, **options)
