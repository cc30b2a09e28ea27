"""Retrieval metrics from ranks (NNN paper section 3; ECCV Caption for mAP@R).

For a query with scores s over the gallery, take a relevant item j and write

    a_j = #{i : s_i > s_j}    (items scoring above it),
    e_j = #{i : s_i = s_j}    (its tie group, j included),
    t_j = the relevant items of the query in that tie group, k_j = j's place among them
          counted by gallery index (1 for the lowest index, ..., t_j).

Three tie conventions (:data:`TIES`) give each relevant item a rank, never below its place m
among the query's relevant items in rank order (so AP@R <= 1), each equal to ``a_j + 1`` for an
item with no tie:

* ``"index"`` (the default): ties go to the lower gallery index, as every search in hubless
  orders results: rank(j) = 1 + a_j + #{i < j : s_i = s_j}. The ranks are the positions of a
  sorted list, distinct integers.
* ``"optimistic"``: the relevant items of a tie group come first in it, among themselves by
  index: rank(j) = a_j + k_j. One relevant item in a group: 1 + a_j (the first of the group,
  the "optimistically" of the collaborative-experts code and of VSE's t2i evaluation).
* ``"average"``: every order of a tie group is equally likely (McSherry & Najork 2008), and a
  relevant item's rank is the expected position of the k_j-th of the group's t_j relevant items,
  rank(j) = a_j + k_j (e_j + 1) / (t_j + 1) (the k-th smallest of t positions drawn from e).
  One relevant item in a group: a_j + (e_j + 1) / 2, the mean of the group's positions, as the
  collaborative-experts metric behind the QB-Norm tables (Bogolin et al. 2022) ranks it. A group
  of relevant items only (t_j = e_j): a_j + k_j, no position lost. Ranks can be fractional.

Where relevant items tie, the collaborative-experts code (``v2t_metrics``) gives each its group's
mean position, so two relevant captions tied at the top both rank 1.5 there and the query
counts as a miss at R@1, a case its authors flag as "worse than chance"; here they rank 1 and 2
under every convention: ties among relevant items never cost a hit.

:func:`relevant_ranks` gives the rank of every relevant item of a block of queries from their
score rows, so a whole evaluation streams query blocks and never sorts a row; :func:`tie_ranks`
turns the counts (a_j, e_j) and the relevant items' own scores into ranks, for numpy and for the
torch engine alike. From those ranks:

* R@K: percent of queries with a relevant item in the top K (for image->text, an image is a
  hit when any of its captions is). With fractional ("average") ranks, as in the
  collaborative-experts metric, R@1 counts a first rank of exactly 1 and R@K for K > 1 a first
  rank below K + 1 (a tie averaged to K + 0.5 still counts); integer ranks give rank <= K;
* MdR / MnR: median / mean rank of the first relevant item (1 is best), the papers' MedR and
  MeanR (collaborative-experts: median / mean of the 0-based positions, plus 1);
* MRR: mean of 1 / (rank of the first relevant item), in (0, 1];
* mAP@R: percent; for a query with R relevant items whose sorted ranks are r_1 <= ... <= r_R,
  AP@R = (1/R) sum_{m : r_m <= R} m / r_m (Musgrave et al. 2020; ECCV Caption, Chun et al. 2022),
  in [0, 100] since r_m >= m under every convention.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hubless._validation import check_positive_int
from hubless.errors import InvalidInput
from hubless.metrics.truth import Truth

__all__ = [
    "TIES",
    "PerQuery",
    "check_ks",
    "check_ties",
    "first_hit_ranks",
    "per_query_metrics",
    "recall_at_k",
    "relevant_ranks",
    "summarize",
    "tie_ranks",
]

#: Elements compared at once when counting ranks (bounds the temporary boolean arrays).
_COMPARE_ELEMENTS = 1 << 22

#: Tie conventions of :func:`relevant_ranks` (see the module docstring).
TIES = ("index", "average", "optimistic")


def check_ties(ties: str) -> str:
    if ties not in TIES:
        raise InvalidInput(f"ties must be one of {', '.join(TIES)}; got {ties!r}")
    return ties


def relevant_ranks(scores: np.ndarray, truth: Truth, ties: str = "index") -> np.ndarray:
    """Rank (1-based) of every relevant item, aligned with ``truth.indices``: int64, or float64
    for ``ties="average"`` (see the module docstring for the tie conventions).

    ``scores`` (n_queries, n_gallery) are the ranking scores of the queries ``truth`` describes.
    """
    check_ties(ties)
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape != (truth.n_queries, truth.n_gallery):
        raise InvalidInput(f"scores must be ({truth.n_queries}, {truth.n_gallery}); got {scores.shape}")
    rows, cols = truth.rows, truth.indices
    above = np.empty(cols.size, dtype=np.int64)
    equal = np.empty(cols.size, dtype=np.int64)
    targets = np.empty(cols.size, dtype=scores.dtype)
    one_each = cols.size == truth.n_queries  # one relevant item per query: rows are the queries
    step = max(1, _COMPARE_ELEMENTS // scores.shape[1])
    counts = np.int32 if scores.shape[1] < 2**31 else np.int64
    for start in range(0, cols.size, step):
        r, c = rows[start : start + step], cols[start : start + step]
        block = scores[start : start + r.size] if one_each else scores[r]
        target = block[np.arange(r.size), c][:, None]
        targets[start : start + r.size] = target[:, 0]
        above[start : start + r.size] = (block > target).sum(axis=1, dtype=counts)  # a bool sum in int32 is twice count_nonzero's speed
        if ties == "optimistic":
            continue
        equal_here = (block == target).sum(axis=1, dtype=counts)
        if ties == "index":  # ties (rare): count only the equal scores up to the item's own index
            tied = np.flatnonzero(equal_here > 1)
            if tied.size:
                before = np.arange(scores.shape[1])[None, :] <= c[tied, None]
                equal_here[tied] = np.count_nonzero((block[tied] == target[tied]) & before, axis=1)
        equal[start : start + r.size] = equal_here
    return tie_ranks(ties, above, equal, targets, truth.indptr)


def tie_ranks(ties: str, above: np.ndarray, equal: np.ndarray | None, targets: np.ndarray | None, indptr: np.ndarray) -> np.ndarray:
    """The ranks of the relevant items (CSR by query: ``indptr``, each query's items in index
    order) by the tie convention ``ties`` (module docstring) from ``above`` (a_j, the scores
    above each item's), ``equal`` (e_j, the scores equal to it, its own included; for
    ``"index"`` only those at an index up to its own; unused by ``"optimistic"``) and ``targets``
    (each item's own score, which tells the relevant items of one tie group apart; None when
    every query has one relevant item). int64, or float64 for ``"average"``."""
    above = np.asarray(above, dtype=np.int64)
    if ties == "index":
        assert equal is not None  # counted up to each item's index
        return above + np.asarray(equal, dtype=np.int64)
    place, size = _relevant_in_group(targets, indptr, above.size)
    if ties == "optimistic":
        return above + place
    assert equal is not None  # the size of each item's tie group
    return above + place * (np.asarray(equal, dtype=np.float64) + 1) / (size + 1)


def _relevant_in_group(targets: np.ndarray | None, indptr: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(k_j, t_j) of every relevant item: its place (1-based, by index) among the relevant items
    of its query that share its score, and their number."""
    if targets is None or n == indptr.size - 1:  # one relevant item per query
        ones = np.ones(n, dtype=np.int64)
        return ones, ones
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    order = np.lexsort((np.arange(n), targets, rows))  # by query, then score, then index
    new_group = np.ones(n, dtype=bool)
    new_group[1:] = (rows[order][1:] != rows[order][:-1]) | (targets[order][1:] != targets[order][:-1])
    starts = np.flatnonzero(new_group)
    sizes = np.diff(np.append(starts, n))
    place, size = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    place[order] = np.arange(n) - np.repeat(starts, sizes) + 1
    size[order] = np.repeat(sizes, sizes)
    return place, size


