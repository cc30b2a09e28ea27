"""What one application serves: the indexes (each a :class:`Served`), the encoder, the
reranker, the settings and the metrics, held in ``app.state.service`` (:class:`ServiceState`)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hubless.errors import InvalidInput
from hubless.service.batching import Batcher
from hubless.service.metrics import Metrics
from hubless.service.settings import Limits

__all__ = ["Served", "ServiceState", "load_served"]


class Served:
    """One served index. ``index`` is replaced whole, never mutated: a write updates a fresh
    copy (loaded from disk under the index's write lock), saves it, then swaps it in, so a search
    sees the old or the new version, never a half-updated one."""

    def __init__(self, name: str, path: Path | None, index) -> None:
        self.name, self.path, self.index = name, path, index
        self.write_lock = threading.Lock()  # one writer per served index in this process
        self.hubness = None
        self.batcher = Batcher()

    def write(self, change) -> None:
        from hubless.index import Index

        with self.write_lock:
            if self.path is None:  # served from memory: update a copy
                updated = self.index.copy()
                change(updated)
            else:  # the saved index, under its file lock (other processes may write it too)
                with Index.update(self.path) as updated:
                    change(updated)
            self.index = updated


def load_served(indexes: Mapping[str, Any]) -> dict[str, Served]:
    """name -> :class:`Served` from name -> saved index directory or :class:`hubless.Index`."""
    from hubless.index import Index

    if not indexes:
        raise InvalidInput("give at least one index to serve")
    served = {}
    for name, value in indexes.items():
        if isinstance(value, Index):
            served[name] = Served(name, None, value)
        else:
            served[name] = Served(name, Path(value), Index.load(value))
    return served


@dataclass
class ServiceState:
    """Everything the routes read, set once by :func:`hubless.service.create_app`."""

    served: dict[str, Served]
    encoder: Any = None
    reranker: Any = None
    rerank_k: int = 20
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    writes: bool = True
    metrics: Metrics = field(default_factory=Metrics)
