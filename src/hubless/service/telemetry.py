"""``GET /metrics``: Prometheus metrics (prometheus_client), per endpoint and per index.

* ``hubless_requests_total{endpoint,method,status}``: requests served (a counter);
* ``hubless_request_duration_seconds{endpoint}``: their latency (a histogram, 0.5 ms .. 10 s);
* ``hubless_auth_failures_total{reason}``: requests refused for their key (``missing``,
  ``wrong_key``, ``read_only``: the read-only key on a write);
* ``hubless_rate_limited_total``: requests refused by the per-client rate limit (429);
* ``hubless_served_*{index}``: the hubness of what is actually served (see
  :class:`hubless.service.hubness.ServedSketch`): queries counted, N_1 skewness of the top-1
  results, the share of all returned results taken by the top 1% of items, the largest N_1;
* ``hubless_learned_bank_*{index}`` (``--learn-bank``): the learned bank's queries, held-out
  queries and clients, the age of its oldest query, the queries offered by outcome (admitted,
  held out, folded, over quota, dropped), the refits by decision (accepted, rejected,
  superseded, failed), the version served, and of the last refit the held-out queries' N_1 and
  N_10 skewness and largest hub's share (``when``: before, after) and its largest relative bias
  move (see :mod:`hubless.learning`).

Under ``hubless serve --workers N`` the counters and histograms are summed over the worker
processes (prometheus_client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``); the served
hubness is per worker (label ``pid``: each worker sees the queries it served).
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "Telemetry"]

#: The exposition format's content type, with its version.
CONTENT_TYPE = CONTENT_TYPE_LATEST
BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class Telemetry:
    """The application's Prometheus metrics (one registry per application, so several apps in one
    process, as in tests, do not mix; in multiprocess mode the values live in files)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        registry = None if multiprocess() else self.registry
        self.requests = Counter("hubless_requests", "Requests served.", ("endpoint", "method", "status"), registry=registry)
        self.duration = Histogram(
            "hubless_request_duration_seconds", "Time to serve a request.", ("endpoint",), buckets=BUCKETS, registry=registry
        )
        self.auth_failures = Counter(
            "hubless_auth_failures",
            "Requests refused for their key: missing, wrong_key, or read_only (the read-only key on a write).",
            ("reason",),
            registry=registry,
        )
        self.rate_limited = Counter("hubless_rate_limited", "Requests refused by the per-client rate limit (429).", registry=registry)
        mode: dict[str, Any] = {"multiprocess_mode": "liveall"} if multiprocess() else {}
        self.served_queries = Gauge(
            "hubless_served_queries", "Queries whose results the served hubness counts.", ("index",), registry=registry, **mode
        )
        self.served_skewness = Gauge(
            "hubless_served_n1_skewness", "Skewness of N_1 over the served top-1 results.", ("index",), registry=registry, **mode
        )
        self.served_top_share = Gauge(
            "hubless_served_top1pct_share",
            "Share of all served results taken by the top 1% of items.",
            ("index",),
            registry=registry,
            **mode,
        )
        self.served_max = Gauge(
            "hubless_served_n1_max", "Largest N_1 (top-1 occurrences of one item) served.", ("index",), registry=registry, **mode
        )

        learned: dict[str, tuple[str, str, tuple[str, ...]]] = {
            "bank_queries": ("hubless_learned_bank_queries", "Queries in the learned bank, by part (seed, traffic).", ("index", "part")),
            "held_out": ("hubless_learned_bank_held_out", "Queries held out to judge refits on.", ("index",)),
            "clients": ("hubless_learned_bank_clients", "Client addresses with queries in the learned bank.", ("index",)),
            "age": ("hubless_learned_bank_oldest_age_seconds", "Age of the learned bank's oldest query.", ("index",)),
            "offered": ("hubless_learned_bank_offered", "Queries offered to the learned bank so far, by outcome.", ("index", "outcome")),
            "version": ("hubless_learned_bank_version", "The version the last accepted refit committed.", ("index",)),
            "skewness": (
                "hubless_learned_bank_skewness",
                "Skewness of N_k of the held-out queries at the last refit.",
                ("index", "k", "when"),
            ),
            "hub_share": (
                "hubless_learned_bank_top_hub_share",
                "The largest hub's share of the held-out top-10 results.",
                ("index", "when"),
            ),
            "bias_shift": ("hubless_learned_bank_bias_shift", "The last refit's largest relative move of an item's score.", ("index",)),
        }
        self.learned = {key: Gauge(name, text, labels, registry=registry) for key, (name, text, labels) in learned.items()}
        self.refits = Counter(
            "hubless_learned_bank_refits", "Refits of a learned bank, by decision.", ("index", "decision"), registry=registry
        )

    def refitted(self, name: str, record: dict) -> None:
        """Count a refit's decision (``hubless.learning.BankLearner``'s record) and show its figures."""
        self.refits.labels(name, record["decision"]).inc()
        g = self.learned
        for when in ("before", "after"):
            figures = record.get(when)
            if figures:
                g["skewness"].labels(name, "1", when).set(figures["n1_skewness"])
                g["skewness"].labels(name, "10", when).set(figures["n10_skewness"])
                g["hub_share"].labels(name, when).set(figures["top_hub_share"])
        if record.get("bias_shift") is not None:
            g["bias_shift"].labels(name).set(record["bias_shift"])
        if record["decision"] == "accepted" and record.get("version") is not None:
            g["version"].labels(name).set(record["version"])

    def _learners(self, learners: dict) -> None:
        g = self.learned
        for name, learner in learners.items():
            status = learner.status()
            bank = status["reservoir"]
            g["bank_queries"].labels(name, "seed").set(bank["seed"])
            g["bank_queries"].labels(name, "traffic").set(bank["traffic"])
            g["held_out"].labels(name).set(bank["held_out"])
            g["clients"].labels(name).set(bank["clients"])
            g["age"].labels(name).set(float("nan") if bank["oldest_age_s"] is None else bank["oldest_age_s"])
            for outcome, count in {**bank["offered"], "dropped": status["dropped"]}.items():
                g["offered"].labels(name, outcome).set(count)

    def observe(self, endpoint: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, method, str(status)).inc()
        self.duration.labels(endpoint).observe(seconds)

    def text(self, sketches: dict, learners: dict | None = None) -> bytes:
        """The exposition text, with the served hubness of each index (and its learned bank's
        figures: ``learners``, index name -> BankLearner) brought up to date."""
        self._learners(learners or {})
        for name, sketch in sketches.items():
            stats = sketch.summary(top=0)
            self.served_queries.labels(name).set(stats["queries"])
            self.served_skewness.labels(name).set(stats["n1_skewness"] if stats["n1_skewness"] is not None else float("nan"))
            self.served_top_share.labels(name).set(stats["top1pct_share"] if stats["top1pct_share"] is not None else float("nan"))
            self.served_max.labels(name).set(stats["n1_max"])
        if multiprocess():
            from prometheus_client import multiprocess as mp

            registry = CollectorRegistry()
            mp.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
