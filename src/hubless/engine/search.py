"""Exact top-k inner-product search in bounded memory (GEMM blocks + running top-k)."""

from __future__ import annotations

import numpy as np

from hubless.engine.stream import TopK, Transform, stream_reduce

__all__ = ["exact_search"]


def exact_search(
    queries: np.ndarray,
    gallery: np.ndarray,
    top_k: int,
    *,
    query_extra: np.ndarray | None = None,
    gallery_extra: np.ndarray | None = None,
    transform: Transform | None = None,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top ``top_k`` gallery items of each query by inner product, best first.

    The score is ``[q, query_extra] . [r, gallery_extra]``: with ``query_extra = -w`` and
    ``gallery_extra = bias`` this is ``q . r - w * bias(r)``, the augmented-vector form of an
    additive correction. Ties are broken by the lower gallery index. Inputs must already be
    validated float32 arrays; ``top_k <= len(gallery)``. Peak memory is one 512 x 8192 block of
    scores per thread plus the (n_queries, top_k) outputs, whatever the sizes.

    Returns ``(scores, ids)``: float32 and int64 arrays of shape (n_queries, top_k).
    """
    result = TopK(queries.shape[0], top_k, with_ids=True)
    stream_reduce(
        queries,
        gallery,
        [result],
        row_extra=query_extra,
        col_extra=gallery_extra,
        transform=transform,
        progress=progress,
        desc="search",
    )
    return result.values, result.ids
