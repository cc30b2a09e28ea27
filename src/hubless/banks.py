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
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from hubless._validation import as_embeddings, check_positive_int
from hubless.engine.statistics import nearest_gallery_items
from hubless.errors import InvalidInput
from hubless.metrics.hubness import skewness

__all__ = ["BankReport", "LOW_COVERAGE", "adversarial_bank", "bank_report", "coverage_warning", "nearest_items"]

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
    def warning(self) -> str | None:
        return coverage_warning(self.relative_coverage, self.distinct_items, self.n_bank)


def coverage_warning(relative_coverage: float, distinct_items: int, n_bank: int) -> str | None:
    """The warning a low-coverage bank deserves, naming the risk and the robust methods."""
    if relative_coverage >= LOW_COVERAGE:
        return None
    return (
        f"the query bank's {n_bank:,} queries find only {distinct_items:,} distinct nearest gallery items "
        f"({relative_coverage:.0%} of what a bank this size could reach; below {LOW_COVERAGE:.0%} is low): corrections such as "
        f"IS, CSLS, NNN and DualIS may hurt with it (Bogolin et al. 2022, Table 2); "
        f"{' and '.join(m.upper() for m in ROBUST_METHODS)} are robust to such banks"
    )


def nearest_items(gallery, bank, *, normalize: bool = True) -> np.ndarray:
    """The nearest gallery item of each bank query (ties: lower index), int64 (n_bank,)."""
    g = as_embeddings(gallery, "gallery", normalize=normalize)
    b = as_embeddings(bank, "query bank", normalize=normalize, dim=g.shape[1])
    return nearest_gallery_items(b, g, 1)[1][:, 0]


def bank_report(gallery, query_bank, *, queries=None, normalize: bool = True) -> BankReport:
    """Coverage, N_1 skewness and (with ``queries``, a sample of real queries) the shift of a
    query bank over a gallery."""
    g = as_embeddings(gallery, "gallery", normalize=normalize)
    b = as_embeddings(query_bank, "query bank", normalize=normalize, dim=g.shape[1])
    nearest = nearest_gallery_items(b, g, 1)[1][:, 0]
    n1 = np.bincount(nearest, minlength=g.shape[0])
    distinct = int(np.count_nonzero(n1))
    shift = None
    if queries is not None:
        q = as_embeddings(queries, "queries", normalize=normalize, dim=g.shape[1])
        mb, mq = b.mean(axis=0, dtype=np.float64), q.mean(axis=0, dtype=np.float64)
        denom = np.linalg.norm(mb) * np.linalg.norm(mq)
        shift = float(1.0 - mb @ mq / denom) if denom > 0 else 1.0
    reach = min(b.shape[0], g.shape[0])
    return BankReport(
        int(g.shape[0]), int(b.shape[0]), distinct / g.shape[0], distinct, distinct / reach, skewness(n1), int(n1.max()), shift
    )


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
