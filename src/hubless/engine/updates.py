"""Keep bank statistics current as the gallery or a reference bank changes, without a full pass.

Every row statistic (the top-k, log-sum-exp and probes of a gallery item) depends only on that
item and the banks, and every activation set is a union of per-bank-item top-k lists. So:

* adding n_new gallery items computes their statistics only (n_new x n_bank similarities, and
  each bank item's nearest new items) and merges them in (:func:`~hubless.engine.merge.merge_gallery_parts`);
* removing gallery items drops their rows; bank items whose top-k_a lost an item get it
  recomputed over the remaining gallery (only those bank items); the others are renumbered;
* adding n_new items to a bank (query or gallery) computes the gallery's statistics against the
  new items only (n_gallery x n_new) and merges them in (:func:`~hubless.engine.merge.merge_bank_parts`:
  top-k of top-k lists, logaddexp of log-sum-exps, merged probes, re-weighted bank mean, the new
  items' own top-k_a appended).

The merges are the ones the distributed fit uses for its tiles.
Each result equals :func:`~hubless.engine.compute_statistics` on the updated arrays up to float
rounding (tested). Arrays must be validated float32 (see :func:`hubless._validation.as_embeddings`);
the functions return new statistics and never modify their inputs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hubless.engine.merge import merge_bank_parts, merge_gallery_parts
from hubless.engine.statistics import BankStatistics, StatisticsRequest, compute_statistics, nearest_gallery_items
from hubless.errors import InvalidInput

__all__ = ["add_bank_items", "add_gallery_items", "gallery_rows", "remove_gallery_items", "side_request"]


def side_request(request: StatisticsRequest, side: str) -> StatisticsRequest:
    """The part of ``request`` that reads the ``side`` bank ("query" or "gallery")."""
    if side == "query":
        return StatisticsRequest(
            query_topk=request.query_topk,
            query_betas=request.query_betas,
            query_activation_k=request.query_activation_k,
            query_probes=request.query_probes,
        )
    if side == "gallery":
        return StatisticsRequest(gallery_betas=request.gallery_betas, gallery_activation_k=request.gallery_activation_k)
    raise InvalidInput(f"side must be 'query' or 'gallery'; got {side!r}")


def _map_items(update, stats: BankStatistics, **changes) -> BankStatistics:
    """``stats`` with ``changes``, and each per-gallery-item array (top-k, log-sum-exps, probes)
    set to ``update(array)``."""

    def one(old):
        return None if old is None else update(old)

    return replace(
        stats,
        query_topk=one(stats.query_topk),
        query_probes=one(stats.query_probes),
        query_lse={b: one(v) for b, v in stats.query_lse.items()},
        gallery_lse={b: one(v) for b, v in stats.gallery_lse.items()},
        **changes,
    )


def gallery_rows(stats: BankStatistics, start: int, stop: int) -> BankStatistics:
    """The statistics of gallery items ``[start, stop)`` alone, keeping the banks' and the whole
    gallery's global values (bank sizes and means, the gallery mean): a correction fitted on
    those rows from them gives each row the bias it has in the whole fit. The activation sets
    are dropped (they are sets over the whole gallery)."""
    if not 0 <= start < stop <= stats.n_gallery:
        raise InvalidInput(f"rows [{start}, {stop}) are not within the {stats.n_gallery} gallery items")
    return _map_items(
        lambda values: values[start:stop],
        stats,
        n_gallery=stop - start,
        query_activation=None,
        query_activation_scores=None,
        gallery_activation=None,
        gallery_activation_scores=None,
    )


def add_gallery_items(
    stats: BankStatistics,
    items: np.ndarray,
    query_bank: np.ndarray | None,
    gallery_bank: np.ndarray | None,
    *,
    progress: bool | None = None,
) -> BankStatistics:
    """Statistics of ``gallery + items`` from those of ``gallery`` and the same banks: the new
    items' own statistics (n_new x n_bank) merged in with :func:`merge_gallery_parts`."""
    request = stats.request
    means = (stats.query_bank_mean, stats.gallery_bank_mean)  # the banks are the stored ones
    part = compute_statistics(items, query_bank, gallery_bank, request, progress=progress, bank_means=means)
    part = replace(  # the banks are the same: their sizes and means are the stored ones
        part,
        n_query_bank=stats.n_query_bank,
        n_gallery_bank=stats.n_gallery_bank,
        query_bank_mean=stats.query_bank_mean,
        gallery_bank_mean=stats.gallery_bank_mean,
    )
    return merge_gallery_parts(stats, part)


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
                raise InvalidInput(f"removing these items changes the {side}-bank activation sets, which needs the {side} bank")
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
    ``new_bank``, from those against the bank alone: the gallery's statistics against the new
    items (n_gallery x n_new) merged in with :func:`merge_bank_parts`."""
    request = side_request(stats.request, side)
    if getattr(stats, f"n_{side}_bank") is None or getattr(stats, f"{side}_bank_mean") is None:
        raise InvalidInput(f"these statistics were computed without a {side} bank: there is nothing to extend")
    query_bank, gallery_bank = (new_bank, None) if side == "query" else (None, new_bank)
    part = compute_statistics(gallery, query_bank, gallery_bank, request, progress=progress)
    return merge_bank_parts(stats, part, side)
