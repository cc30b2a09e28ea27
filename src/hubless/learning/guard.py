"""Whether a refit may be served: :func:`judge`, under :class:`GuardSettings`.

A refit on a learned bank is kept only if

1. the hubness of recent queries it was *not* fitted on (the reservoir's held-out queries,
   searched with the current version and with the refit, top 10) is no worse: the skewness of
   N_10 (how often each item is in a query's top 10; Radovanovic et al. 2010) may not rise by
   more than ``max_skewness_increase``, and the largest hub's share of all top-10 results may
   not rise by more than ``max_hub_share_increase`` (:mod:`hubless.metrics.hubness`), beyond
   sampling noise: a rise counts when it exceeds the bound by 1.645 standard errors (one-sided
   95%), the error from a paired bootstrap over the held-out queries (both versions on the same
   resampled queries). A few hundred held-out queries measure N_10 skewness to about +-0.1, and
   banks of the same traffic move it that much by themselves (measured: 0.59 to 0.79 for
   in-domain banks of 1,000 to 9,000 queries on the synthetic benchmark);
2. no item's corrected score moved by more than a bound *relative to the others*: with
   ranking(q, r) = s(q, r) - W . bias(r), a shift common to every item changes no ranking, so
   the move of item r is m(r) = W x |delta bias(r) - median delta bias| per bias column (in the
   units of the similarity). The bound is ``max_bias_shift`` or, when larger,
   ``max_bias_outlier`` robust standard deviations of the moves (1.4826 x their median absolute
   deviation): a bank that follows a change of domain moves most items, each within a few
   deviations of the others (measured on ``benchmarks/traffic_bank.py``: at most 6), while a
   bank crafted to demote or promote one item moves it far outside them.

Otherwise the refit is rejected, with each reason in words. Figures of both versions (N_1 and
N_10 skewness, the largest hubs) are returned either way: the service shows them over time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from hubless.errors import InvalidInput
from hubless.metrics.hubness import hubness_statistics

__all__ = ["GuardSettings", "Judgement", "bias_shift", "hubness_figures", "judge", "paired_errors"]


@dataclass(frozen=True)
class GuardSettings:
    """The bounds of :func:`judge` (see the module docstring). ``min_holdout``: held-out
    queries needed to judge hubness at all (fewer: no refit is tried)."""

    max_skewness_increase: float = 0.05
    max_hub_share_increase: float = 0.005
    max_bias_shift: float = 0.05
    max_bias_outlier: float = 8.0
    min_holdout: int = 50
    top_k: int = 10

    def __post_init__(self) -> None:
        for name in ("max_skewness_increase", "max_hub_share_increase", "max_bias_shift", "max_bias_outlier"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value) and value >= 0):
                raise InvalidInput(f"{name} must be a number >= 0; got {value!r}")
        if self.min_holdout < 1 or self.top_k < 1:
            raise InvalidInput("min_holdout and top_k must be >= 1")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Judgement:
    """A guard's verdict: ``accepted``, the ``reasons`` against (empty when accepted), the
    hubness of the held-out queries ``before`` (current version) and ``after`` (the refit), and
    the largest relative bias move with the item that moved, and the bound it was held to."""

    accepted: bool
    reasons: tuple[str, ...]
    before: dict
    after: dict
    bias_shift: float
    bias_bound: float
    moved_item: int | None

    def to_dict(self) -> dict:
        return {
            "accepted": self.accepted,
            "reasons": list(self.reasons),
            "before": self.before,
            "after": self.after,
            "bias_shift": self.bias_shift,
            "bias_bound": self.bias_bound,
            "moved_item": self.moved_item,
        }


#: Standard errors a rise of hubness must exceed its bound by to count (one-sided 95%).
Z = 1.645
#: Paired bootstrap resamples of the held-out queries.
RESAMPLES = 200


def hubness_figures(index, queries: np.ndarray, top_k: int = 10, hubs: int = 5) -> dict:
    """N_1 and N_10 skewness of ``queries``' results in ``index``, the largest hub's share of
    the top-``top_k`` results, and the ``hubs`` most frequent items (id, N_10)."""
    return _figures(index, queries, top_k, hubs)[0]


def _figures(index, queries: np.ndarray, top_k: int, hubs: int = 5) -> tuple[dict, np.ndarray]:
    """:func:`hubness_figures` and the results' positions in the index, (n_queries, top_k)."""
    if index.ntotal < top_k:
        raise InvalidInput(f"the index has {index.ntotal} items: fewer than the top {top_k} the guard measures")
    ids = index.search(queries, top_k)[1]
    positions = index.positions(ids).reshape(ids.shape)  # every slot filled: top_k <= the items
    stats = hubness_statistics(positions, index.ntotal, ks=(1, top_k))
    counts = np.bincount(positions.ravel(), minlength=index.ntotal)
    order = np.argsort(-counts, kind="stable")[:hubs]
    return {
        "queries": int(queries.shape[0]),
        "n1_skewness": stats["N1_skewness"],
        f"n{top_k}_skewness": stats[f"N{top_k}_skewness"],
        "top_hub_share": float(counts.max() / max(1, positions.size)),
        "hubs": [{"id": int(index.ids[j]), f"n{top_k}": int(counts[j])} for j in order if counts[j] > 0],
    }, positions


