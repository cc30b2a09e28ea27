"""Keep bank statistics current as the gallery or a reference bank changes, without a full pass.

Every row statistic (the top-k, log-sum-exp and probes of a gallery item) depends only on that
item and the banks, and every activation set is a union of per-bank-item top-k lists. So:

* adding n_new gallery items computes their rows only (n_new x n_bank similarities) and merges
  each bank item's nearest new items into its stored top-k_a (n_bank x n_new);
* removing gallery items drops their rows; bank items whose top-k_a lost an item get it
  recomputed over the remaining gallery (only those bank items); the others are renumbered;
* adding n_new items to a bank (query or gallery) merges every gallery item's stored top-k with
  its similarities to the new items (a running top-k seeded with the stored one), combines
  log-sum-exps with logaddexp, merges the sorted probes, re-weights the bank mean and appends the
  new items' own top-k_a (n_gallery x n_new in all).

Each result equals :func:`~hubless.engine.compute_statistics` on the updated arrays up to float
rounding (tested). Arrays must be validated float32 (see :func:`hubless._validation.as_embeddings`);
the functions return new statistics and never modify their inputs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hubless.engine.statistics import BankStatistics, compute_statistics, nearest_gallery_items
from hubless.engine.stream import LogSumExp, SortedRows, TopK, stream_reduce

__all__ = ["add_bank_items", "add_gallery_items", "remove_gallery_items"]


def _weighted_mean(mean: np.ndarray, n: int, new: np.ndarray) -> np.ndarray:
    return (mean * n + new.sum(axis=0, dtype=np.float64)) / (n + new.shape[0])


def add_gallery_items(
    stats: BankStatistics,
    items: np.ndarray,
    query_bank: np.ndarray | None,
    gallery_bank: np.ndarray | None,
    *,
    progress: bool | None = None,
) -> BankStatistics:
    """Statistics of ``gallery + items`` from those of ``gallery`` and the same banks."""
    request = stats.request
    rows = compute_statistics(
        items, query_bank, gallery_bank, replace(request, query_activation_k=0, gallery_activation_k=0), progress=progress
    )
    n_old = stats.n_gallery
    out = replace(
        stats,
        n_gallery=n_old + items.shape[0],
        gallery_mean=_weighted_mean(stats.gallery_mean, n_old, items),
        query_lse={b: np.concatenate([v, rows.query_lse[b]]) for b, v in stats.query_lse.items()},
        gallery_lse={b: np.concatenate([v, rows.gallery_lse[b]]) for b, v in stats.gallery_lse.items()},
    )
    if stats.query_topk is not None:
        out.query_topk = np.concatenate([stats.query_topk, rows.query_topk])
    if stats.query_probes is not None:
        out.query_probes = np.concatenate([stats.query_probes, rows.query_probes])
    for side, bank in (("query", query_bank), ("gallery", gallery_bank)):
        ids = getattr(stats, f"{side}_activation")
        if ids is not None:
            scores = getattr(stats, f"{side}_activation_scores")
            new_scores, new_ids = nearest_gallery_items(
                bank, items, ids.shape[1], initial=(scores, ids), id_offset=n_old, progress=progress
            )
            setattr(out, f"{side}_activation", new_ids)
            setattr(out, f"{side}_activation_scores", new_scores)
    return out


def remove_gallery_items(
    stats: BankStatistics,
    gallery: np.ndarray,
    keep: np.ndarray,
    query_bank: np.ndarray | None,
    gallery_bank: np.ndarray | None,
    *,
    progress: bool | None = None,
) -> BankStatistics:
    """Statistics of ``gallery[keep]`` (``keep``: sorted positions) from those of ``gallery``.

    The banks are only read when an activation top-k lost an item (DIS, DualDIS).
    """
    removed = np.setdiff1d(np.arange(stats.n_gallery), keep)
    kept = gallery[keep]
    out = replace(
        stats,
        n_gallery=keep.size,
        gallery_mean=kept.mean(axis=0, dtype=np.float64),
        query_lse={b: v[keep] for b, v in stats.query_lse.items()},
        gallery_lse={b: v[keep] for b, v in stats.gallery_lse.items()},
    )
    if stats.query_topk is not None:
        out.query_topk = stats.query_topk[keep]
    if stats.query_probes is not None:
        out.query_probes = stats.query_probes[keep]
    for side, bank in (("query", query_bank), ("gallery", gallery_bank)):
        ids = getattr(stats, f"{side}_activation")
        if ids is None:
            continue
        scores = getattr(stats, f"{side}_activation_scores").copy()
        lost = np.isin(ids, removed).any(axis=1)
        ids = ids - np.searchsorted(removed, ids)  # renumber: later items move up
        if lost.any():
            if bank is None:
                raise ValueError(f"removing these items changes the {side}-bank activation sets, which needs the {side} bank")
            scores[lost], ids[lost] = nearest_gallery_items(bank[lost], kept, ids.shape[1], progress=progress)
        setattr(out, f"{side}_activation", ids)
        setattr(out, f"{side}_activation_scores", scores)
    return out


def add_bank_items(
    stats: BankStatistics,
    gallery: np.ndarray,
    new_bank: np.ndarray,
    *,
    side: str = "query",
    progress: bool | None = None,
) -> BankStatistics:
    """Statistics of ``gallery`` against its ``side`` bank ("query" or "gallery") grown by
    ``new_bank``, from those against the bank alone."""
    if side not in ("query", "gallery"):
        raise ValueError(f"side must be 'query' or 'gallery'; got {side!r}")
    n, m = stats.n_gallery, new_bank.shape[0]
    n_bank = getattr(stats, f"n_{side}_bank")
    mean = getattr(stats, f"{side}_bank_mean")
    if n_bank is None or mean is None:
        raise ValueError(f"these statistics were computed without a {side} bank: there is nothing to extend")
    old_lse = getattr(stats, f"{side}_lse")
    reducers = []
    topk = lse = probes = None
    if side == "query" and stats.query_topk is not None:
        topk = TopK(n, stats.query_topk.shape[1], initial=(stats.query_topk, None))
        reducers.append(topk)
    betas = sorted(old_lse)
    if betas:
        lse = LogSumExp(n, betas)
        reducers.append(lse)
    if side == "query" and stats.query_probes is not None:
        probes = SortedRows(n, m)
        reducers.append(probes)
    if reducers:
        stream_reduce(gallery, new_bank, reducers, progress=progress, desc=f"new {side}-bank items")
    out = replace(stats)
    setattr(out, f"n_{side}_bank", n_bank + m)
    setattr(out, f"{side}_bank_mean", _weighted_mean(mean, n_bank, new_bank))
    setattr(out, f"{side}_lse", {b: np.logaddexp(old_lse[b], lse.values[:, t]) for t, b in enumerate(betas)})
    if topk is not None:
        out.query_topk = topk.values
    if probes is not None:
        out.query_probes = np.sort(np.concatenate([stats.query_probes, probes.values], axis=1), axis=1)
    ids = getattr(stats, f"{side}_activation")
    if ids is not None:
        new_scores, new_ids = nearest_gallery_items(new_bank, gallery, ids.shape[1], progress=progress)
        setattr(out, f"{side}_activation", np.concatenate([ids, new_ids]))
        setattr(out, f"{side}_activation_scores", np.concatenate([getattr(stats, f"{side}_activation_scores"), new_scores]))
    return out
