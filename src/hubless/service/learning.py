"""The learned banks of a service (``hubless serve --learn-bank NAME``): one
:class:`hubless.learning.BankLearner` per index named, made from :class:`BankLearning`
settings, fed by the searches it answers (:meth:`hubless.service.state.Served.run`, the one
place the query embeddings are tapped), started and stopped with the application, its writes
run under the index's write lock, and every decision appended to the audit log (when there is
one) and counted in the metrics (:mod:`hubless.service.telemetry`).

The client a query counts against is its address (``scope["client"]``: the connection's, or the
one a trusted proxy forwards, as for the rate limit): the API keys are shared by every reader,
so they cannot tell clients apart. Item queries ("more like this") are gallery items, not
queries, and are not learned; nor are reranked searches (they do not run through the batcher).
"""

from __future__ import annotations

import functools
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from hubless.errors import InvalidInput

if TYPE_CHECKING:
    from hubless.service.state import ServiceState

__all__ = ["client_of", "make_learners"]


def client_of(scope: MutableMapping[str, Any]) -> str:
    """The client a query counts against: its address (see the module docstring)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def make_learners(service: ServiceState) -> None:
    """Give every served index named by ``--learn-bank`` its learner (not started)."""
    from hubless.learning import BankLearner, GuardSettings

    settings = service.settings.learning
    if not settings.learn_bank:
        return
    if not service.settings.writes:
        raise InvalidInput("--learn-bank commits new versions of the index: it needs writes on (serve with --workers 1)")
    seed = None
    if settings.learn_bank_seed is not None:
        from hubless.inputs import load_embeddings

        seed = load_embeddings(settings.learn_bank_seed)
    guard = GuardSettings(
        max_bias_shift=settings.learn_bank_max_bias_shift,
        max_bias_outlier=settings.learn_bank_max_bias_outlier,
        max_skewness_increase=settings.learn_bank_max_skewness_increase,
    )
    for name in settings.learn_bank:
        if name not in service.served:
            raise InvalidInput(f"--learn-bank {name!r}: no index of that name is served ({', '.join(sorted(service.served))})")
        s = service.served[name]
        if getattr(s.index, "read_only", False):
            raise InvalidInput(f"--learn-bank {name!r}: an attached collection or a store is served read only; learn an index's bank")
        s.learner = BankLearner(
            s.index,
            name=name,
            capacity=settings.learn_bank_capacity,
            window=settings.learn_bank_window,
            quota=None if settings.learn_bank_quota >= 1 else settings.learn_bank_quota,
            fold=settings.learn_bank_fold,
            every=settings.learn_bank_every,
            interval=settings.learn_bank_interval,
            holdout=settings.learn_bank_holdout,
            seed=seed,
            seed_share=settings.learn_bank_seed_share,
            guard=guard,
            write=s.write,
            on_decision=functools.partial(decided, service, name),
        )


def decided(service: ServiceState, name: str, record: dict[str, Any]) -> None:
    """A refit's decision: an audit line (when the service keeps an audit log) and metrics."""
    service.telemetry.refitted(name, record)
    if service.write_log is not None:
        detail = {k: record.get(k) for k in ("decision", "version", "from_version", "reasons", "bias_shift", "moved_item")}
        detail["bank_size"] = record["bank"]["size"]
        service.write_log.record(
            key=None, method="REFIT", endpoint="/bank/{name}/learned", index=name, ids=detail, client="hubless", request_id=None
        )
