"""The bank robustness protocol of QB-Norm (Bogolin et al. 2022, Table 2): every method with
several query banks in one run, one row per method x bank, and the geometric mean over banks.

    result = evaluate_banks(gallery, queries, truth, {"in-domain": b1, "far": b2}, ["nnn", "dis"])

Each bank gets a full :func:`~hubless.evaluation.evaluate` (the baseline first, every method's
change vs the baseline with a paired bootstrap interval) and its coverage report
(:func:`hubless.banks.coverage_report`, from the pass that fits the methods with that bank);
:attr:`BankEvaluation.overall` is each method's geometric
mean of every metric over the banks (the paper's "Overall" block).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from hubless._validation import as_embeddings
from hubless.banks import BankReport
from hubless.corrections import Correction, MethodName
from hubless.errors import InvalidInput
from hubless.evaluation.evaluate import Evaluation, evaluate
from hubless.evaluation.results import JSONValue, TuneResult
from hubless.metrics.truth import TruthLike

__all__ = ["BankEvaluation", "checked_banks", "evaluate_banks", "geometric_mean"]


@dataclass(frozen=True, slots=True, eq=False)
class BankEvaluation:
    """One :class:`~hubless.evaluation.Evaluation` and one coverage report per bank (frozen:
    :meth:`to_dict` is the JSON of ``hubless eval`` with named banks)."""

    evaluations: dict[str, Evaluation]
    reports: dict[str, BankReport]
    #: With :func:`hubless.tuning.tune_banks`: each bank's tuning result (parameters chosen with that bank).
    tuned: dict[str, TuneResult] | None = None

    @property
    def rows(self) -> list[dict[str, JSONValue]]:
        """One row per method x bank: bank, method, metrics and their change vs the baseline."""
        out: list[dict[str, JSONValue]] = []
        for name, ev in self.evaluations.items():
            for r in ev.results:
                ci = r.delta_ci95
                out.append(
                    {
                        "bank": name,
                        "method": r.spec,
                        **r.metrics,
                        **{f"delta {m}": v for m, v in r.delta.items()},
                        **{f"delta {m} ci95": list(v) for m, v in ci.items()},
                    }
                )
        return out

    @property
    def overall(self) -> dict[str, dict[str, float]]:
        """Per method (by its position in the method list), the geometric mean of each metric
        over the banks, as the paper's "Overall" block. Keyed by the spec when every bank used the
        same one, else (parameters tuned per bank) by the method's name."""
        evaluations = list(self.evaluations.values())
        table = {}
        for i, r in enumerate(evaluations[0].results):
            specs = {ev.results[i].spec for ev in evaluations}
            label = r.spec if len(specs) == 1 else r.method
            table[label] = {m: geometric_mean([ev.results[i].metrics[m] for ev in evaluations]) for m in r.metrics}
        return table

    def to_dict(self) -> dict[str, JSONValue]:
        banks: dict[str, dict[str, JSONValue]] = {
            name: {"coverage": self.reports[name].to_dict(), **ev.to_dict()} for name, ev in self.evaluations.items()
        }
        for name, tuned in (self.tuned or {}).items():
            banks[name]["tuning"] = tuned.to_dict()
        return {"banks": banks, "rows": self.rows, "overall": self.overall}


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(log v)) of positive values; 0 when any is 0 (a metric that vanished on a bank)."""
    v = np.asarray(values, dtype=np.float64)
    if (v <= 0).any():
        return 0.0
    return float(np.exp(np.log(v).mean()))


def evaluate_banks(
    gallery: npt.ArrayLike,
    queries: npt.ArrayLike,
    truth: TruthLike,
    banks: Mapping[str, npt.ArrayLike],
    methods: Sequence[MethodName | str | Correction] = ("baseline", "nnn"),
    *,
    gallery_bank: npt.ArrayLike | None = None,
    ks: Sequence[int] = (1, 5, 10),
    bootstrap: int = 1000,
    seed: int = 0,
    normalize: bool = True,
    distractors: npt.ArrayLike | None = None,
    progress: bool | None = None,
    ties: str = "index",
) -> BankEvaluation:
    """:func:`~hubless.evaluation.evaluate` with each query bank of ``banks`` (name -> array),
    the same queries, truth, methods, bootstrap seed and gallery; see the module docstring."""
    g, checked = checked_banks(gallery, banks, normalize)
    evaluations = {
        name: evaluate(
            g,
            queries,
            truth,
            b,
            methods,
            gallery_bank=gallery_bank,
            ks=ks,
            bootstrap=bootstrap,
            seed=seed,
            normalize=normalize,
            distractors=distractors,
            progress=progress,
            ties=ties,
            coverage=True,
        )
        for name, b in checked.items()
    }
    return BankEvaluation(evaluations, bank_reports(evaluations))


def checked_banks(gallery: npt.ArrayLike, banks: Mapping[str, npt.ArrayLike], normalize: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The validated gallery and each validated bank (every bank is checked before any work)."""
    if not banks:
        raise InvalidInput("banks is empty: give at least one name -> query bank")
    g = as_embeddings(gallery, "gallery", normalize=normalize)
    return g, {name: as_embeddings(bank, f"query bank {name!r}", normalize=normalize, dim=g.shape[1]) for name, bank in banks.items()}


def bank_reports(evaluations: Mapping[str, Evaluation]) -> dict[str, BankReport]:
    """Each bank's coverage of the gallery as searched (distractors included), measured in its
    evaluation's fitting pass."""
    return {name: ev.bank for name, ev in evaluations.items() if ev.bank is not None}
