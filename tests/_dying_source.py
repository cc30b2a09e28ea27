"""Embedding sources that fail the way machines do, for tests/test_distributed_fit.py (run in a
driver process of their own): one kills the worker reading it, one is slow after its first rows."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hubless.distributed.sources import EmbeddingSource


@dataclass(frozen=True)
class DiesOnce(EmbeddingSource):
    marker: str = ""

    def read(self, start, stop):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(1)
        return super().read(start, stop)


@dataclass(frozen=True)
class SlowAfterFirst(EmbeddingSource):
    """Reads rows [0, fast_rows) at once and anything else after ``delay`` seconds: a fit whose
    first tiles finish while the others are still running (to be killed mid-run)."""

    fast_rows: int = 0
    delay: float = 0.0

    def read(self, start, stop):
        if start >= self.fast_rows:
            import time

            time.sleep(self.delay)
        return super().read(start, stop)
