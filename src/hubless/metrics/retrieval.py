"""Retrieval metrics from ranks (NNN paper section 3; ECCV Caption for mAP@R).

The rank of gallery item j for a query with scores s is

    rank(j) = 1 + #{i : s_i > s_j} + #{i < j : s_i = s_j}

(ties broken by the lower index, exactly as every search in hubless orders results).
:func:`relevant_ranks` gives the rank of every relevant item of a block of queries from their
score rows, so a whole evaluation streams query blocks and never sorts a row. From those ranks:

* R@K: percent of queries with a relevant item in the top K (for image->text, an image is a
  hit when any of its captions is);
* MdR / MnR: median / mean rank of the first relevant item (1 is best);
* MRR: mean of 1 / (rank of the first relevant item), in [0, 1];
* mAP@R: percent; for a query with R relevant items whose sorted ranks are r_1 < ... < r_R,
  AP@R = (1/R) sum_{m : r_m <= R} m / r_m (Musgrave et al. 2020; ECCV Caption, Chun et al. 2022).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hubless.metrics.truth import Truth

__all__ = ["PerQuery", "per_query_metrics", "recall_at_k", "relevant_ranks", "summarize"]

#: Elements compared at once when counting ranks (bounds the temporary boolean arrays).
_COMPARE_ELEMENTS = 1 << 22


def relevant_ranks(scores: np.ndarray, truth: Truth) -> np.ndarray:
    """Rank (1-based) of every relevant item, aligned with ``truth.indices``.

    ``scores`` (n_queries, n_gallery) are the ranking scores of the queries ``truth`` describes.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape != (truth.n_queries, truth.n_gallery):
        raise ValueError(f"scores must be ({truth.n_queries}, {truth.n_gallery}); got {scores.shape}")
    rows, cols = truth.rows, truth.indices
    ranks = np.empty(cols.size, dtype=np.int64)
    step = max(1, _COMPARE_ELEMENTS // scores.shape[1])
    for start in range(0, cols.size, step):
        r, c = rows[start : start + step], cols[start : start + step]
        block = scores[r]
        target = block[np.arange(r.size), c][:, None]
        above = np.count_nonzero(block > target, axis=1)
        equal = np.count_nonzero(block == target, axis=1)
        # Ties (rare): count only the equal scores at a lower index.
        tied = np.flatnonzero(equal > 1)
        if tied.size:
            before = np.arange(scores.shape[1])[None, :] < c[tied, None]
            equal[tied] = np.count_nonzero((block[tied] == target[tied]) & before, axis=1) + 1
        ranks[start : start + r.size] = above + equal
    return ranks


class PerQuery:
    """Per-query values from the ranks of the relevant items: ``first_rank`` (n_queries,) and
    ``ap_at_r`` (n_queries,), the inputs of every summary and bootstrap."""

    def __init__(self, ranks: np.ndarray, truth: Truth) -> None:
        ranks = np.asarray(ranks, dtype=np.int64)
        if ranks.shape != truth.indices.shape:
            raise ValueError("ranks must align with truth.indices")
        rows, counts = truth.rows, truth.counts
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
    values: dict[str, np.ndarray] = {f"R@{k}": 100.0 * (first <= k) for k in ks}
    values["MdR"] = first.astype(np.float64)
    values["MnR"] = first.astype(np.float64)
    values["MRR"] = 1.0 / first
    values["mAP@R"] = 100.0 * per_query.ap_at_r
    return values


def summarize(values: dict[str, np.ndarray]) -> dict[str, float]:
    """Each metric from its per-query values: median for MdR, mean for the rest."""
    return {name: float(np.median(v) if name == "MdR" else np.mean(v)) for name, v in values.items()}


def recall_at_k(ranked_ids: np.ndarray, relevant: np.ndarray, k: int) -> float:
    """Recall@k in percent for one relevant item per query: the share of queries whose relevant
    item ``relevant[i]`` is among the first ``k`` of ``ranked_ids[i]`` (n_queries, >= k)."""
    ranked_ids = np.asarray(ranked_ids)
    relevant = np.asarray(relevant)
    if ranked_ids.ndim != 2 or relevant.shape != (ranked_ids.shape[0],):
        raise ValueError("ranked_ids must be (n_queries, n_ranked) and relevant (n_queries,)")
    if not 1 <= k <= ranked_ids.shape[1]:
        raise ValueError(f"k={k} must be between 1 and the number of ranked items ({ranked_ids.shape[1]})")
    hits = (ranked_ids[:, :k] == relevant[:, None]).any(axis=1)
    return float(100.0 * hits.mean())
