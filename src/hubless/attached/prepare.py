"""What an attached collection's correction reads: the correction of a spec (an exactly additive
one), the reference banks it needs, and the collection's vectors as it reads them (unit length
checked when the store ranks by the raw inner product). Shared by attaching
(:mod:`hubless.attached.fit`), updating (:mod:`hubless.attached.updating`) and searching
(:mod:`hubless.attached.certified`)."""

from __future__ import annotations

import numpy as np

from hubless._validation import as_embeddings
from hubless.attached.sources.base import Source
from hubless.errors import InvalidInput

__all__ = ["UNIT_TOLERANCE", "collection_rows", "correction_for", "read_banks"]

#: How far a collection's vector norms may be from 1 when the correction expects unit vectors.
UNIT_TOLERANCE = 1e-3


def correction_for(method, normalize: bool | None):
    from hubless.corrections import make_additive

    corr = make_additive(method)
    if normalize is not None:
        corr.set_params(normalize=normalize)
    else:
        corr.set_params()  # validates
    if not corr.exactly_additive:
        raise InvalidInput(
            f"{corr.spec} is not a bias on the plain score for every query (published DualDIS with a closed gate): "
            "an attached collection cannot certify it; use dualdis:ungated=exp or another method"
        )
    return corr


def read_banks(corr, query_bank, gallery_bank, dim: int):
    request = corr.statistics_request()
    qb = as_embeddings(query_bank, "query_bank", normalize=corr.normalize, dim=dim) if corr.needs_query_bank else None
    if corr.needs_query_bank and qb is None:
        raise InvalidInput(f"{corr.spec} needs a query bank")
    gb = None
    if corr.gallery_bank_use == "required" and gallery_bank is None:
        raise InvalidInput(f"{corr.spec} needs a gallery bank (reference items of the collection's modality): pass gallery_bank=")
    if gallery_bank is not None and corr.gallery_bank_use != "ignored":
        gb = as_embeddings(gallery_bank, "gallery_bank", normalize=corr.normalize, dim=dim)
    return request, qb, gb


def collection_rows(corr, source: Source, vectors: np.ndarray, first_row: int) -> np.ndarray:
    """A batch of the collection's vectors as the correction reads them: validated float32; with
    ``normalize`` they must already be unit length (the store ranks by their raw inner product)
    unless the store's own metric is cosine."""
    if corr.normalize and not getattr(source, "cosine", False):
        norms = np.linalg.norm(np.asarray(vectors, np.float64), axis=1)
        bad = np.flatnonzero(np.abs(norms - 1.0) > UNIT_TOLERANCE)
        if bad.size:
            raise InvalidInput(
                f"{source.uri}: item {first_row + int(bad[0])} has norm {norms[bad[0]]:.4g}: the store ranks by the raw inner product, "
                f"which is not the cosine {corr.spec} corrects; normalise the collection or attach with normalize=False"
            )
    return as_embeddings(vectors, "collection vectors", normalize=corr.normalize, dim=source.dim, first_row=first_row)
