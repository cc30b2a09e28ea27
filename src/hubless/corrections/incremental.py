"""In-place updates of a fitted correction: gallery items added or removed, a bank grown.

    from hubless.corrections import incremental
    nnn = hubless.NNN(k=16).fit(gallery, query_bank)
    incremental.add_items(nnn, new_items, query_bank)      # equals a fit on the grown gallery
    incremental.remove_items(nnn, [3, 17], query_bank)     # by gallery position; later items move up
    incremental.add_query_bank(nnn, more_queries)          # equals a fit on the grown bank

Only the new similarities are computed (:mod:`hubless.engine.updates` merges them into the bank
statistics the correction keeps, ``statistics_``) and the correction is refitted from the merged
statistics, so the result equals fitting on the changed arrays. Each function changes the
correction in place and returns it. (Until 0.2.0 they are also reachable as the correction's
methods ``add_items``, ``remove_items``, ``add_query_bank`` and ``add_gallery_bank``, which warn.)
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np

from hubless._validation import as_embeddings
from hubless.corrections.base import Correction
from hubless.engine.updates import add_bank_items, add_gallery_items, remove_gallery_items
from hubless.errors import InvalidInput, InvalidType

__all__ = ["add_gallery_bank", "add_items", "add_query_bank", "remove_items"]

_C = TypeVar("_C", bound=Correction)


def add_items(corr: _C, items, query_bank=None, gallery_bank=None, *, progress: bool | None = None) -> _C:
    """Add gallery ``items`` to the fitted ``corr`` in place (returns it); the others'
    statistics are kept.

    Pass the banks ``corr`` was fitted on: only the new items' similarities to them are computed
    (n_new x n_bank; DIS/DualDIS also merge each bank item's nearest new items into its
    activation top-k), and the result equals fitting on the grown gallery.
    """
    _check_updatable(corr)
    items = as_embeddings(items, "items", normalize=corr.normalize, dim=corr.dim_)
    corr.check_sizes(corr.n_gallery_ + items.shape[0], corr.statistics_.n_query_bank, corr.statistics_.n_gallery_bank)
    qb, gb = _update_banks(corr, query_bank, gallery_bank, required=True)
    stats = add_gallery_items(corr.statistics_, items, qb, gb, progress=progress)
    corr._fit_arrays(np.concatenate([corr.gallery_, items]), stats, own=True)
    return corr


def remove_items(corr: _C, ids, query_bank=None, gallery_bank=None, *, progress: bool | None = None) -> _C:
    """Remove the gallery items at positions ``ids`` from the fitted ``corr`` in place (later
    items move up; returns it).

    No similarity is recomputed, except for DIS/DualDIS bank items whose nearest gallery items
    were removed (those need the banks ``corr`` was fitted on).
    """
    _check_updatable(corr)
    ids = np.unique(np.asarray(ids, dtype=np.int64).ravel())
    if ids.size and (ids[0] < 0 or ids[-1] >= corr.n_gallery_):
        raise InvalidInput(f"ids to remove must be in [0, {corr.n_gallery_}); got {ids[0]}..{ids[-1]}")
    keep = np.setdiff1d(np.arange(corr.n_gallery_), ids)
    if keep.size == 0:
        raise InvalidInput("cannot remove every gallery item")
    corr.check_sizes(keep.size, corr.statistics_.n_query_bank, corr.statistics_.n_gallery_bank)
    qb, gb = _update_banks(corr, query_bank, gallery_bank, required=False)
    stats = remove_gallery_items(corr.statistics_, corr.gallery_, keep, qb, gb, progress=progress)
    corr._fit_arrays(corr.gallery_[keep], stats, own=True)
    return corr


def add_query_bank(corr: _C, new_queries, *, progress: bool | None = None) -> _C:
    """Add reference queries to the query bank of the fitted ``corr`` in place (returns it).

    Every gallery item's statistics are merged with its similarities to the new bank items
    (n_gallery x n_new, all biases change); the result equals fitting on the grown bank. A
    baseline's query bank is not used: nothing changes.
    """
    return _grow_bank(corr, new_queries, "query", progress=progress)


def add_gallery_bank(corr: _C, new_items, *, progress: bool | None = None) -> _C:
    """Add reference items to the gallery bank of the fitted ``corr`` in place (DualIS,
    DualDIS, and DN fitted with a gallery bank), as :func:`add_query_bank` does for the query
    bank (returns it)."""
    return _grow_bank(corr, new_items, "gallery", progress=progress)


def _grow_bank(corr: _C, new_items, side: str, *, progress: bool | None) -> _C:
    _check_updatable(corr)
    new = as_embeddings(new_items, f"new {side}-bank items", normalize=corr.normalize, dim=corr.dim_)
    uses = corr.needs_query_bank if side == "query" else corr.statistics_.n_gallery_bank is not None
    if not uses:
        if side == "query":  # the baseline: nothing depends on the bank
            return corr
        raise InvalidInput(f"{type(corr).__name__} was fitted without a gallery bank: it has none to grow")
    stats = corr.statistics_
    sizes = [corr.n_gallery_, stats.n_query_bank, stats.n_gallery_bank]
    sizes[1 if side == "query" else 2] += new.shape[0]
    corr.check_sizes(*sizes)
    corr._fit_arrays(corr.gallery_, add_bank_items(stats, corr.gallery_, new, side=side, progress=progress))
    return corr


def _check_updatable(corr) -> None:
    if not isinstance(corr, Correction):
        raise InvalidType(f"expected a fitted hubless correction; got {type(corr).__name__}")
    corr._check_fitted()
    corr._check_embeddings_fit()


def _update_banks(corr: Correction, query_bank, gallery_bank, *, required: bool):
    """Validate the banks passed to an update: the ones ``corr`` was fitted on (a bank its
    statistics do not use is ignored, as in ``fit``)."""
    stats, request = corr.statistics_, corr.statistics_.request
    needs = {
        "query_bank": request.query_topk or request.query_betas or request.query_activation_k or request.query_probes,
        "gallery_bank": request.needs_gallery_bank,
    }
    sizes = {"query_bank": stats.n_query_bank, "gallery_bank": stats.n_gallery_bank}
    out: list[np.ndarray | None] = []
    for name, bank in (("query_bank", query_bank), ("gallery_bank", gallery_bank)):
        if bank is None or not needs[name]:
            if bank is None and required and needs[name]:
                raise InvalidInput(f"{type(corr).__name__} needs the {name} it was fitted on to compute new items' statistics")
            out.append(None)
            continue
        bank = as_embeddings(bank, name, normalize=corr.normalize, dim=corr.dim_)
        if bank.shape[0] != sizes[name]:
            raise InvalidInput(f"{name} has {bank.shape[0]} rows but this correction was fitted on {sizes[name]}: pass the same bank")
        out.append(bank)
    return tuple(out)