class PerQuery:
    """Per-query values from the ranks of the relevant items: ``first_rank`` (n_queries,) and
    ``ap_at_r`` (n_queries,), the inputs of every summary and bootstrap."""

    def __init__(self, ranks: np.ndarray, truth: Truth) -> None:
        ranks = np.asarray(ranks)
        ranks = ranks.astype(np.float64 if ranks.dtype.kind == "f" else np.int64, copy=False)  # "average" ties: fractional
        if ranks.shape != truth.indices.shape:
            raise InvalidInput("ranks must align with truth.indices")
        rows, counts = truth.rows, truth.counts
        if ranks.size == counts.size:  # one relevant item per query: its rank is the first, AP@R = 1/rank at rank 1
            self.first_rank = ranks.copy()
            self.ap_at_r = np.where(ranks <= 1, 1.0 / ranks, 0.0)
            return
        self.first_rank = np.minimum.reduceat(ranks, truth.indptr[:-1])
        # Position m (1-based) of each relevant rank within its query, in rank order.
        order = np.lexsort((ranks, rows))
        sorted_ranks = ranks[order]
        m = np.arange(ranks.size) - np.repeat(truth.indptr[:-1], counts) + 1
        r_of_query = np.repeat(counts, counts)
        gain = np.where(sorted_ranks <= r_of_query, m / sorted_ranks, 0.0)
        self.ap_at_r = np.add.reduceat(gain, truth.indptr[:-1]) / counts

    def __len__(self) -> int:
        return self.first_rank.size


