"""Fairness and utility metrics of rankings (SISPI, Gomez et al. 2025; VisoGender, Hall et al. 2023).

NDKL (normalised discounted cumulative KL divergence) of one query's ranked list of relevant
images with protected-attribute values a_1, a_2, ... (best first):

    NDKL = (1/Z) sum_{n=1..N} KL(D_n || D*) / log2(n + 1),   Z = sum_{n=1..N} 1 / log2(n + 1)

where D_n is the distribution of the attribute over the top n, D* the target (uniform unless
given), KL uses the natural log and 0 log 0 = 0. 0 is perfectly balanced at every depth.
Computed for all queries at once from cumulative one-hot counts (no loop over positions).
"""

from __future__ import annotations

import numpy as np

from hubless.errors import InvalidInput

__all__ = ["average_precision", "gender_bias_at_n", "joint_codes", "ndcg", "ndkl"]


def ndkl(codes: np.ndarray, n_values: int, *, lengths: np.ndarray | None = None, target: np.ndarray | None = None) -> np.ndarray:
    """NDKL of each row of ``codes`` (n_queries, N): attribute value codes in ``[0, n_values)``
    of each query's ranked relevant items, best first; rows shorter than N give their
    ``lengths`` (the rest is ignored). ``target``: (n_values,) distribution, default uniform.
    Returns (n_queries,) float64."""
    codes = np.asarray(codes)
    if codes.ndim != 2 or codes.shape[1] == 0:
        raise InvalidInput("codes must be (n_queries, N) with N >= 1")
    n_q, depth = codes.shape
    lengths = np.full(n_q, depth) if lengths is None else np.asarray(lengths)
    if (lengths < 1).any() or (lengths > depth).any():
        raise InvalidInput("every ranked list needs 1..N items")
    valid = np.arange(depth)[None, :] < lengths[:, None]
    if ((codes < 0) | (codes >= n_values))[valid].any():
        raise InvalidInput(f"attribute codes must be in [0, {n_values})")
    target = np.full(n_values, 1.0 / n_values) if target is None else np.asarray(target, dtype=np.float64)
    if target.shape != (n_values,) or (target <= 0).any() or not np.isclose(target.sum(), 1.0):
        raise InvalidInput("target must be a positive distribution over the attribute values")
    onehot = np.zeros((n_q, depth, n_values))
    rows, cols = np.nonzero(valid)
    onehot[rows, cols, codes[rows, cols]] = 1.0
    dist = np.cumsum(onehot, axis=1) / np.arange(1, depth + 1)[None, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(dist > 0, dist * np.log(dist / target), 0.0)
    kl = terms.sum(axis=2)
    discount = 1.0 / np.log2(np.arange(2, depth + 2))
    weighted = np.where(valid, kl * discount, 0.0).sum(axis=1)
    z = np.cumsum(discount)[lengths - 1]
    return weighted / z


def joint_codes(*codes: np.ndarray, sizes: list[int]) -> tuple[np.ndarray, int]:
    """Intersectional attribute: value (a, b, ...) -> a * |B| * ... + b ...; returns (codes, n_values)."""
    out = np.zeros_like(np.asarray(codes[0]))
    for c, size in zip(codes, sizes):
        out = out * size + np.asarray(c)
    return out, int(np.prod(sizes))


def ndcg(ranks: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """NDCG over the whole gallery with binary relevance, per query: ``ranks`` are the 1-based
    ranks of each query's relevant items (CSR by ``indptr``).
    DCG = sum_j 1/log2(rank_j + 1), normalised by the ideal DCG = sum_{i=1..R} 1/log2(i + 1)."""
    counts = np.diff(indptr)
    dcg = np.add.reduceat(1.0 / np.log2(np.asarray(ranks) + 1.0), indptr[:-1])
    ideal = np.cumsum(1.0 / np.log2(np.arange(2, counts.max() + 2)))[counts - 1]
    return dcg / ideal


def average_precision(ranks: np.ndarray, indptr: np.ndarray) -> np.ndarray:
    """AP over the whole gallery per query: mean over the relevant items, in rank order, of
    (how many relevant items rank at or above it) / (its rank)."""
    counts = np.diff(indptr)
    rows = np.repeat(np.arange(counts.size), counts)
    order = np.lexsort((ranks, rows))
    sorted_ranks = np.asarray(ranks)[order]
    m = np.arange(sorted_ranks.size) - np.repeat(indptr[:-1], counts) + 1
    return np.add.reduceat(m / sorted_ranks, indptr[:-1]) / counts


def gender_bias_at_n(top_codes: np.ndarray, masculine: int, feminine: int, n: int) -> np.ndarray:
    """VisoGender-style bias at n per query: (#masculine - #feminine) / n among the top n
    (NNN paper, section 3.3). ``top_codes`` (n_queries, >= n) gender codes of the ranked images."""
    top = np.asarray(top_codes)[:, :n]
    return ((top == masculine).sum(axis=1) - (top == feminine).sum(axis=1)) / n
