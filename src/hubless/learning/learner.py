"""An index that learns its query bank from the queries it answers: :class:`BankLearner`.

    learner = BankLearner(index, capacity=50_000, window=7 * 86400, every=5_000)
    learner.start()                                  # a background thread
    scores, ids = index.search(queries, 10)
    learner.observe(queries, client="10.0.0.7")      # O(batch): a copy onto a bounded queue
    ...
    learner.history                                  # every refit: kept or rejected, and why

The queries observed go into a :class:`~hubless.learning.reservoir.BankReservoir` (folded,
quota-limited, windowed; some held out). After ``every`` new bank queries, or ``interval``
seconds with some, the background thread refits the index on the reservoir's bank
(:mod:`hubless.learning.refit`: only the similarities of rows not seen yet are computed while
the items stay the same; on ``threads`` engine threads, 1 by default, beside the searches) into
a candidate version made aside (:func:`hubless.index.bank_swap.candidate`: searches go on with
the current version), judges it (:func:`hubless.learning.guard.judge`: the hubness of the
held-out queries, the largest relative bias move) and either adopts it as the index's next
version (one atomic switch) or keeps it as a rejected version that is never served. An index
opened from a directory keeps its versions (``keep_versions``, raised to ``min_versions`` if
lower), so each learned version stays restorable and searchable as of; an index in memory
adopts in memory. Every decision is appended to :attr:`history` and passed to
``on_decision`` (the service writes an audit line and updates its metrics).
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from hubless.errors import Conflict, HublessError, InvalidInput, message
from hubless.index import bank_swap
from hubless.learning.guard import GuardSettings, judge
from hubless.learning.refit import PartStatistics
from hubless.learning.reservoir import BankReservoir

__all__ = ["BankLearner", "lower_priority"]


class BankLearner:
    """Learn ``index``'s query bank from the queries it answers (see the module docstring).

    ``reservoir``: a :class:`BankReservoir` (default: one made with ``reservoir_options``:
    capacity, window, quota, fold, seed, seed_share, holdout, ...). ``every``: refit after this
    many new bank queries; ``interval``: or after this many seconds with at least one (None:
    only ``every``); ``min_bank``: the smallest bank a refit uses. ``guard``: the bounds of
    :func:`~hubless.learning.guard.judge`. ``write(change)``: how a change of the index is run
    (``change(index)``; the service passes its write lock); ``on_decision(record)``: called with
    every decision. ``threads``: engine threads of a refit; ``nice``: the background thread's
    scheduling priority (Linux, per thread; 19 the lowest): it takes the CPU the searches leave
    (measured on 2 cores: a refit beside single-query searches raised their p99 2.7x at the
    default priority, not at all at 19; ``benchmarks/traffic_bank.py``). ``min_versions``: the versions an
    index opened from a directory keeps at least. ``queue_rows``: queries waiting to be admitted
    at most (past it, observed queries are dropped and counted)."""

    def __init__(
        self,
        index,
        reservoir: BankReservoir | None = None,
        *,
        every: int = 5_000,
        interval: float | None = 3600.0,
        min_bank: int = 100,
        guard: GuardSettings | None = None,
        write: Callable[[Callable], Any] | None = None,
        on_decision: Callable[[dict], None] | None = None,
        threads: int | None = 1,
        nice: int | None = 19,
        min_versions: int = 10,
        queue_rows: int = 8192,
        keep_history: int = 256,
        name: str = "index",
        clock: Callable[[], float] = time.time,
        **reservoir_options,
    ) -> None:
        if every < 1 or min_bank < 1 or queue_rows < 1:
            raise InvalidInput("every, min_bank and queue_rows must be >= 1")
        if interval is not None and not interval > 0:
            raise InvalidInput(f"interval must be a positive number of seconds (or None); got {interval!r}")
        self.index, self.name, self.clock = index, name, clock
        self.guard = guard or GuardSettings()
        if not index.correction.needs_query_bank:
            raise InvalidInput(f"{index.method} uses no query bank: there is nothing to learn")
        if index.ntotal < self.guard.top_k:
            raise InvalidInput(f"the index has {index.ntotal} items: fewer than the top {self.guard.top_k} the guard measures")
        dim = int(index.info()["dim"])
        if reservoir is not None and reservoir_options:
            raise InvalidInput("give a reservoir or its options, not both")
        self.reservoir = reservoir if reservoir is not None else BankReservoir(dim, clock=clock, **reservoir_options)
        if self.reservoir.dim != dim:
            raise InvalidInput(f"the reservoir holds {self.reservoir.dim}-dimensional queries; the index {dim}-dimensional ones")
        self.every, self.interval, self.min_bank, self.queue_rows = every, interval, min_bank, queue_rows
        self.write = write or (lambda change: change(self.index))
        self.on_decision = on_decision
        self.threads, self.nice = threads, nice
        self.statistics = PartStatistics(threads)
        self.history: deque[dict] = deque(maxlen=keep_history)
        self.decisions: Counter = Counter()
        self.pending: deque = deque()
        self.pending_rows = self.dropped = 0
        self.lock = threading.Lock()  # the pending queue
        self.admitting = threading.Lock()  # one admitter at a time
        self.refitting = threading.Lock()  # one refit at a time
        self.last_refit = clock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        if index.storage()["path"] is not None and index.keep_versions < min_versions:
            self.write(lambda live: live.set_keep_versions(min_versions))

    # ------------------------------------------------------------------ traffic
    def observe(self, queries: np.ndarray, client: Hashable) -> None:
        """Queue ``queries`` (the (n, d) embeddings an index answered, as it validated them)
        sent by ``client``; admitted by the background thread or the next :meth:`step`. Never
        blocks on a refit; past ``queue_rows`` waiting, the queries are dropped (counted)."""
        rows = np.array(queries, dtype=np.float32, copy=True, ndmin=2)
        with self.lock:
            if self.pending_rows + rows.shape[0] > self.queue_rows:
                self.dropped += rows.shape[0]
                return
            self.pending.append((rows, client))
            self.pending_rows += rows.shape[0]
        self.wake.set()

    def admit(self) -> None:
        """Offer the queued queries to the reservoir (a batch leaves the queue once offered)."""
        with self.admitting:
            while True:
                with self.lock:
                    if not self.pending:
                        return
                    rows, client = self.pending[0]
                self.reservoir.offer(rows, client)
                with self.lock:
                    self.pending.popleft()
                    self.pending_rows -= rows.shape[0]

    def due(self) -> bool:
        """Whether a refit is due: ``every`` new bank queries, or ``interval`` seconds with some."""
        new = self.reservoir.new_rows
        if new >= self.every:
            return True
        return self.interval is not None and new > 0 and self.clock() - self.last_refit >= self.interval

    def step(self) -> dict | None:
        """Admit what is queued and refit if due; the decision, or None."""
        self.admit()
        return self.refit() if self.due() else None

    # ------------------------------------------------------------------ refits
    def refit(self) -> dict | None:
        """Refit now on the reservoir's bank, judge it and adopt or reject it; returns the
        decision (None when the bank or the held-out queries are too few to try)."""
        with self.refitting:
            return self._refit()

    def _refit(self) -> dict | None:
        t0 = time.perf_counter()
        parts = self.reservoir.parts()
        size = sum(p.n for p in parts)
        holdout = self.reservoir.holdout()
        if size < self.min_bank or holdout.shape[0] < self.guard.min_holdout:
            return None
        described = self.reservoir.describe()
        self.reservoir.mark_fitted()
        self.last_refit = self.clock()
        pinned = self.index.snapshot()  # the version refitted and judged against, held to the end
        before_version = self.index.storage()["version"]
        record: dict[str, Any] = {
            "time": _now(self.clock()),
            "unix": self.clock(),
            "from_version": before_version,
            "bank": {k: described[k] for k in ("size", "seed", "traffic", "clients", "oldest_age_s", "median_age_s", "newest_age_s")},
            "holdout": int(holdout.shape[0]),
        }
        phases: dict[str, float] = {}
        record["phases"] = phases  # seconds of each step: statistics, candidate, guard, commit
        try:
            with _engine_threads(self.threads):
                origin = bank_swap.version_of(pinned)
                with _timed(phases, "statistics"):
                    merged = self.statistics.merged(
                        origin, pinned.correction.gallery_, pinned.correction.statistics_request(), parts, self.reservoir.lock
                    )
                with _timed(phases, "candidate"):
                    made = bank_swap.candidate(pinned, merged.bank, merged.statistics)
                with _timed(phases, "guard"):
                    verdict = judge(pinned, made.index, holdout, made.origin_bias, made.bias, self.guard)
            record.update(computed_rows=merged.computed_rows, reused_rows=merged.reused_rows, **verdict.to_dict())
            with _timed(phases, "commit"):
                if verdict.accepted:
                    record["version"] = self.write(lambda live: bank_swap.adopt(live, made))
                    self.statistics.rebind(made.version)  # the adopted version has the same items: the parts' statistics hold
                    record["decision"] = "accepted"
                else:
                    record["version"] = self.write(lambda live: bank_swap.keep_rejected(live, made))
                    record["decision"] = "rejected"
        except Conflict as exc:  # a write to the index meanwhile: the next refit starts from it
            self.statistics.clear()
            record.update(decision="superseded", reasons=[message(exc)])
        except HublessError as exc:
            record.update(decision="failed", reasons=[message(exc)])
        record["seconds"] = time.perf_counter() - t0
        self.history.append(record)
        self.decisions[record["decision"]] += 1
        if self.on_decision is not None:
            self.on_decision(record)
        return record

    # ------------------------------------------------------------------ the thread
    def start(self, poll: float = 1.0) -> BankLearner:
        """Admit and refit in a background thread (a daemon), waking on new queries or every
        ``poll`` seconds."""
        if self.thread is not None and self.thread.is_alive():
            return self
        self.stopping.clear()
        self.thread = threading.Thread(target=self._run, args=(poll,), name=f"hubless-bank-{self.name}", daemon=True)
        self.thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop the background thread (a refit under way is finished first)."""
        self.stopping.set()
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout)
            self.thread = None

    def _run(self, poll: float) -> None:
        import sys

        lower_priority(self.nice)
        while not self.stopping.is_set():
            self.wake.wait(poll)
            self.wake.clear()
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - the thread must outlive one failure; it is reported
                print(f"hubless: learning the bank of {self.name!r} failed: {type(exc).__name__}: {exc}", file=sys.stderr)

    # ------------------------------------------------------------------ what it did
    def reset(self) -> dict:
        """Forget every query learned so far (the reservoir keeps its seed) and what is queued.
        The index keeps its current version: restore an earlier one to serve its bank again."""
        with self.admitting, self.lock:
            self.pending.clear()
            self.pending_rows = 0
        with self.refitting:
            self.reservoir.reset()
            self.statistics.clear()
        return self.reservoir.describe()

    def status(self) -> dict:
        """The reservoir, the queue, the decisions so far and their history (oldest first)."""
        with self.lock:
            queued, dropped = self.pending_rows, self.dropped
        return {
            "reservoir": self.reservoir.describe(),
            "queued": queued,
            "dropped": dropped,
            "every": self.every,
            "interval_s": self.interval,
            "guard": self.guard.to_dict(),
            "decisions": dict(self.decisions),
            "history": list(self.history),
        }


def lower_priority(nice: int | None) -> None:
    """Run the calling thread at scheduling priority ``nice`` (Linux sets it per thread; a
    thread may always lower its own priority); elsewhere, or with None, nothing changes. The
    engine's products run on the calling thread when a refit uses one thread, so they follow."""
    import os

    if nice is None or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), int(nice))


@contextlib.contextmanager
def _engine_threads(threads: int | None):
    """The refit's similarities, products and FAISS searches on ``threads`` threads."""
    from hubless.engine.parallel import one_blas_thread, use_threads

    with use_threads(threads), one_blas_thread() if threads == 1 else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def _timed(phases: dict[str, float], name: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = time.perf_counter() - start


def _now(unix: float) -> str:
    return datetime.datetime.fromtimestamp(unix, datetime.timezone.utc).isoformat(timespec="seconds")
