"""An embedding source whose first read kills the process reading it (a Ray worker lost mid-run);
used by tests/test_distributed_fit.py in a driver process of its own."""

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
