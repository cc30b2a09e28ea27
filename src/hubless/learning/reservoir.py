"""A bounded bank of the query embeddings an index answers: :class:`BankReservoir`.

Every correction hubless serves is fitted on a reference query bank; the natural one for a
deployed search is the queries people send (QB-Norm, Bogolin et al. 2022, Table 2: a bank from
another domain costs accuracy, an adversarial one more). The reservoir keeps such a bank, and
only embeddings: never the text or image a query came from. What it admits, keeps and drops:

* **near-duplicate folding**: a query whose cosine with one already kept (bank or held out) is
  at least ``fold`` is not admitted, so a flood of one query counts once
  (:class:`~hubless.learning.folding.NearDuplicates`: O(batch), whatever the size kept);
* **per-client quota**: a client (the service's choice of identity: the client address) may
  hold at most ``quota`` x ``capacity`` of the bank (and the same share of the held-out set);
  beyond it, its queries are refused until some of its own leave;
* **held out**: a share ``holdout`` of the admitted queries (chosen at random, seeded) is never
  put into the bank: the most recent ``holdout_capacity`` of them are the queries a refit's
  guard measures hubness on (:mod:`hubless.learning.guard`);
* **capacity**: at most ``capacity`` bank rows; past it the oldest go first (the displaceable
  part of the seed, then the oldest traffic);
* **time window**: no query older than ``window`` seconds is kept (bank and held out); the bank
  is kept in *parts* of at most ``capacity / 8`` rows spanning at most ``window / 8`` seconds,
  dropped whole once their oldest query passes the window (so some queries leave up to an
  eighth of the window early, none late);
* **seed**: an optional bank to start from, of which ``seed_share`` x ``capacity`` rows (a seeded
  random sample) are never displaced; the rest is displaced by traffic before any traffic is.

The bank is returned in parts (:meth:`parts`: the seed's, then the traffic's, oldest first): a
part only grows or goes away, so a refit computes statistics only for rows it has not seen
(:mod:`hubless.learning.refit`). Thread-safe (one lock); ``clock`` (seconds) is injectable.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from hubless._validation import as_embeddings, check_positive_int
from hubless.errors import InvalidInput
from hubless.learning.folding import NearDuplicates

__all__ = ["BankReservoir", "Offered", "Part"]

#: A bank part holds at most capacity / PARTS rows and spans at most window / PARTS seconds.
PARTS = 8


@dataclass
class Part:
    """One part of the bank: ``vectors[:n]`` (a growing part's buffer is longer), the client and
    time of each row (None and the start time for the seed), and the rows' fold keys. ``id`` is
    never reused; a part only grows (the newest traffic part) or is dropped whole."""

    id: int
    kind: str  # "seed" (never displaced), "seed-extra" (displaced first) or "traffic"
    vectors: np.ndarray
    n: int = 0
    clients: list = field(default_factory=list)
    times: list = field(default_factory=list)
    keys: list = field(default_factory=list)

    @property
    def rows(self) -> np.ndarray:
        return self.vectors[: self.n]


@dataclass
class Offered:
    """What became of a batch of queries offered to the reservoir."""

    admitted: int = 0  # into the bank
    held_out: int = 0  # into the held-out set
    folded: int = 0  # near duplicates of a query kept
    over_quota: int = 0  # their client held its share already

    def add(self, other: Offered) -> None:
        for name in ("admitted", "held_out", "folded", "over_quota"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def to_dict(self) -> dict[str, int]:
        return {"admitted": self.admitted, "held_out": self.held_out, "folded": self.folded, "over_quota": self.over_quota}


class BankReservoir:
    """A bounded, windowed, quota-limited bank of query embeddings (see the module docstring).

    ``dim``: the embeddings' dimension. ``capacity``: bank rows kept at most. ``window``:
    seconds a query is kept at most (None: no limit). ``quota``: the share of ``capacity`` one
    client may hold (None: no quota). ``fold``: the cosine at which a query folds into one kept
    (None: no folding). ``seed``: an (n, dim) bank to start from, ``seed_share`` x ``capacity``
    rows of it never displaced. ``holdout``: the share of admitted queries held out (0: none),
    the latest ``holdout_capacity`` kept. ``random_state`` seeds the holdout draw, the seed sample
    and the fold hashes."""

    def __init__(
        self,
        dim: int,
        capacity: int = 50_000,
        *,
        window: float | None = None,
        quota: float | None = 0.05,
        fold: float | None = 0.98,
        seed=None,
        seed_share: float = 0.1,
        holdout: float = 0.1,
        holdout_capacity: int = 2_000,
        random_state: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.dim = check_positive_int(dim, "dim")
        self.capacity = check_positive_int(capacity, "capacity")
        if window is not None and not (math.isfinite(window) and window > 0):
            raise InvalidInput(f"window must be a positive number of seconds (or None); got {window!r}")
        if quota is not None and not 0 < quota <= 1:
            raise InvalidInput(f"quota must be a share in (0, 1] (or None: no quota); got {quota!r}")
        if fold is not None and not 0 < fold <= 1:
            raise InvalidInput(f"fold must be a cosine in (0, 1] (or None: no folding); got {fold!r}")
        if not 0 <= seed_share <= 0.5:
            raise InvalidInput(f"seed_share must be in [0, 0.5] (the seed kept may not crowd out the traffic); got {seed_share!r}")
        if not 0 <= holdout < 1:
            raise InvalidInput(f"holdout must be a share in [0, 1); got {holdout!r}")
        self.window, self.quota, self.fold, self.seed_share, self.holdout_share = window, quota, fold, seed_share, holdout
        self.holdout_capacity = check_positive_int(holdout_capacity, "holdout_capacity")
        self.part_rows = max(1, self.capacity // PARTS)
        self.clock = clock
        self.random_state = random_state
        self.lock = threading.RLock()
        self.totals = Offered()
        self._seed = None if seed is None else as_embeddings(seed, "seed", normalize=False, dim=self.dim)
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self, *, keep_seed: bool = True) -> None:
        """Forget every query admitted (bank and held out); the seed stays unless ``keep_seed`` is False."""
        with self.lock:
            self.rng = np.random.default_rng(self.random_state)
            seed = self._seed if keep_seed else None
            if not keep_seed:
                self._seed = None
            center = None if seed is None or seed.shape[0] == 0 else _unit_mean(seed)
            self.near = NearDuplicates(self.dim, self.fold or 1.0, seed=self.random_state, center=center)
            self.parts_: list[Part] = []
            self.held: deque = deque()  # (key, vector, client, time), oldest first
            self.bank_clients: Counter = Counter()
            self.held_clients: Counter = Counter()
            self.next_key = 0
            self.next_part = 0
            self.size = 0
            self.new_rows = 0  # traffic rows admitted since mark_fitted()
            if seed is not None:
                self._add_seed(seed)

    def _add_seed(self, seed: np.ndarray) -> None:
        order = self.rng.permutation(seed.shape[0])[: self.capacity]
        kept = min(order.size, math.ceil(self.seed_share * self.capacity), self.capacity - self.part_rows)
        now = self.clock()
        pieces = [("seed", order[:kept])] + [("seed-extra", order[i : i + self.part_rows]) for i in range(kept, order.size, self.part_rows)]
        for kind, rows in pieces:
            if rows.size == 0:
                continue
            part = self._new_part(kind, np.ascontiguousarray(seed[np.sort(rows)]))
            part.n = part.vectors.shape[0]
            part.clients, part.times = [None] * part.n, [now] * part.n
            part.keys = list(range(self.next_key, self.next_key + part.n))
            self.next_key += part.n
            if self.fold is not None:
                codes = self.near.hash(part.vectors)
                for key, row, code in zip(part.keys, part.vectors, codes):
                    self.near.add(key, row, code)
            self.size += part.n

    def _new_part(self, kind: str, vectors: np.ndarray) -> Part:
        part = Part(self.next_part, kind, vectors)
        self.next_part += 1
        self.parts_.append(part)
        return part

    # ------------------------------------------------------------------ admission
    def offer(self, queries, client: Hashable) -> Offered:
        """Offer a batch of query embeddings sent by ``client``: each is folded, refused over
        quota, held out or admitted into the bank (see the module docstring)."""
        rows = as_embeddings(queries, "queries", normalize=False, dim=self.dim)
        who = str(client)
        out = Offered()
        with self.lock:
            now = self.clock()
            self._expire(now)
            codes = self.near.hash(rows) if self.fold is not None else None
            for i in range(rows.shape[0]):
                if codes is not None and self.near.find(rows[i], codes[i]) is not None:
                    out.folded += 1
                    continue
                held = self.holdout_share > 0 and self.rng.random() < self.holdout_share
                counts, limit = (self.held_clients, self.holdout_capacity) if held else (self.bank_clients, self.capacity)
                if self.quota is not None and counts[who] >= max(1, int(self.quota * limit)):
                    out.over_quota += 1
                    continue
                key = self.next_key
                self.next_key += 1
                if held:
                    stored = rows[i].copy()
                    self.held.append((key, stored, who, now))
                    out.held_out += 1
                    if len(self.held) > self.holdout_capacity:
                        self._drop_held()
                else:
                    stored = self._append(rows[i], who, now, key)
                    out.admitted += 1
                counts[who] += 1
                if codes is not None:
                    self.near.add(key, stored, codes[i])
            self.totals.add(out)
            self.new_rows += out.admitted
        return out

    def _append(self, row: np.ndarray, who: str, now: float, key: int) -> np.ndarray:
        """Append one traffic row to the newest part (a new part when it is full or spans
        window / PARTS); drop the oldest rows past the capacity. Returns the stored row."""
        last = self.parts_[-1] if self.parts_ and self.parts_[-1].kind == "traffic" else None
        span = None if self.window is None else self.window / PARTS
        if last is None or last.n >= self.part_rows or (span is not None and now - last.times[0] >= span):
            last = self._new_part("traffic", np.empty((self.part_rows, self.dim), np.float32))
        last.vectors[last.n] = row
        last.n += 1
        last.clients.append(who)
        last.times.append(now)
        last.keys.append(key)
        self.size += 1
        while self.size > self.capacity:
            self._drop_part(next(p for p in self.parts_ if p.kind != "seed"))
        return last.vectors[last.n - 1]

    def _drop_part(self, part: Part) -> None:
        self.parts_.remove(part)
        self.size -= part.n
        for key in part.keys:
            self.near.remove(key)
        if part.kind == "traffic":
            counts = self.bank_clients
            counts.subtract(part.clients)
            for who in set(part.clients):
                if counts[who] <= 0:
                    del counts[who]  # in place: offer() holds this Counter

    def _drop_held(self) -> None:
        key, _, who, _ = self.held.popleft()
        self.near.remove(key)
        self.held_clients[who] -= 1
        if self.held_clients[who] <= 0:
            del self.held_clients[who]

    def expire(self) -> None:
        """Drop what passed the window now (offers do it too)."""
        with self.lock:
            self._expire(self.clock())

    def _expire(self, now: float) -> None:
        if self.window is None:
            return
        cutoff = now - self.window
        for part in [p for p in self.parts_ if p.kind == "traffic" and p.times[0] < cutoff]:
            self._drop_part(part)
        while self.held and self.held[0][3] < cutoff:
            self._drop_held()

    # ------------------------------------------------------------------ what it holds
    def parts(self) -> list[Part]:
        """The bank's parts, in bank order (seed, then traffic oldest first), as they are now
        (each ``Part.rows`` is a view: read it under :attr:`lock` or copy it)."""
        with self.lock:
            self._expire(self.clock())
            return list(self.parts_)

    def bank(self) -> np.ndarray:
        """The bank, (size, dim) float32, in bank order (a copy)."""
        with self.lock:
            self._expire(self.clock())
            if not self.parts_:
                return np.zeros((0, self.dim), np.float32)
            return np.concatenate([p.rows for p in self.parts_])

    def holdout(self) -> np.ndarray:
        """The held-out queries, oldest first (a copy): never in the bank."""
        with self.lock:
            self._expire(self.clock())
            return np.stack([row for _, row, _, _ in self.held]) if self.held else np.zeros((0, self.dim), np.float32)

    def mark_fitted(self) -> None:
        """Count new traffic from now (see :attr:`new_rows`)."""
        with self.lock:
            self.new_rows = 0

    def describe(self) -> dict:
        """Sizes, clients, ages (seconds) and totals: what the service shows."""
        with self.lock:
            now = self.clock()
            self._expire(now)
            traffic = [p for p in self.parts_ if p.kind == "traffic"]
            times = np.concatenate([np.asarray(p.times) for p in traffic]) if traffic else np.zeros(0)
            seed = sum(p.n for p in self.parts_ if p.kind != "traffic")
            largest = self.bank_clients.most_common(1)
            return {
                "capacity": self.capacity,
                "size": self.size,
                "seed": seed,
                "traffic": self.size - seed,
                "held_out": len(self.held),
                "clients": len(self.bank_clients),
                "largest_client_share": largest[0][1] / self.capacity if largest else 0.0,
                "oldest_age_s": float(now - times.min()) if times.size else None,
                "median_age_s": float(now - np.median(times)) if times.size else None,
                "newest_age_s": float(now - times.max()) if times.size else None,
                "window_s": self.window,
                "quota": self.quota,
                "fold": self.fold,
                "parts": len(self.parts_),
                "new_since_fit": self.new_rows,
                "offered": self.totals.to_dict(),
            }


def _unit_mean(rows: np.ndarray) -> np.ndarray:
    unit = rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), np.finfo(np.float32).tiny)
    return unit.mean(axis=0).astype(np.float32)
