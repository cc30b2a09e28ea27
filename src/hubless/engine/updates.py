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

from hubless.engine.statistics import BankStatistics, compute_statistics, nearest_gallery_items, row_statistics

__all__ = ["add_bank_items", "add_gallery_items", "remove_gallery_items"]


def _weighted_mean(mean: np.ndarray, n: int, new: np.ndarray) -> np.ndarray:
    return (mean * n + new.sum(axis=0, dtype=np.float64)) / (n + new.shape[0])


def _map_items(update, stats: BankStatistics, *others: BankStatistics, **changes) -> BankStatistics:
    """``stats`` with ``changes``, and each per-gallery-item array (top-k, log-sum-exps, probes)
    set to ``update(array, *the same array of each of others)``."""

    def one(get):
        old = get(stats)
        return None if old is None else update(old, *(get(o) for o in others))

    return replace(
        stats,
        query_topk=one(lambda s: s.query_topk),
        query_probes=one(lambda s: s.query_probes),
        query_lse={b: one(lambda s, b=b: s.query_lse[b]) for b in stats.query_lse},
        gallery_lse={b: one(lambda s, b=b: s.gallery_lse[b]) for b in stats.gallery_lse},
        **changes,
    )


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
    out = _map_items(
        lambda old, new: np.concatenate([old, new]),
        stats,
        rows,
        n_gallery=n_old + items.shape[0],
        gallery_mean=_weighted_mean(stats.gallery_mean, n_old, items),
    )
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
    out = _map_items(lambda old: old[keep], stats, n_gallery=keep.size, gallery_mean=kept.mean(axis=0, dtype=np.float64))
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
    m = new_bank.shape[0]
    n_bank = getattr(stats, f"n_{side}_bank")
    mean = getattr(stats, f"{side}_bank_mean")
    if n_bank is None or mean is None:
        raise ValueError(f"these statistics were computed without a {side} bank: there is nothing to extend")
    old_lse = getattr(stats, f"{side}_lse")
    old_topk = stats.query_topk if side == "query" else None
    old_probes = stats.query_probes if side == "query" else None
    topk, new_lse, probes = row_statistics(
        gallery,
        new_bank,
        k=0 if old_topk is None else old_topk.shape[1],
        betas=old_lse,
        probes=old_probes is not None,
        initial_topk=old_topk,
        progress=progress,
        desc=f"new {side}-bank items",
    )
    out = replace(stats)
    setattr(out, f"n_{side}_bank", n_bank + m)
    setattr(out, f"{side}_bank_mean", _weighted_mean(mean, n_bank, new_bank))
    setattr(out, f"{side}_lse", {b: np.logaddexp(v, new_lse[b]) for b, v in old_lse.items()})
    if topk is not None:
        out.query_topk = topk
    if probes is not None:
        out.query_probes = np.sort(np.concatenate([old_probes, probes], axis=1), axis=1)
    ids = getattr(stats, f"{side}_activation")
    if ids is not None:
        new_scores, new_ids = nearest_gallery_items(new_bank, gallery, ids.shape[1], progress=progress)
        setattr(out, f"{side}_activation", np.concatenate([ids, new_ids]))
        setattr(out, f"{side}_activation_scores", np.concatenate([getattr(stats, f"{side}_activation_scores"), new_scores]))
    return out
