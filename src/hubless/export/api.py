"""Export an Index to a store and search it with [q, -W(q)] (the Index's own ranking hook).

The functions here are the library's entry points; each opens the store a URI names (see
:mod:`hubless.export.base` for the contract and the registry) and calls its operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy.typing as npt

from hubless.export.base import VectorStore, open_store
from hubless.export.info import StoreInfo
from hubless.export.store_hits import StoreHits

if TYPE_CHECKING:  # annotations only
    from hubless.index import Index

__all__ = ["describe", "drop", "export", "search", "sync", "to_lancedb", "to_pgvector", "to_qdrant"]


def export(
    index: Index,
    uri: str,
    overwrite: bool = False,
    *,
    batch: int = 8192,
    ann: str | None = None,
    target_recall: float | None = None,
    **options: object,
) -> VectorStore:
    """Export ``index`` to a store URI (``lancedb://path/table``, ``postgresql://.../db/table``,
    ``qdrant://path/collection``, ``qdrant+http://host:port/collection``, ``milvus://path/collection``,
    ``chroma://path/collection``): [r, bias(r)], plain r and metadata of every item.

    ``ann`` adds the store's ANN index; ``target_recall`` makes the smallest search knob
    measured to reach it on the index's query bank the default; ``options`` are the store's
    typed export options (e.g. LanceDB ``partitions=``, ``sub_vectors=``; unknown names are
    refused naming the valid ones). Returns the store (:class:`~hubless.export.base.VectorStore`).
    """
    return open_store(uri).export(index, overwrite=overwrite, batch=batch, ann=ann, target_recall=target_recall, **options)


def to_lancedb(
    index: Index,
    location: str,
    table: str,
    overwrite: bool = False,
    *,
    batch: int = 8192,
    ann: str | None = None,
    target_recall: float | None = None,
    **options: object,
) -> VectorStore:
    """``export(index, f"lancedb://{location}/{table}", ...)``."""
    uri = f"lancedb://{location}/{table}"
    return export(index, uri, overwrite, batch=batch, ann=ann, target_recall=target_recall, **options)


def to_pgvector(
    index: Index,
    dsn: str,
    table: str,
    overwrite: bool = False,
    *,
    batch: int = 8192,
    ann: str | None = None,
    target_recall: float | None = None,
    **options: object,
) -> VectorStore:
    """``export`` into PostgreSQL table ``table`` of the database at ``dsn`` (a libpq URI)."""
    base, _, opts = dsn.partition("?")
    uri = f"{base.rstrip('/')}/{table}" + (f"?{opts}" if opts else "")
    return export(index, uri, overwrite, batch=batch, ann=ann, target_recall=target_recall, **options)


def to_qdrant(
    index: Index,
    location: str,
    collection: str,
    overwrite: bool = False,
    *,
    batch: int = 8192,
    ann: str | None = None,
    target_recall: float | None = None,
    **options: object,
) -> VectorStore:
    """``export(index, f"qdrant://{location}/{collection}", ...)`` (Qdrant's engine in-process)."""
    uri = f"qdrant://{location}/{collection}"
    return export(index, uri, overwrite, batch=batch, ann=ann, target_recall=target_recall, **options)


def sync(index: Index, uri: str) -> dict[str, int]:
    """Bring a store exported from ``index`` up to date after ``index.add/remove`` or grown
    banks (see :meth:`~hubless.export.base.VectorStore.sync`); returns the counts
    ``{"written": ..., "removed": ..., "unchanged": ...}``."""
    return open_store(uri).sync(index)


def describe(store_uri: str) -> StoreInfo:
    """What a store written by :func:`export` holds: the hubless info kept with its table
    (format version, spec, model, metric, dimension, items, query state, metadata columns,
    ANN index and its measured recall curve)."""
    return open_store(store_uri).describe()


def drop(store_uri: str) -> bool:
    """Remove a store's table and everything hubless wrote for it; False if there was none."""
    return open_store(store_uri).drop()


def search(
    store_uri: str,
    queries: npt.ArrayLike,
    top_k: int = 10,
    *,
    corrected: bool = True,
    exact: bool = False,
    target_recall: float | None = None,
    **options: object,
) -> StoreHits:
    """Top-k from the store as :class:`~hubless.Hits`: the method's scores as Index.search, the
    items' ids, and each hit's stored metadata in ``hits.metadata`` (by id; None when the store
    keeps no metadata columns). Until 0.2.0 the result also unpacks as the old ``(scores, ids,
    metadata rows)`` triple, with a DeprecationWarning (:mod:`hubless.export.store_hits`).

    ``options``: the method's query-time weight (``weight=``), the search knob (``nprobe`` for IVF indexes, ``ef_search`` for HNSW) and the store's own
    search options (LanceDB ``refine_factor``); ``target_recall`` picks the knob from the
    curve measured at export. The correction is rebuilt from the stored spec and query state
    (DN's bank means, IS's bank size), so NNN, DN, IS, DualIS and the baseline answer as
    ``Index.search`` does; DIS, DualDIS and CSLS are refused at export.
    """
    return open_store(store_uri).search(queries, top_k, corrected=corrected, exact=exact, target_recall=target_recall, **options)
