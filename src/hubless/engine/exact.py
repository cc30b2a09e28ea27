"""Exact top-k inner-product search in bounded memory (GEMM blocks + running top-k)."""

from __future__ import annotations

import numpy as np

from hubless.engine.device import torch_device
from hubless.engine.stream import TopK, Transform, stream_reduce

__all__ = ["exact_search"]


def exact_search(
    queries: np.ndarray,
    gallery: np.ndarray,
    top_k: int,
    *,
    transform: Transform | None = None,
    additive: tuple[np.ndarray, np.ndarray] | None = None,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
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

    Returns ``(scores, ids)``: float32 and int64 arrays of shape (n_queries, top_k).
    """
    on_device = torch_device()
    if on_device is not None and (transform is None or additive is not None):
        from hubless.engine import torch_passes

        return torch_passes.exact_search(queries, gallery, top_k, additive=additive, device=on_device[0], dtype=on_device[1])
    result = TopK(queries.shape[0], top_k, with_ids=True)
    stream_reduce(
        queries,
        gallery,
        [result],
        transform=transform,
        progress=progress,
        desc="search",
    )
    return result.values, result.ids_
