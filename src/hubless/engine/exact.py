"""Exact top-k inner-product search in bounded memory (GEMM blocks + running top-k)."""

from __future__ import annotations

import numpy as np

from hubless.engine.device import torch_device
from hubless.engine.duplicates import Duplicates, find_duplicates
from hubless.engine.stream import TopK, Transform, stream_reduce
from hubless.hits import Hits

__all__ = ["exact_search"]


def exact_search(
    queries: np.ndarray,
    gallery: np.ndarray,
    top_k: int,
    *,
    transform: Transform | None = None,
    additive: tuple[np.ndarray, np.ndarray] | None = None,
    progress: bool | None = None,
    duplicates: Duplicates | None = None,
) -> Hits:
    """Top ``top_k`` gallery items of each query by inner product, best first.

    The score is ``q . r``, rewritten block by block by ``transform(sims, row_start, row_stop,
    col_start, col_stop)`` when given (a correction's ranking). Ties are broken by the lower
    gallery index. Inputs must already be validated float32 arrays; ``top_k <= len(gallery)``.
    Peak memory is one row block x column block of scores per thread (see
    :mod:`hubless.engine.stream`) plus the (n_queries, top_k) outputs, whatever the sizes.

    On a torch device (``device=`` of the caller, :func:`hubless.engine.use_device`,
    ``HUBLESS_DEVICE``) a raw search (no ``transform``), or one whose ``transform`` is the
    additive ranking ``q . r - W(q) . bias_columns(r)`` given as ``additive=(W, bias_columns)``
    ((n_queries, c) and (n_gallery, c) float32), runs whole on the device
    (:func:`hubless.engine.torch_passes.exact_search`: products, bias and top-k; only the
    results come back). Any other transform is applied on the host to blocks computed on the
    device. On numpy, ``transform`` ranks (``additive`` only describes it).

    Exact duplicate gallery rows (``duplicates``: found here when not given, one pass over the
    gallery; a fitted correction keeps its gallery's) score as their first copy: each copy is
    left out of the blocks' top-k and put back right after its first copy with its score
    (:mod:`hubless.engine.duplicates`), so copies tie exactly, in index order, whatever block of
    columns and BLAS kernel computed them.

    Returns a :class:`~hubless.Hits` (unpacking as ``scores, ids``: float32 and int64 arrays of
    shape (n_queries, top_k), every slot found).
    """
    duplicates = find_duplicates(gallery) if duplicates is None else duplicates
    on_device = torch_device()
    if on_device is not None and (transform is None or additive is not None):
        from hubless.engine import torch_passes

        masked = duplicates.copies if duplicates else None
        values, ids = torch_passes.exact_search(
            queries, gallery, top_k, additive=additive, device=on_device[0], dtype=on_device[1], masked=masked
        )
        return _all_found(*duplicates.expand_top_k(values, ids, top_k))
    result = TopK(queries.shape[0], top_k, with_ids=True)
    stream_reduce(
        queries,
        gallery,
        [result],
        transform=_without_copies(transform, duplicates),
        progress=progress,
        desc="search",
    )
    return _all_found(*duplicates.expand_top_k(result.values, result.ids_, top_k))


def _all_found(scores: np.ndarray, ids: np.ndarray) -> Hits:
    return Hits(scores, ids, np.ones(scores.shape, bool))


def _without_copies(transform: Transform | None, duplicates: Duplicates) -> Transform | None:
    """``transform`` followed by the copies' columns of each block set to -inf (left out of the
    top-k; :meth:`~hubless.engine.duplicates.Duplicates.expand_top_k` puts them back)."""
    if not duplicates:
        return transform

    def rewrite(sims: np.ndarray, r0: int, r1: int, c0: int, c1: int) -> None:
        if transform is not None:
            transform(sims, r0, r1, c0, c1)
        sims[:, duplicates.column_mask(c0, c1)] = -np.inf

    return rewrite
