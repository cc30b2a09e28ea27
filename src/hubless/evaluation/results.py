"""What :func:`hubless.evaluate` (and :func:`hubless.evaluate_scores`) returns, typed.

:class:`Evaluation` holds one :class:`MethodResult` per method (baseline first): its metrics
(R@K, MdR, MnR, MRR, mAP@R), their bootstrap intervals, the change against the baseline with
its paired interval, the hubness of its top 10 and its times, every field with the type a type
checker reads. :meth:`Evaluation.to_dict` is the ``results.json`` schema of ``hubless eval``
(fixed keys in a fixed order: tests/evaluation/test_results.py spells them out). The numbers
added afterwards, :func:`hubless.rerank.rerank_evaluation`'s :class:`RerankNumbers` and
:func:`hubless.evaluation.eccv.eccv_evaluation`'s :data:`EccvScores`, are typed fields of each
result too; :class:`RerankNumbers` still reads as the dict it was (``numbers["retrieve"]``,
``dict(numbers)``, ``numbers == {...}``), so callers can move to attributes at their pace.
:func:`hubless.tune`'s :class:`TuneResult` holds one :class:`TunedMethod` per method (read as
the dict it was too) and the validation table of every grid point.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import numpy.typing as npt

from hubless.errors import NotFound

if TYPE_CHECKING:  # annotations only: this module imports nothing heavy at run time
    from hubless.banks import BankReport
    from hubless.corrections import Correction

__all__ = ["EccvScores", "Evaluation", "Interval", "JSONValue", "MethodResult", "RerankNumbers", "TuneResult", "TunedMethod"]

#: A value JSON can hold (what ``to_dict`` methods return, and ``Evaluation.inputs``).
JSONValue: TypeAlias = str | int | float | bool | None | Sequence["JSONValue"] | Mapping[str, "JSONValue"]
#: A 95% interval: (low, high).
Interval: TypeAlias = tuple[float, float]
#: ECCV Caption / CxC / COCO metrics (percent): {metric: {"t2i": value, "i2t": value}}.
EccvScores: TypeAlias = dict[str, dict[str, float]]
#: Metrics where lower is better (ranks); every other metric is higher-is-better.
LOWER_IS_BETTER = frozenset({"MdR", "MnR"})


class _ReadsAsItsDict(Mapping[str, JSONValue]):
    """A result that still reads as the plain dict it was: its keys and values are
    :meth:`to_dict`'s (built on each read; these results are small)."""

    __slots__ = ()

    def to_dict(self) -> dict[str, JSONValue]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> JSONValue:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


@dataclass(frozen=True, slots=True, eq=False)
class RerankNumbers(_ReadsAsItsDict):
    """One method's retrieve-only vs retrieve+rerank numbers (:func:`hubless.rerank.rerank_eval`):
    ``k`` candidates per query given to the reranker, its ``fusion`` and ``fusion_weight``, R@K
    (K <= k) of the first stage alone (``retrieve``) and after reranking (``reranked``), and the
    mean latency per query of each stage in ms. Reads as the dict it was (:meth:`to_dict`'s keys:
    ``"retrieve+rerank"`` for ``reranked``, ``"ms_per_query"`` for the two latencies)."""

    k: int
    fusion: str | None
    fusion_weight: float
    retrieve: dict[str, float]
    reranked: dict[str, float]
    ms_retrieve: float
    ms_rerank: float

    def to_dict(self) -> dict[str, JSONValue]:
        """The plain dict (the ``rerank`` entry of a result in ``results.json``)."""
        return {
            "k": self.k,
            "fusion": self.fusion,
            "fusion_weight": self.fusion_weight,
            "retrieve": self.retrieve,
            "retrieve+rerank": self.reranked,
            "ms_per_query": {"retrieve": self.ms_retrieve, "rerank": self.ms_rerank},
        }


