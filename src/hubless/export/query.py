"""Export an Index to a store and search it with [q, -W(q)] (the Index's own ranking hook)."""

from __future__ import annotations

import importlib

import numpy as np

from hubless.errors import InvalidInput, InvalidType
from hubless.export.base import FORMAT_VERSION, parse_uri

#: scheme -> the module that writes, opens and queries that store.
BACKENDS = {
    "lancedb": "hubless.export.lancedb_store",
    "postgresql": "hubless.export.pgvector_store",
    "postgres": "hubless.export.pgvector_store",
    "qdrant": "hubless.export.qdrant_store",
    "qdrant+http": "hubless.export.qdrant_server",
    "qdrant+https": "hubless.export.qdrant_server",
}


def _backend(scheme: str):
    return importlib.import_module(BACKENDS[scheme])


def _info(index) -> dict:
    corr = index.correction
    return {
        "format_version": FORMAT_VERSION,
        "spec": corr.spec,
        "model": index.model,
        "metric": "dot",
        "dim": int(corr.dim_),
        "bias_columns": int(corr.bias_columns_.shape[1]),
        "n_items": int(index.ntotal),
        "query_state": corr.query_state(),  # what W(q) and the method's scores read (DN's means, IS's bank size)
    }


def _write(scheme: str, index, location: str, table: str, *, overwrite: bool, batch: int, ann: str | None):
    from hubless.index.index import augmented_rows

    corr = index.correction
    backend = _backend(scheme)
    with backend.writer_lock(location, table):  # one export or sync of a table at a time
        return backend.write(
            location, table, augmented_rows(corr), corr.gallery_, index.metadata, _info(index), overwrite=overwrite, batch=batch, ann=ann
        )


def to_lancedb(index, location: str, table: str, *, overwrite: bool = False, batch: int = 8192, ann: str | None = None):
    """Write [r, bias(r)], plain r and metadata into LanceDB table ``table`` at ``location``;
    ``ann`` ("IVF_PQ", "IVF_FLAT") adds a LanceDB ANN index (dot metric) on [r, bias]."""
    return _write("lancedb", index, location, table, overwrite=overwrite, batch=batch, ann=ann)


def to_pgvector(index, dsn: str, table: str, *, overwrite: bool = False, batch: int = 8192, ann: str | None = None):
    """Write [r, bias(r)] (column ``vector``), plain r and metadata (jsonb) into PostgreSQL table
    ``table`` of the database at ``dsn`` (a libpq URI); ``ann="HNSW"`` adds an HNSW index with
    ``vector_ip_ops``."""
    return _write("postgresql", index, dsn, table, overwrite=overwrite, batch=batch, ann=ann)


def to_qdrant(index, location: str, collection: str, *, overwrite: bool = False, batch: int = 8192, ann: str | None = None):
    """Write the points (named vectors ``corrected`` and ``plain``, Dot distance, metadata as
    payload) into Qdrant collection ``collection`` under the directory ``location``, with the
    in-process engine; ``ann="HNSW"`` builds Qdrant's HNSW index."""
    return _write("qdrant", index, location, collection, overwrite=overwrite, batch=batch, ann=ann)


def export(index, uri: str, overwrite: bool = False, *, batch: int = 8192, ann: str | None = None):
    """Export ``index`` to a store URI (``lancedb://path/table``, ``postgresql://.../db/table``,
    ``qdrant://path/collection``)."""
    u = parse_uri(uri)
    return _write(u.scheme, index, u.location, u.table, overwrite=overwrite, batch=batch, ann=ann)


def sync(index, uri: str) -> dict:
    """Bring a store exported from ``index`` up to date after ``index.add/remove`` or grown
    banks: rows whose [r, bias(r)] changed or are new are written, rows past the index's end are
    deleted, nothing else is touched. Ids are gallery positions, so a removal changes the rows
    after it. Returns the counts ``{"written": ..., "removed": ..., "unchanged": ...}``; the
    result equals a fresh export (tested). A store of another correction or dimension is refused.
    """
    u = parse_uri(uri)
    backend = _backend(u.scheme)
    with backend.writer_lock(u.location, u.table):  # one export or sync of a table at a time
        return _sync(index, uri, backend, *backend.open_table(u.location, u.table))