def paired_errors(before: np.ndarray, after: np.ndarray, n_items: int, seed: int = 0) -> tuple[float, float]:
    """Standard errors of the change of N_k skewness and of the largest hub's share between two
    rankings of the same queries (positions, (n_queries, k)), by a paired bootstrap: both
    rankings counted on the same resampled queries, :data:`RESAMPLES` times."""
    from hubless.metrics.hubness import skewness

    rng = np.random.default_rng(seed)
    n, k = before.shape
    changes = np.empty((RESAMPLES, 2))
    for b in range(RESAMPLES):
        weight = np.repeat(np.bincount(rng.integers(0, n, n), minlength=n), k)
        counts = [np.bincount(r.ravel(), weights=weight, minlength=n_items) for r in (before, after)]
        changes[b] = (skewness(counts[1]) - skewness(counts[0]), (counts[1].max() - counts[0].max()) / (n * k))
    return float(changes[:, 0].std()), float(changes[:, 1].std())


def bias_shift(before: np.ndarray, after: np.ndarray, weight: float) -> tuple[float, int, float]:
    """The largest move of one item's corrected score relative to the others' (see the module
    docstring) between bias columns ``before`` and ``after`` (same items, same order), the
    position of that item, and the moves' robust standard deviation (1.4826 x MAD)."""
    if before.shape != after.shape or before.size == 0:
        raise InvalidInput(f"bias columns of {before.shape} and {after.shape}: the same items are needed")
    delta = after.astype(np.float64) - before
    moved = np.abs(delta - np.median(delta, axis=0)).max(axis=1) * abs(float(weight))
    worst = int(np.argmax(moved))
    return float(moved[worst]), worst, float(1.4826 * np.median(moved))


def judge(current, refit, holdout: np.ndarray, bias_before: np.ndarray, bias_after: np.ndarray, settings: GuardSettings) -> Judgement:
    """Judge the ``refit`` index against the ``current`` one (both searchable, the same items)
    on the held-out queries ``holdout``, and their bias columns (see the module docstring)."""
    k = settings.top_k
    (before, at_before), (after, at_after) = _figures(current, holdout, k), _figures(refit, holdout, k)
    se_skew, se_share = paired_errors(at_before, at_after, current.ntotal)
    before["n10_skewness_se"], before["top_hub_share_se"] = se_skew, se_share  # of the change: the same for both
    shift, worst, spread = bias_shift(bias_before, bias_after, current.weight)
    bound = max(settings.max_bias_shift, settings.max_bias_outlier * spread)
    reasons = []
    skew = f"n{k}_skewness"
    if after[skew] - before[skew] - Z * se_skew > settings.max_skewness_increase:
        reasons.append(
            f"N{k} skewness of {holdout.shape[0]} held-out queries rose from {before[skew]:.3f} to {after[skew]:.3f} "
            f"(standard error {se_skew:.3f}; allowed: +{settings.max_skewness_increase:g} beyond {Z} errors)"
        )
    if after["top_hub_share"] - before["top_hub_share"] - Z * se_share > settings.max_hub_share_increase:
        reasons.append(
            f"the largest hub's share of the top-{k} results rose from {before['top_hub_share']:.4f} to "
            f"{after['top_hub_share']:.4f} (standard error {se_share:.4f}; allowed: +{settings.max_hub_share_increase:g} beyond {Z} errors)"
        )
    moved = int(current.ids[worst])
    if shift > bound:
        reasons.append(
            f"item {moved}'s corrected score moved by {shift:.3f} relative to the others (allowed: {bound:.3f}, "
            f"{settings.max_bias_outlier:g} robust deviations of the moves or {settings.max_bias_shift:g})"
        )
    return Judgement(not reasons, tuple(reasons), before, after, shift, bound, moved)