def per_query_metrics(per_query: PerQuery, ks: Sequence[int]) -> dict[str, np.ndarray]:
    """Per-query arrays whose mean (median for MdR) is each metric: ``R@K`` hits in percent,
    ``MnR``/``MdR`` first ranks, ``MRR`` reciprocal ranks, ``mAP@R`` AP@R in percent."""
    first = per_query.first_rank
    values: dict[str, np.ndarray] = {f"R@{k}": recall_percent(first, k) for k in ks}
    values["MdR"] = first.astype(np.float64)
    values["MnR"] = first.astype(np.float64)
    values["MRR"] = 1.0 / first
    values["mAP@R"] = 100.0 * per_query.ap_at_r
    return values


def summarize(values: dict[str, np.ndarray]) -> dict[str, float]:
    """Each metric from its per-query values: median for MdR, mean for the rest."""
    return {name: float(np.median(v) if name == "MdR" else np.mean(v)) for name, v in values.items()}


def check_ks(ks: Sequence[int], n_gallery: int) -> tuple[int, ...]:
    """The cut-offs K of R@K, sorted and unique; each in [1, n_gallery]."""
    ks = tuple(sorted({check_positive_int(k, "ks") for k in ks}))
    if not ks:
        raise InvalidInput("ks must list at least one K, e.g. 1,5,10")
    if ks[-1] > n_gallery:
        raise InvalidInput(f"K={ks[-1]} is larger than the gallery ({n_gallery} items)")
    return ks


def recall_percent(first_rank: np.ndarray, k: int) -> np.ndarray:
    """Per-query R@K hits in percent (100 or 0) from the rank of each query's first relevant item.

    Integer ranks: rank <= K. Fractional ("average" ties) ranks follow the collaborative-experts
    metric of the QB-Norm tables: R@1 needs rank 1 exactly, R@K for K > 1 a rank below K + 1."""
    first_rank = np.asarray(first_rank)
    if first_rank.dtype.kind == "f" and k > 1:
        return 100.0 * (first_rank < k + 1)
    return 100.0 * (first_rank <= k)


def first_hit_ranks(ranked_ids: np.ndarray, truth: Truth) -> np.ndarray:
    """1-based position of the first relevant item in each query's ranked list (n_queries,),
    or a value beyond any K when the list holds none. An unfilled slot (id -1, see
    :func:`hubless._validation.check_top_k`) is never a hit."""
    ranked_ids = np.asarray(ranked_ids)
    if ranked_ids.ndim != 2 or ranked_ids.shape[0] != truth.n_queries:
        raise InvalidInput(f"ranked_ids must be ({truth.n_queries}, n_ranked); got {ranked_ids.shape}")
    # Membership of (query, item) pairs, encoded as query * n_gallery + item.
    pairs = np.arange(ranked_ids.shape[0])[:, None] * truth.n_gallery + ranked_ids
    hits = np.isin(pairs, truth.rows * truth.n_gallery + truth.indices) & (ranked_ids >= 0)  # -1 would read the previous query's last item
    return np.where(hits.any(axis=1), hits.argmax(axis=1) + 1, np.iinfo(np.int64).max)


def recall_at_k(ranked_ids: np.ndarray, relevant, k: int) -> float:
    """R@K in percent from ranked lists: the share of queries with a relevant item among the
    first ``k`` of ``ranked_ids[i]`` (n_queries, >= k). ``relevant``: a :class:`Truth` or one
    relevant gallery id per query."""
    ranked_ids = np.asarray(ranked_ids)
    if ranked_ids.ndim != 2:
        raise InvalidInput("ranked_ids must be (n_queries, n_ranked)")
    if not 1 <= k <= ranked_ids.shape[1]:
        raise InvalidInput(f"k={k} must be between 1 and the number of ranked items ({ranked_ids.shape[1]})")
    if not isinstance(relevant, Truth):
        relevant = np.asarray(relevant)
        if relevant.shape != (ranked_ids.shape[0],):
            raise InvalidInput("relevant must hold one gallery id per query (or be a Truth)")
        relevant = Truth.from_labels(relevant, int(max(relevant.max(), ranked_ids.max())) + 1)
    return float(recall_percent(first_hit_ranks(ranked_ids, relevant), k).mean())