def _sync(index, uri: str, backend, handle, info: dict) -> dict:
    from hubless.index.index import augmented_rows

    corr = index.correction
    new_info = _info(index)
    if (info.get("spec"), info.get("dim"), info.get("bias_columns")) != (corr.spec, new_info["dim"], new_info["bias_columns"]):
        raise InvalidInput(
            f"{uri} holds {info.get('spec')} ({info.get('dim')}-d); the index is {corr.spec} ({new_info['dim']}-d): "
            "export it again with overwrite=True (--overwrite) instead of syncing"
        )
    stored_ids, stored = backend.read_rows(handle)
    rows = augmented_rows(corr)
    n = rows.shape[0]
    current = np.zeros(n, dtype=bool)
    keep = stored_ids < n
    same = np.all(stored[keep] == rows[stored_ids[keep]], axis=1) if stored.size else np.zeros(0, bool)
    current[stored_ids[keep][same]] = True
    changed = np.flatnonzero(~current)
    removed = stored_ids[~keep]
    meta = None if not index.metadata else [index.metadata[i] for i in changed]
    backend.apply_changes(handle, changed, rows[changed], corr.gallery_[changed], meta, removed, new_info)
    return {"written": int(changed.size), "removed": int(removed.size), "unchanged": int(n - changed.size)}


def describe(store_uri: str) -> dict:
    """What a store written by :func:`export` holds: the hubless info kept with its table
    (format version, spec, model, metric, dimension, number of items, query state)."""
    u = parse_uri(store_uri)
    return dict(_backend(u.scheme).open_table(u.location, u.table)[1])


def search(store_uri: str, queries, top_k: int = 10, *, corrected: bool = True, exact: bool = False, **options):
    """Top-k from the store: (scores, ids, metadata rows), the method's scores as Index.search.

    ``options``: the method's query-time weight (``weight=``, or its own name: ``alpha=``), and the store's search knobs
    (LanceDB ``nprobes``, ``refine_factor``; pgvector ``ef_search``; Qdrant ``hnsw_ef``).
    The correction is rebuilt from the stored spec and query state (DN's bank means, IS's bank
    size) to compute W(q) and the method's scores, so NNN, DN, IS, DualIS and the baseline answer
    as ``Index.search`` does; methods whose W(q) needs each query's raw neighbours (DIS and
    DualDIS gates, CSLS's r_q) are refused.
    """
    from hubless.corrections import make_correction

    u = parse_uri(store_uri)
    backend = _backend(u.scheme)
    handle, info = backend.open_table(u.location, u.table)
    if info.get("metric") != "dot":
        raise InvalidInput(f"store {store_uri} uses metric {info.get('metric')!r}: hubless needs dot (cosine would normalise [r, bias])")
    corr = make_correction(info["spec"]).for_queries(info.get("query_state", {}), int(info["dim"]), int(info["bias_columns"]))
    q = np.asarray(queries)
    if q.ndim == 2 and q.shape[1] != info["dim"]:
        raise InvalidInput(f"queries have dimension {q.shape[1]} but store {store_uri} holds {info['dim']}-d items")
    top_k = int(top_k)  # a store with fewer items fills the rest with id -1, score -inf
    knobs = {k: v for k, v in options.items() if k not in (corr.weight_param, "weight")}
    weight = {k: v for k, v in options.items() if k in (corr.weight_param, "weight")}
    unknown = set(knobs) - {"nprobes", "refine_factor", "ef_search", "hnsw_ef"}
    if unknown:
        raise InvalidType(f"unknown search option(s) {', '.join(sorted(unknown))} for {info['spec']}")
    check_servable(corr)
    batch = corr.queries(q, **weight)
    if not corrected:
        return backend.query(handle, batch.vectors, top_k, column="plain", exact=exact, **knobs)
    ranking, ids, rows = backend.query(handle, _augmented(corr, batch), top_k, exact=exact, **knobs)
    return corr.method_scores(batch, ranking), ids, rows


def _augmented(corr, batch) -> np.ndarray:
    return np.hstack([batch.vectors, -corr.weights(batch)]).astype(np.float32)


def query_vectors(corr, queries, **weight) -> np.ndarray:
    """[q, -W(q)] of ``queries`` for a correction served as [r, bias(r)] rows elsewhere (a
    store, parts written on Ray): ``xq . row = s(q, r) - W(q) . bias(r)``, the ranking score.
    ``corr`` is fitted, or set up with :meth:`~hubless.corrections.base.AdditiveCorrection.for_queries`."""
    check_servable(corr)
    return _augmented(corr, corr.queries(queries, **weight))


def check_servable(corr) -> None:
    """Refuse a correction that [r, bias(r)] rows and [q, -W(q)] cannot serve: its score needs
    each query's raw neighbours (DIS/DualDIS gates, CSLS's r_q) or is not additive (GC)."""
    if not getattr(corr, "exactly_additive", False) or corr.query_request.depth:
        raise InvalidInput(
            f"{corr.spec} needs each query's raw neighbours (DIS/DualDIS gates, CSLS's r_q) or is not additive (GC): "
            "it cannot be served as [r, bias] rows; search it with hubless's own Index"
        )
