"""In-place updates of a fitted correction: gallery items added or removed, a bank grown.

Only the new similarities are computed (:mod:`hubless.engine.updates` merges them into the kept
bank statistics) and the correction is refitted from the merged statistics, so the result equals
fitting on the changed arrays. :class:`~hubless.corrections.base.Correction`'s ``add_items``,
``remove_items``, ``add_query_bank`` and ``add_gallery_bank`` call these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from hubless._validation import as_embeddings
from hubless.engine.updates import add_bank_items, add_gallery_items, remove_gallery_items
from hubless.errors import InvalidInput

if TYPE_CHECKING:
    from hubless.corrections.base import Correction

__all__ = ["add_items", "grow_bank", "remove_items"]


def add_items(corr: Correction, items, query_bank, gallery_bank, *, progress: bool | None) -> None:
    """Add gallery ``items`` to ``corr`` (see :meth:`Correction.add_items`)."""
    corr._check_fitted()
    corr._check_embeddings_fit()
    items = as_embeddings(items, "items", normalize=corr.normalize, dim=corr.dim_)
    corr.check_sizes(corr.n_gallery_ + items.shape[0], corr.statistics_.n_query_bank, corr.statistics_.n_gallery_bank)
    qb, gb = _update_banks(corr, query_bank, gallery_bank, required=True)
    stats = add_gallery_items(corr.statistics_, items, qb, gb, progress=progress)
    corr._fit_arrays(np.concatenate([corr.gallery_, items]), stats, own=True)


def remove_items(corr: Correction, ids, query_bank, gallery_bank, *, progress: bool | None) -> None:
    """Remove the gallery items at positions ``ids`` from ``corr`` (see :meth:`Correction.remove_items`)."""
    corr._check_fitted()
    corr._check_embeddings_fit()
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


def grow_bank(corr: Correction, new_items, side: str, *, progress: bool | None) -> None:
    """Add ``new_items`` to the query bank (``side="query"``) or the gallery bank of ``corr``
    (see :meth:`Correction.add_query_bank`); a baseline's query bank is not used: nothing changes."""
    corr._check_fitted()
    corr._check_embeddings_fit()
    new = as_embeddings(new_items, f"new {side}-bank items", normalize=corr.normalize, dim=corr.dim_)
    uses = corr.needs_query_bank if side == "query" else corr.statistics_.n_gallery_bank is not None
    if not uses:
        if side == "query":  # the baseline: nothing depends on the bank
            return
        raise InvalidInput(f"{type(corr).__name__} was fitted without a gallery bank: it has none to grow")
    stats = corr.statistics_
    sizes = [corr.n_gallery_, stats.n_query_bank, stats.n_gallery_bank]
    sizes[1 if side == "query" else 2] += new.shape[0]
    corr.check_sizes(*sizes)
    corr._fit_arrays(corr.gallery_, add_bank_items(stats, corr.gallery_, new, side=side, progress=progress))


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
