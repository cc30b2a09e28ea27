"""What one application serves, held in ``app.state.service`` (:class:`ServiceState`): a
:class:`hubless.search.Searcher` over the indexes (it encodes, searches, compares, reranks), and
per index a :class:`Served` (its write lock, its search batcher, its cached hubness figures)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from hubless.search import Searcher
from hubless.service.batching import Batcher
from hubless.service.metrics import Metrics
from hubless.service.settings import Limits

__all__ = ["Served", "ServiceState"]


class Served:
    """One served index. Its versions live in the searcher and are replaced whole, never
    mutated: a write updates a fresh copy (loaded from disk under the index's write lock), saves
    it, then swaps it in, so a search sees the old or the new version, never a half-updated one."""

    def __init__(self, name: str, searcher: Searcher) -> None:
        self.name, self.searcher = name, searcher
        self.write_lock = threading.Lock()  # one writer per served index in this process
        self.hubness = None
        self.batcher = Batcher()

    @property
    def index(self):
        return self.searcher.index(self.name)

    @property
    def path(self):
        return self.searcher.paths[self.name]

    def run(self, index, queries, top_k: int, **options):
        """The corrected search, batched with concurrent requests (the searcher's ``runner``)."""
        return self.batcher.search(index, queries, top_k, options)

    def write(self, change) -> None:
        from hubless.index import Index

        with self.write_lock:
            if self.path is None:  # served from memory: update a copy
                updated = self.index.copy()
                change(updated)
            else:  # the saved index, under its file lock (other processes may write it too)
                with Index.update(self.path) as updated:
                    change(updated)
            self.searcher.replace(self.name, updated)


@dataclass
class ServiceState:
    """Everything the routes read, set once by :func:`hubless.service.create_app`.
    ``query_problems``: index name -> why text/image queries are off for it (None: on)."""

    searcher: Searcher
    limits: Limits = field(default_factory=Limits)
    api_key: str | None = None
    writes: bool = True
    metrics: Metrics = field(default_factory=Metrics)
    query_problems: dict[str, str | None] = field(default_factory=dict)
    served: dict[str, Served] = field(init=False)

    def __post_init__(self) -> None:
        self.served = {name: Served(name, self.searcher) for name in self.searcher.names}
