"""Build a corrected FAISS index on Ray, the autofaiss way.

1. Fit the correction with the tiled distributed fit (:func:`hubless.distributed.fit`).
2. Train the empty index once on the driver, on the same sample a single-machine build uses
   (:func:`hubless.index.faiss_build.training_sample`; only those rows are read there).
3. Broadcast it (serialised, in Ray's object store); each task reads one gallery shard, makes
   its rows [r, bias(r)] and adds them to its copy of the empty index.
4. Merge the filled copies in gallery order (``merge_from``): each item keeps its global
   position, so the index equals one built on one machine, and searches identically (tested).

Flat and IVF indexes merge this way; an HNSW graph cannot be merged from parts (build it on one
machine, or keep IVF for galleries beyond one machine).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from hubless.corrections import Correction, make_additive
from hubless.distributed.cluster import _get, check_address, connect
from hubless.distributed.fit import fit
from hubless.distributed.plan import GALLERY_ROWS, cut_points
from hubless.distributed.sources import EmbeddingSource, open_source
from hubless.errors import InvalidInput

__all__ = ["build_index"]


def _add_shard(empty: np.ndarray, gallery: EmbeddingSource, start: int, stop: int, bias: np.ndarray, normalize: bool, layout) -> np.ndarray:
    """One Ray task: rows [start, stop) of the gallery as [r, bias(r)] in a copy of the trained
    empty index (laid out and spilled as ``layout`` says, ids = gallery positions); returns the
    filled copy, serialised."""
    import faiss

    from hubless.index.faiss_build import add_rows

    index = faiss.deserialize_index(empty)
    unit = gallery.read(start, stop, normalize=normalize)
    add_rows(index, unit, np.hstack([unit, bias]).astype(np.float32), layout, start=start)
    return faiss.serialize_index(index)


def build_index(
    method: Correction | str,
    gallery,
    query_bank=None,
    factory: str | None = None,
    *,
    gallery_bank=None,
    shard_rows: int | Sequence[int] = GALLERY_ROWS,
    address: str | None = None,
    train_size: int = 100_000,
    seed: int = 0,
    spill: float | None = None,
    metadata=None,
    model: str | None = None,
    progress: bool | None = None,
    **fit_options,
):
    """A :class:`hubless.Index` of ``method`` over the ``gallery`` source, fitted and filled on
    Ray (see the module docstring); ``fit_options`` go to :func:`hubless.distributed.fit`. The
    index keeps no banks (it was fitted from tiles): grow a bank with a new distributed fit."""
    import faiss

    from hubless.index import Index
    from hubless.index.factory import check_factory
    from hubless.index.faiss_build import default_factory, train_empty, training_sample, with_spill
    from hubless.index.index import augmented_rows
    from hubless.index.metadata import Metadata
    from hubless.progress import progress_bar

    t0 = time.perf_counter()
    check_address(address)
    source = open_source(gallery, label="gallery")
    # the cheap checks first: a bad factory or metadata fails now, not after the distributed fit
    factory = factory or default_factory(source.n_rows)
    if "HNSW" in factory.upper():
        raise InvalidInput(
            f"{factory}: an HNSW graph cannot be merged from shards built apart; use an IVF factory or Index.build on one machine"
        )
    factory = check_factory(factory, source.n_rows, source.dim + 1)
    if metadata is not None:
        Metadata.from_records(metadata, source.n_rows)  # counts, keys and types checked before the fit
    corr = make_additive(fit(method, source, query_bank, gallery_bank, address=address, progress=progress, **fit_options))
    augmented = augmented_rows(corr)
    sample = training_sample(source.n_rows, train_size, seed)
    empty, layout = train_empty(factory, source.n_rows, corr.gallery_[sample], augmented[sample], seed=seed)
    layout = with_spill(empty, layout, corr.bias_columns_, spill)
    ray = connect(address)
    empty_ref = ray.put(faiss.serialize_index(empty))
    cuts = cut_points(source.n_rows, shard_rows, "shard_rows")
    job = ray.remote(_add_shard).options(max_retries=3)
    source_ref = ray.put(source)  # once in the object store, not in every task's arguments
    refs = [job.remote(empty_ref, source_ref, a, b, corr.bias_columns_[a:b], corr.normalize, layout) for a, b in zip(cuts, cuts[1:])]
    merged = None
    for ref in progress_bar(refs, progress, desc="index shards", unit="shards"):  # merged in gallery order
        part = faiss.deserialize_index(_get(ray, ref))
        if merged is None:
            merged = part
        else:
            try:
                merged.merge_from(part, 0)  # IVF lists hold gallery positions as ids; flat storage is positional
            except RuntimeError as exc:
                raise InvalidInput(
                    f"FAISS cannot merge {factory!r} indexes built apart ({str(exc).splitlines()[-1]}); use Flat or IVF"
                ) from None
    index = Index.from_faiss(corr, merged, factory, spill=layout.spill, metadata=metadata, model=model)
    index.config.build_seconds = time.perf_counter() - t0
    return index
