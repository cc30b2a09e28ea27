"""What one application serves, held in ``app.state.service`` (:class:`ServiceState`): a
:class:`hubless.search.Searcher` over the indexes (it encodes, searches, compares, reranks), the
settings, the telemetry (its Prometheus metrics), and per index a :class:`Served` (its write
lock, its search batcher, its cached bank hubness, the sketch of its served hubness, its bank
learner with ``--learn-bank``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from hubless.errors import Busy
from hubless.search import Searcher
from hubless.service.batching import Batcher
from hubless.service.hubness import ServedSketch
from hubless.service.settings import Settings
from hubless.service.telemetry import Telemetry

__all__ = ["Served", "ServiceState"]


class Served:
    """One served index. A saved index is served opened live (:meth:`hubless.Index.open`): a
    write is committed at once as one segment under the index's file lock (other processes may
    write it too: the write first catches up with what they committed), and versions written
    elsewhere are picked up by a cheap check of ``CURRENT`` whenever the index is read here
    (:meth:`hubless.Index.refresh`). A search holds one version (a snapshot) from start to end,
    so it never sees a half-applied write. A write waits at most ``lock_timeout`` seconds for
    the lock, then fails with :class:`hubless.errors.Busy` (503 with Retry-After)."""

    def __init__(self, name: str, searcher: Searcher, lock_timeout: float = 5.0) -> None:
        self.name, self.searcher, self.lock_timeout = name, searcher, lock_timeout
        self.write_lock = threading.Lock()  # one writer per served index in this process
        self.hubness = None
        self.batcher = Batcher()
        self.sketch = ServedSketch(searcher.index(name).ntotal)
        self.learner: Any = None  # a hubless.learning.BankLearner with --learn-bank (set by hubless.service.learning)

    @property
    def index(self):
        index = self.searcher.index(self.name)
        index.refresh()  # one stat of CURRENT; reads only what other processes wrote since
        return index

    @property
    def path(self):
        return self.searcher.paths[self.name]

    def run(self, index, queries, top_k: int, *, learn_from: str | None = None, **options):
        """The corrected search, batched with concurrent requests (the searcher's ``runner``),
        its results counted in the served-hubness sketch. ``learn_from``: the client that sent
        ``queries``, whose embeddings go to the bank learner (``--learn-bank``): the one place
        the service taps the queries it answers (None: not learned, e.g. an item query)."""
        scores, ids = self.batcher.search(index, queries, top_k, options)
        self.sketch.add(ids, index.ntotal)
        if learn_from is not None and self.learner is not None:
            self.learner.observe(queries, learn_from)
        return scores, ids

    def write(self, change):
        """Apply ``change(index)`` (e.g. ``index.add(...)``, which returns the new items' ids)
        and return what it returned: committed at once for a saved index (under its file lock);
        an index served from memory changes in memory."""
        if not self.write_lock.acquire(timeout=self.lock_timeout):
            raise Busy(f"index {self.name!r} is being written by another request; retry in a moment")
        try:
            index = self.searcher.index(self.name)
            index.lock_timeout = self.lock_timeout
            return change(index)
        finally:
            self.write_lock.release()


@dataclass
class ServiceState:
    """Everything the routes read, set once by :func:`hubless.service.create_app`.
    ``query_problems``: index name -> why text/image queries are off for it (None: on)."""

    searcher: Searcher
    settings: Settings = field(default_factory=Settings)
    telemetry: Telemetry = field(default_factory=Telemetry)
    query_problems: dict[str, str | None] = field(default_factory=dict)
    write_log: Any = None  # a WriteLog when one is configured (hubless serve --audit-log)
    served: dict[str, Served] = field(init=False)
    body_shape: Any = field(init=False)  # a hubless.service.body.BodyShape

    def __post_init__(self) -> None:
        from hubless.service.body import BodyShape

        self.served = {name: Served(name, self.searcher, self.settings.lock_timeout) for name in self.searcher.names}
        max_dim = max((int(self.searcher.index(name).info()["dim"]) for name in self.served), default=1)
        self.body_shape = BodyShape(self.settings.limits, max_dim)
        if self.settings.audit_log is not None and self.write_log is None:
            from hubless.service.write_log import WriteLog

            self.write_log = WriteLog(self.settings.audit_log)

    @property
    def learners(self) -> dict:
        """Index name -> its bank learner (``--learn-bank``)."""
        return {name: s.learner for name, s in self.served.items() if s.learner is not None}

    @property
    def limits(self):
        return self.settings.limits
