"""The bank reservoir's invariants (hubless.learning.reservoir), as a hypothesis state machine
checked against brute force after every step: the bank never exceeds its capacity, no client
holds more than its quota of the bank or of the held-out set, nothing older than the window is
kept, the seed's kept share is always there, a query is folded only when a kept one is within
the fold cosine (checked by brute force) and an exact repeat always is, held-out queries never
enter the bank; and the folding index's own properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hubless.errors import InvalidInput
from hubless.learning import BankReservoir
from hubless.learning.folding import NearDuplicates
from tests.conftest import unit_rows

DIM = 8
FOLD = 0.97


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ReservoirMachine(RuleBasedStateMachine):
    """A reservoir with a seed, a window, a quota and folding, offered queries from a small pool
    (so repeats and near repeats happen) by a few clients."""

    @initialize(
        capacity=st.integers(4, 60),
        n_seed=st.integers(0, 30),
        quota=st.sampled_from([None, 0.1, 0.3]),
        holdout=st.sampled_from([0.0, 0.3]),
        window=st.sampled_from([None, 50.0]),
    )
    def start(self, capacity, n_seed, quota, holdout, window):
        rng = np.random.default_rng(capacity * 1000 + n_seed)
        self.pool = unit_rows(rng, 40, DIM)
        self.clock = Clock()
        self.seed_rows = unit_rows(rng, n_seed, DIM) if n_seed else None
        self.r = BankReservoir(
            DIM,
            capacity,
            window=window,
            quota=quota,
            fold=FOLD,
            seed=self.seed_rows,
            holdout=holdout,
            holdout_capacity=10,
            clock=self.clock,
            random_state=capacity,
        )
        self.kept_seed = self._seed_kept()
        self.rng = rng

    def _seed_kept(self) -> np.ndarray:
        parts = [p for p in self.r.parts_ if p.kind == "seed"]
        return np.concatenate([p.rows for p in parts]) if parts else np.zeros((0, DIM), np.float32)

    def _kept(self) -> np.ndarray:
        return np.concatenate([self.r.bank(), self.r.holdout()])

    @rule(which=st.lists(st.integers(0, 39), min_size=1, max_size=6), client=st.integers(0, 3), jitter=st.sampled_from([0.0, 1e-3, 0.3]))
    def offer(self, which, client, jitter):
        for i in which:  # one at a time, so each fold can be checked against what was kept just before
            row = self.pool[i] + jitter * self.rng.standard_normal(DIM).astype(np.float32)
            row = (row / np.linalg.norm(row)).astype(np.float32)[None]
            kept = self._kept()
            closest = float((kept @ row[0]).max()) if kept.shape[0] else -1.0
            repeat = bool(kept.shape[0]) and bool((kept == row[0]).all(axis=1).any())
            bank_before, held_before = dict(self.r.bank_clients), dict(self.r.held_clients)
            out = self.r.offer(row, f"c{client}")
            assert out.admitted + out.held_out + out.folded + out.over_quota == 1
            if out.folded:
                assert closest >= FOLD - 1e-6, closest  # never folded into a query that is not that close
            if repeat:
                assert out.folded == 1  # an exact repeat always folds
            if out.over_quota:
                who = f"c{client}"
                at_bank = bank_before.get(who, 0) >= max(1, int(self.r.quota * self.r.capacity))
                at_held = held_before.get(who, 0) >= max(1, int(self.r.quota * self.r.holdout_capacity))
                assert at_bank or at_held
            if out.admitted:
                assert (self.r.bank() == row[0]).all(axis=1).any()
            if out.held_out:
                assert (self.r.holdout() == row[0]).all(axis=1).any() and not (self.r.bank() == row[0]).all(axis=1).any()

    @rule(dt=st.sampled_from([1.0, 7.0, 30.0]))
    def wait(self, dt):
        self.clock.now += dt

    @rule()
    def reset(self):
        self.r.reset()
        assert self.r.describe()["traffic"] == 0 and self.r.holdout().shape[0] == 0

    @invariant()
    def bounded(self):
        r = self.r
        bank = r.bank()
        assert bank.shape[0] == r.size == sum(p.n for p in r.parts_) <= r.capacity
        assert len(r.held) <= r.holdout_capacity
        assert r.describe()["parts"] <= 2 * math.ceil(r.capacity / r.part_rows) + 2

    @invariant()
    def quotas(self):
        r = self.r
        if r.quota is not None:
            assert max(r.bank_clients.values(), default=0) <= max(1, int(r.quota * r.capacity))
            assert max(r.held_clients.values(), default=0) <= max(1, int(r.quota * r.holdout_capacity))
        traffic = [c for p in r.parts_ if p.kind == "traffic" for c in p.clients]
        assert {c: traffic.count(c) for c in set(traffic)} == dict(r.bank_clients)

    @invariant()
    def window(self):
        r = self.r
        if r.window is not None:
            times = [t for p in r.parts_ if p.kind == "traffic" for t in p.times] + [h[3] for h in r.held]
            assert all(t >= self.clock.now - r.window for t in times)

    @invariant()
    def seed_kept(self):
        bank = self.r.bank()
        for row in self.kept_seed:
            assert (bank == row).all(axis=1).any()
        if self.seed_rows is not None:
            assert self.kept_seed.shape[0] == min(
                self.seed_rows.shape[0], math.ceil(self.r.seed_share * self.r.capacity), self.r.capacity - self.r.part_rows
            )

    @invariant()
    def no_repeats(self):
        kept = self._kept()
        assert np.unique(kept, axis=0).shape[0] == kept.shape[0]  # every exact repeat was folded

    @invariant()
    def fold_index_matches(self):
        keys = {k for p in self.r.parts_ for k in p.keys} | {h[0] for h in self.r.held}
        assert set(self.r.near.vectors) == keys  # what folding checks against is exactly what is kept


TestReservoir = ReservoirMachine.TestCase
TestReservoir.settings = settings(  # the same examples every run (derandomize: seeded from the test's code)
    max_examples=40, stateful_step_count=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


def test_a_flood_of_one_query_counts_once_and_a_client_is_capped():
    rng = np.random.default_rng(0)
    r = BankReservoir(DIM, 200, quota=0.05, holdout=0.0)
    q = unit_rows(rng, 1, DIM)
    out = r.offer(np.repeat(q, 500, axis=0), "flooder")
    assert (out.admitted, out.folded) == (1, 499)
    out = r.offer(unit_rows(rng, 50, DIM), "flooder")  # distinct queries: capped at 5% of 200
    assert out.admitted == 9 and out.over_quota == 41 and r.bank_clients["flooder"] == 10
    assert r.offer(unit_rows(rng, 5, DIM), "other").admitted == 5


def test_the_window_and_the_capacity_drop_the_oldest_first():
    clock = Clock()
    r = BankReservoir(DIM, 80, window=80.0, quota=None, holdout=0.0, clock=clock, seed=unit_rows(np.random.default_rng(1), 40, DIM))
    rng = np.random.default_rng(2)
    for _ in range(10):
        r.offer(unit_rows(rng, 10, DIM), "a")
        clock.now += 10
    d = r.describe()
    assert d["size"] <= 80 and d["seed"] == 8  # the seed's displaceable rows left first; 10% of 80 kept
    assert d["oldest_age_s"] <= 80
    clock.now += 81
    assert r.describe()["traffic"] == 0 and r.describe()["seed"] == 8  # the window empties the traffic, never the seed kept


@seed(11)
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 400), angle=st.floats(0.0, 0.5), threshold=st.sampled_from([0.9, 0.98, 0.995]))
def test_near_duplicates_find_only_what_is_close_enough(n, angle, threshold):
    rng = np.random.default_rng(n)
    near = NearDuplicates(DIM * 4, threshold, seed=n)
    rows = unit_rows(rng, n, DIM * 4)
    codes = near.hash(rows)
    for key, (row, code) in enumerate(zip(rows, codes)):
        near.add(key, row, code)
    probe = rows[n // 2] + angle * unit_rows(rng, 1, DIM * 4)[0]
    found = near.find(probe, near.hash(probe[None])[0])
    cos = rows @ probe / np.linalg.norm(probe)
    if found is not None:
        assert cos[found] >= threshold - 1e-6
    if angle == 0.0:
        assert found is not None and np.array_equal(rows[found], probe)
    for key in range(n):
        near.remove(key)
    assert not near.vectors and not any(near.buckets) and not near.exact


def test_bad_settings_are_refused_by_name():
    for kwargs, word in (
        (dict(quota=0.0), "quota"),
        (dict(fold=1.5), "fold"),
        (dict(window=-1.0), "window"),
        (dict(seed_share=0.9), "seed_share"),
        (dict(holdout=1.0), "holdout"),
    ):
        with pytest.raises(InvalidInput, match=word):
            BankReservoir(DIM, 10, **kwargs)
    with pytest.raises(InvalidInput):
        BankReservoir(DIM, 10).offer(np.full((1, DIM), np.nan, np.float32), "x")
