"""Associative merges of bank statistics: the one place that combines partial statistics.

Bank statistics are reductions over (gallery item, bank item) pairs, so statistics of disjoint
parts combine without revisiting a pair:

* the same gallery items against two disjoint parts of a bank (:func:`merge_bank_parts`): each
  item's top-k is the top-k of its two top-k lists, its log-sum-exp is ``logaddexp`` of the two
  (float64), its sorted probes are the two sorted lists merged, the bank mean is re-weighted by
  the part sizes, and the bank items' own activation top-k lists are stacked in bank order;
* two disjoint parts of the gallery against the same banks (:func:`merge_gallery_parts`): the
  per-item arrays are stacked, the gallery mean re-weighted, and each bank item's activation
  top-k is the top-k (value descending, lower gallery id first) of its two lists.

Every merge is commutative up to float rounding of the log-sum-exp and the means (the top-k
merges are exact: ties go to the lower id whatever the order), so parts may arrive in any order.
The incremental updates (:mod:`hubless.engine.updates`, adding items or bank queries) and the
distributed fit (:mod:`hubless.distributed`, tiles of gallery shard x bank shard) both use them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hubless.engine.statistics import BankStatistics
from hubless.engine.topk import NO_ID
from hubless.errors import InvalidInput

__all__ = [
    "merge_bank_parts",
    "merge_gallery_parts",
    "merge_mean",
    "merge_sorted_rows",
    "merge_topk_ids",
    "merge_topk_values",
]


def merge_topk_values(a: np.ndarray, b: np.ndarray, k: int | None = None) -> np.ndarray:
    """The ``k`` largest values of each row of ``[a, b]``, descending (k: a's width by default)."""
    k = a.shape[1] if k is None else k
    both = np.concatenate([a, b], axis=1)
    if both.shape[1] > k:
        both = np.partition(both, both.shape[1] - k, axis=1)[:, both.shape[1] - k :]
    return -np.sort(-both, axis=1)


def merge_topk_ids(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], k: int | None = None):
    """Top-``k`` of each row of two (values, ids) lists, by value descending then id ascending
    (empty slots: -inf with id ``NO_ID``): the same order a single pass gives. ``k`` defaults to
    the wider list's width; a result with fewer than ``k`` candidates keeps empty slots."""
    k = max(a[0].shape[1], b[0].shape[1]) if k is None else k
    values = np.concatenate([a[0], b[0]], axis=1)
    ids = np.concatenate([a[1], b[1]], axis=1)
    if values.shape[1] < k:
        pad = k - values.shape[1]
        values = np.pad(values, ((0, 0), (0, pad)), constant_values=-np.inf)
        ids = np.pad(ids, ((0, 0), (0, pad)), constant_values=NO_ID)
    order = np.lexsort((ids, -values), axis=1)[:, :k]
    return np.take_along_axis(values, order, axis=1), np.take_along_axis(ids, order, axis=1)


def merge_sorted_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row of ``a`` and ``b`` (sorted ascending) as one sorted row."""
    return np.sort(np.concatenate([a, b], axis=1), axis=1)


def merge_mean(mean_a: np.ndarray, n_a: int, mean_b: np.ndarray, n_b: int) -> np.ndarray:
    """The float64 mean of two parts of ``n_a`` and ``n_b`` rows from their means."""
    if n_a + n_b == 0:
        return np.asarray(mean_a, np.float64)
    return (np.asarray(mean_a, np.float64) * n_a + np.asarray(mean_b, np.float64) * n_b) / (n_a + n_b)


def offset_ids(ids: np.ndarray, offset: int) -> np.ndarray:
    """Gallery ids of a part moved by ``offset`` (empty slots keep ``NO_ID``)."""
    return np.where(ids == NO_ID, NO_ID, ids + offset)


def merge_bank_parts(a: BankStatistics, b: BankStatistics, side: str = "query") -> BankStatistics:
    """Statistics of the same gallery items against the ``side`` bank ("query" or "gallery")
    made of ``a``'s bank items followed by ``b``'s. Only that side's fields are merged; the
    other side's are taken from ``a``."""
    if side not in ("query", "gallery"):
        raise InvalidInput(f"side must be 'query' or 'gallery'; got {side!r}")
    if a.n_gallery != b.n_gallery:
        raise InvalidInput(f"bank parts describe {a.n_gallery} and {b.n_gallery} gallery items; they must be the same items")
    n_a, n_b = getattr(a, f"n_{side}_bank") or 0, getattr(b, f"n_{side}_bank") or 0
    out = replace(a)
    setattr(out, f"n_{side}_bank", n_a + n_b)
    setattr(out, f"{side}_bank_mean", merge_mean(getattr(a, f"{side}_bank_mean"), n_a, getattr(b, f"{side}_bank_mean"), n_b))
    lse_a, lse_b = getattr(a, f"{side}_lse"), getattr(b, f"{side}_lse")
    setattr(out, f"{side}_lse", {beta: np.logaddexp(lse_a[beta], lse_b[beta]) for beta in lse_a})
    if side == "query":
        if a.query_topk is not None and b.query_topk is not None:
            out.query_topk = merge_topk_values(a.query_topk, b.query_topk)
        if a.query_probes is not None and b.query_probes is not None:
            out.query_probes = merge_sorted_rows(a.query_probes, b.query_probes)
    ids_a = getattr(a, f"{side}_activation")
    if ids_a is not None:
        setattr(out, f"{side}_activation", np.concatenate([ids_a, getattr(b, f"{side}_activation")]))
        scores = (getattr(a, f"{side}_activation_scores"), getattr(b, f"{side}_activation_scores"))
        setattr(out, f"{side}_activation_scores", np.concatenate(scores))
    return out


def merge_gallery_parts(a: BankStatistics, b: BankStatistics) -> BankStatistics:
    """Statistics of ``a``'s gallery items followed by ``b``'s, against the same banks (``b``'s
    activation ids count from its own first item and are moved by ``a.n_gallery``)."""
    if (a.n_query_bank, a.n_gallery_bank) != (b.n_query_bank, b.n_gallery_bank):
        raise InvalidInput("gallery parts were computed against banks of different sizes")

    def stack(x, y):
        return None if x is None else np.concatenate([x, y])

    out = replace(
        a,
        n_gallery=a.n_gallery + b.n_gallery,
        gallery_mean=merge_mean(a.gallery_mean, a.n_gallery, b.gallery_mean, b.n_gallery),
        query_topk=stack(a.query_topk, b.query_topk),
        query_probes=stack(a.query_probes, b.query_probes),
        query_lse={beta: np.concatenate([v, b.query_lse[beta]]) for beta, v in a.query_lse.items()},
        gallery_lse={beta: np.concatenate([v, b.gallery_lse[beta]]) for beta, v in a.gallery_lse.items()},
    )
    for side in ("query", "gallery"):
        ids = getattr(a, f"{side}_activation")
        if ids is None:
            continue
        values, merged = merge_topk_ids(
            (getattr(a, f"{side}_activation_scores"), ids),
            (getattr(b, f"{side}_activation_scores"), offset_ids(getattr(b, f"{side}_activation"), a.n_gallery)),
        )
        setattr(out, f"{side}_activation_scores", values)
        setattr(out, f"{side}_activation", merged)
    return out
