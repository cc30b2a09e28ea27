"""Know your reference bank before you deploy it: coverage diagnostics and adversarial banks.

The QB-Norm paper (Bogolin et al. 2022, section 4.3 and Table 2) shows that a query bank helps
only when it probes the gallery's hubs: a bank whose queries retrieve few distinct gallery items
(from another domain, or chosen adversarially) makes IS, CSLS and similar corrections harmful,
while DIS (and GC) stay robust. Two tools follow that analysis:

* :func:`bank_report`: the bank's *coverage* (share of gallery items that are some bank query's
  nearest neighbour) and its *relative coverage* (distinct nearest items over the most a bank
  of that size could reach, min(n_bank, n_gallery): a 1,000-query bank covers at most 20% of
  5,000 items, and is judged against that), the skewness of N_1 (how often each gallery item is a bank query's nearest
  neighbour), and, given a sample of real queries, a distribution-shift score between the bank
  and them: 1 - cos(mean bank embedding, mean query embedding), 0 when they are centred alike.
* :func:`adversarial_bank`: the paper's adversarial bank, the ``n`` candidate queries whose
  nearest gallery items cover the fewest distinct items (all queries of the most retrieved items
  first, which is the exact minimum).

Low coverage alone does not mean harm: in a hubby gallery the hubs are many queries' nearest
item, so a good in-domain bank can cover little while every correction gains (the adversarial
bank of ``benchmarks/bank_robustness.py`` covers 25% of its reach and NNN still gains a point).
So the warning (:func:`coverage_warning`) cites the paper before anything is measured (``bank
check``, ``index build``), and once corrections are measured with the bank (``eval``, ``tune``)
it fires only when some of them did worse than the baseline with a low-coverage bank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from hubless._validation import as_embeddings, check_positive_int
from hubless.engine.statistics import BankStatistics, StatisticsRequest, compute_statistics, nearest_gallery_items
from hubless.errors import InvalidInput
from hubless.metrics.hubness import skewness

__all__ = ["BankReport", "LOW_COVERAGE", "adversarial_bank", "bank_report", "coverage_report", "coverage_warning", "nearest_items"]

#: Below this relative coverage a bank probes few of the items it could reach: the regime of the
#: paper's adversarial bank (measured on the text proxy: in-domain banks reach 0.6-0.8).
LOW_COVERAGE = 0.3
#: Methods the QB-Norm paper finds robust to poor banks.
ROBUST_METHODS = ("dis", "gc")


@dataclass
class BankReport:
    """What :func:`bank_report` measures (see the module docstring)."""

    n_gallery: int
    n_bank: int
    coverage: float  # share of gallery items that are some bank query's nearest neighbour
    distinct_items: int  # how many gallery items that is
    relative_coverage: float  # distinct_items / min(n_bank, n_gallery): the share of what a bank this size could reach
    n1_skewness: float  # skewness of N_1 under the bank
    n1_max: int  # most bank queries sharing one nearest item
    shift: float | None = None  # 1 - cos(mean bank, mean queries), when queries are given

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def low(self) -> bool:
        """Whether the relative coverage is below :data:`LOW_COVERAGE`."""
        return self.relative_coverage < LOW_COVERAGE

    @property
    def warning(self) -> str | None:
        """The warning a low-coverage bank deserves before anything is measured with it."""
        return coverage_warning(self)

    def warning_after(self, losses: Sequence[str], metric: str = "R@1") -> str | None:
        """The warning once the corrections were measured with this bank: only when ``losses``
        (the methods that did significantly worse than the baseline on ``metric``) is not empty
        and the coverage is low. A low-coverage bank with which every correction gains (hubby
        galleries often give one: their hubs are many queries' nearest item) warrants none."""
        return coverage_warning(self, losses, metric)


def coverage_warning(report: BankReport, losses: Sequence[str] | None = None, metric: str = "R@1") -> str | None:
    """The warning a low-coverage bank deserves, or None.

    ``losses`` None (nothing measured yet: ``bank check``, ``index build``): a warning when the
    relative coverage is below :data:`LOW_COVERAGE`, saying what the QB-Norm paper saw with such
    banks and how to check. ``losses`` given (``eval``, ``tune``): a warning only when some
    methods lost ``metric`` against the baseline *and* the coverage is low: the measurement,
    not the coverage, says whether the bank hurts.
    """
    if not report.low or (losses is not None and not losses):
        return None
    reach = (
        f"{report.n_bank:,} queries find only {report.distinct_items:,} distinct nearest gallery items "
        f"({report.relative_coverage:.0%} of what a bank this size could reach; below {LOW_COVERAGE:.0%} is low)"
    )
    robust = " and ".join(m.upper() for m in ROBUST_METHODS)
    if losses is None:
        return (
            f"the query bank's {reach}: with such banks the QB-Norm paper (Bogolin et al. 2022, Table 2) saw IS, CSLS and "
            f"similar corrections lose accuracy ({robust} less so); measure with held-out queries before relying on it (hubless eval)"
        )
    return (
        f"{', '.join(losses)} did worse than the baseline on {metric} with this query bank, whose {reach}: the QB-Norm paper "
        f"(Bogolin et al. 2022, Table 2) traces such losses to low-coverage banks; a bank closer to the queries, or {robust}, may do better"
    )


def nearest_items(gallery, bank, *, normalize: bool = True) -> np.ndarray:
    """The nearest gallery item of each bank query (ties: lower index), int64 (n_bank,)."""
    g = as_embeddings(gallery, "gallery", normalize=normalize)
    b = as_embeddings(bank, "query bank", normalize=normalize, dim=g.shape[1])
    return nearest_gallery_items(b, g, 1)[1][:, 0]


def coverage_report(statistics: BankStatistics, *, queries=None) -> BankReport:
    """The coverage report of bank statistics computed with ``query_nearest`` (the same pass
    that fits the corrections: :func:`hubless.corrections.fit_shared`); ``queries`` (validated,
    optional): also the shift of the bank from them."""
    if statistics.query_nearest is None:
        raise InvalidInput("these statistics hold no nearest gallery items; compute them with StatisticsRequest(query_nearest=True)")
    n_gallery, n_bank = statistics.n_gallery, statistics.n_query_bank
    n1 = np.bincount(statistics.query_nearest, minlength=n_gallery)
    distinct = int(np.count_nonzero(n1))
    shift = None
    if queries is not None:
        mb, mq = statistics.query_bank_mean, queries.mean(axis=0, dtype=np.float64)
        denom = np.linalg.norm(mb) * np.linalg.norm(mq)
        shift = float(1.0 - mb @ mq / denom) if denom > 0 else 1.0
    reach = min(n_bank, n_gallery)
    return BankReport(n_gallery, n_bank, distinct / n_gallery, distinct, distinct / reach, skewness(n1), int(n1.max()), shift)


def bank_report(gallery, query_bank, *, queries=None, normalize: bool = True) -> BankReport:
    """Coverage, N_1 skewness and (with ``queries``, a sample of real queries) the shift of a
    query bank over a gallery: one streamed gallery x bank pass (the pass that fits the
    corrections computes the same figures when asked, see :func:`coverage_report`)."""
    g = as_embeddings(gallery, "gallery", normalize=normalize)
    b = as_embeddings(query_bank, "query bank", normalize=normalize, dim=g.shape[1])
    q = None if queries is None else as_embeddings(queries, "queries", normalize=normalize, dim=g.shape[1])
    return coverage_report(compute_statistics(g, b, None, StatisticsRequest(query_nearest=True)), queries=q)


def adversarial_bank(gallery, candidates, n: int, *, normalize: bool = True) -> np.ndarray:
    """Indices (into ``candidates``) of the ``n`` candidate queries whose nearest gallery items
    cover the fewest distinct items: whole groups of queries sharing a nearest item, largest
    group first (ties: lower item id; within a group, lower candidate index first)."""
    n = check_positive_int(n, "n")
    nearest = nearest_items(gallery, candidates, normalize=normalize)
    if n > nearest.size:
        raise InvalidInput(f"n={n} is more than the {nearest.size} candidate queries")
    sizes = np.bincount(nearest)
    # candidates ordered by (their item's group size descending, item id, candidate index)
    order = np.lexsort((np.arange(nearest.size), nearest, -sizes[nearest]))
    return np.sort(order[:n])