@dataclass(frozen=True, slots=True, eq=False)
class MethodResult:
    """One method's numbers. ``metrics``: {"R@1": ..., "MdR": ..., "MnR": ..., "MRR": ...,
    "mAP@R": ...} (R@K and mAP@R in percent); ``ci95``: their bootstrap intervals (empty with
    ``bootstrap=0``); ``delta`` / ``delta_ci95``: the change against the baseline and its paired
    interval (empty for the baseline itself); ``hubness``: the N_1 and N_10 statistics of
    :func:`hubless.metrics.hubness_statistics`; ``seconds["fit"]`` is the shared pass that fitted
    every method at once (each method's own would cost about as much), ``seconds["search"]``
    this method's ranking of the queries. ``per_query`` holds the per-query values behind each
    metric, ``n1`` the N_1 occurrence of every gallery item (for plots) and ``correction`` the
    fitted correction (reused by reranking and ECCV evaluation); none of them goes to JSON.
    ``eccv`` and ``rerank``: added by :func:`~hubless.evaluation.eccv.eccv_evaluation` and
    :func:`~hubless.rerank.rerank_evaluation` (None until then)."""

    method: str
    params: dict[str, JSONValue]
    spec: str
    metrics: dict[str, float]
    ci95: dict[str, Interval]
    hubness: dict[str, float]
    seconds: dict[str, float]
    delta: dict[str, float] = field(default_factory=dict)
    delta_ci95: dict[str, Interval] = field(default_factory=dict)
    per_query: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict, repr=False)
    n1: npt.NDArray[np.int64] | None = field(default=None, repr=False)
    correction: Correction | None = field(default=None, repr=False)
    eccv: EccvScores | None = None
    rerank: RerankNumbers | None = None

    @property
    def extra(self) -> Mapping[str, JSONValue]:
        """The numbers added after the evaluation (``"eccv"``, ``"rerank"``), read-only: what
        ``to_dict`` writes after ``seconds``."""
        out: dict[str, JSONValue] = {}
        if self.eccv is not None:
            out["eccv"] = self.eccv
        if self.rerank is not None:
            out["rerank"] = self.rerank.to_dict()
        return MappingProxyType(out)

    def to_dict(self) -> dict[str, JSONValue]:
        """One entry of ``results`` in ``results.json``."""
        return {
            "method": self.method,
            "spec": self.spec,
            "params": self.params,
            "metrics": self.metrics,
            "ci95": {k: list(v) for k, v in self.ci95.items()},
            "delta_vs_baseline": self.delta,
            "delta_ci95": {k: list(v) for k, v in self.delta_ci95.items()},
            "hubness": self.hubness,
            "seconds": self.seconds,
            **self.extra,
        }


@dataclass(frozen=True, slots=True, eq=False)
class Evaluation:
    """Results of :func:`hubless.evaluate`: ``results`` (baseline first; ``ev["nnn"]`` finds one
    by spec or method name), ``inputs`` (a description of what was measured: sizes, ``ks``,
    ``bootstrap``, ``seed``, ``ties``, ... and what the caller added), the cut-offs ``ks`` and,
    with ``coverage=True``, the query bank's coverage report (``bank``). The list ``results`` is
    the one thing that changes afterwards: ECCV and rerank evaluations replace each entry by one
    with their numbers."""

    inputs: dict[str, JSONValue]
    results: list[MethodResult]
    ks: tuple[int, ...]
    bank: BankReport | None = None

    def to_dict(self) -> dict[str, JSONValue]:
        """The ``results.json`` schema of ``hubless eval``."""
        out: dict[str, JSONValue] = {"inputs": self.inputs, "results": [r.to_dict() for r in self.results]}
        if self.bank is not None:
            out["query_bank_coverage"] = self.bank.to_dict()
        return out

    @property
    def n_gallery(self) -> int:
        """Gallery items ranked (distractors included)."""
        return _count(self.inputs, "n_gallery")

    @property
    def n_queries(self) -> int:
        """Queries ranked."""
        return _count(self.inputs, "n_queries")

    def losses(self, metric: str | None = None) -> list[str]:
        """Specs of the methods that did worse than the baseline on ``metric`` (default: R@K at
        the first K): their paired 95% interval of the change lies below 0 (without bootstrap
        intervals: their change is below 0)."""
        metric = metric or f"R@{self.ks[0]}"
        worse = []
        for r in self.results[1:]:
            ci = r.delta_ci95.get(metric)
            if (ci[1] < 0) if ci is not None else r.delta.get(metric, 0.0) < 0:
                worse.append(r.spec)
        return worse

    def __getitem__(self, spec: str) -> MethodResult:
        for r in self.results:
            if spec in (r.spec, r.method):
                return r
        raise NotFound(spec)


