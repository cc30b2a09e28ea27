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

__all__ = ["UNIT_TOLERANCE", "collection_rows", "correction_for", "read_banks", "store_scale"]

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


def store_scale(corr, source: Source, norms: np.ndarray) -> np.ndarray:
    """Each item's store score over the correction's similarity, from its vector's ``norms``: the
    norm when the store ranks by the raw inner product of vectors the correction normalises (the
    store's q . r is then |r| (q . r / |r|)), else 1 (a cosine store, or a correction of the raw
    inner product)."""
    if corr.normalize and not source.cosine:
        return np.asarray(norms, np.float32)
    return np.ones(len(norms), np.float32)


def collection_rows(corr, source: Source, vectors: np.ndarray, ids: np.ndarray, norms: np.ndarray | None = None) -> np.ndarray:
    """A batch of the collection's vectors (of the items ``ids``) as the correction reads them:
    validated float32, unit length with ``normalize``. With ``normalize`` on a store that ranks by
    the raw inner product the vectors must be within :data:`UNIT_TOLERANCE` of unit length (its
    scores are divided by each item's norm, :func:`store_scale`, so that
    candidates, reserve, biases and exact search all score the normalised vectors; farther off,
    its ranking is not the cosine the correction corrects); a cosine store needs ``normalize``."""
    cosine = getattr(source, "cosine", False)
    if cosine and not corr.normalize:
        raise InvalidInput(f"{source.uri} ranks by the cosine: attach {corr.spec} with normalize=True (the correction's cosine)")
    if corr.normalize and not cosine:
        norms = np.linalg.norm(np.asarray(vectors, np.float64), axis=1) if norms is None else norms
        bad = np.flatnonzero(~(np.abs(norms - 1.0) <= UNIT_TOLERANCE))
        if bad.size:
            raise InvalidInput(
                f"{source.uri}: item {int(ids[bad[0]])} has norm {norms[bad[0]]:.4g}: the store ranks by the raw inner product, "
                f"which is not the cosine {corr.spec} corrects; normalise the collection or attach with normalize=False"
            )
    return as_embeddings(vectors, "collection vectors", normalize=corr.normalize, dim=source.dim)