@dataclass(frozen=True, slots=True, eq=False)
class TunedMethod(_ReadsAsItsDict):
    """The grid point chosen for one method: its ``spec`` and grid ``params``, the ``objective``
    it was chosen on, every validation metric of it (``metrics``; ``value`` is the objective's)
    and ``at_edge``, the parameters chosen at the border of their grid (see
    :func:`hubless.tuning.grid_edges`). Reads as the dict it was: ``spec``, ``params``, the
    objective's name (its value), ``metrics``, ``at_edge``."""

    spec: str
    params: dict[str, float]
    objective: str
    metrics: dict[str, float]
    at_edge: list[str]

    @property
    def value(self) -> float:
        """The objective's validation value."""
        return self.metrics[self.objective]

    def to_dict(self) -> dict[str, JSONValue]:
        """The plain dict (an entry of ``best`` in the tuning JSON)."""
        return {"spec": self.spec, "params": self.params, self.objective: self.value, "metrics": self.metrics, "at_edge": self.at_edge}


@dataclass(frozen=True, slots=True, eq=False)
class TuneResult:
    """What :func:`hubless.tune` (and :func:`hubless.tune_scores`) chose, per method.

    ``best[method]``: the chosen :class:`TunedMethod`; ``tables[method]``: the validation table,
    one row per grid point (its parameters, then its metrics). ``baseline``: the uncorrected
    ranking's validation metrics. ``fitted[method]``: the chosen correction, fitted (on the
    gallery given to :func:`hubless.tune`; not written to JSON). ``bank``: the query bank's
    coverage report, with ``coverage=True``.
    """

    objective: str
    best: dict[str, TunedMethod] = field(default_factory=dict)
    tables: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    baseline: dict[str, float] = field(default_factory=dict)
    fitted: dict[str, Correction] = field(default_factory=dict, repr=False)
    bank: BankReport | None = None

    @property
    def best_specs(self) -> list[str]:
        return [b.spec for b in self.best.values()]

    def losses(self) -> list[str]:
        """Chosen specs whose validation objective is worse than the baseline's."""
        sign = -1.0 if self.objective in LOWER_IS_BETTER else 1.0
        base = self.baseline.get(self.objective)
        return [b.spec for b in self.best.values() if base is not None and sign * (b.value - base) < 0]

    def to_dict(self) -> dict[str, JSONValue]:
        """The tuning JSON (``hubless tune --out``)."""
        out: dict[str, JSONValue] = {
            "objective": self.objective,
            "best": {m: b.to_dict() for m, b in self.best.items()},
            "validation": self.tables,
            "baseline": self.baseline,
        }
        if self.bank is not None:
            out["query_bank_coverage"] = self.bank.to_dict()
        return out


def choose(
    objective: str, points: Sequence[Mapping[str, float]], corrections: Sequence[Correction], metrics: Sequence[dict[str, float]]
) -> tuple[TunedMethod, list[dict[str, float]]]:
    """The best grid point of one method on ``objective`` (ties: the first) and the method's
    validation table: what :func:`hubless.tune` and :func:`hubless.tune_scores` keep."""
    sign = -1.0 if objective in LOWER_IS_BETTER else 1.0
    best = int(np.argmax([sign * m[objective] for m in metrics]))
    params = dict(points[best])
    chosen = TunedMethod(corrections[best].spec, params, objective, metrics[best], grid_edges(points, params))
    return chosen, [{**p, **m} for p, m in zip(points, metrics)]


def grid_edges(points: Sequence[Mapping[str, float]], chosen: Mapping[str, float]) -> list[str]:
    """The parameters whose chosen value is the smallest or largest of a grid of at least three
    values: the optimum may lie outside the grid, so widen it there."""
    edges = []
    for name, value in chosen.items():
        values = sorted({p[name] for p in points})
        if len(values) >= 3 and value in (values[0], values[-1]):
            edges.append(name)
    return edges


def _count(inputs: Mapping[str, JSONValue], key: str) -> int:
    value = inputs.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise NotFound(f"inputs[{key!r}]")
    return value
