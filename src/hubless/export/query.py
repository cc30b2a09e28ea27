"""Export an Index to a store and search it with [q, -W(q)] (the Index's own ranking hook)."""

from __future__ import annotations

import numpy as np

from hubless.export import lancedb_store
from hubless.export.base import FORMAT_VERSION, parse_uri


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
    }


def to_lancedb(index, location: str, table: str, *, overwrite: bool = False, batch: int = 8192, ann: str | None = None):
    """Write [r, bias(r)], plain r and metadata into LanceDB table ``table`` at ``location``;
    ``ann`` ("IVF_PQ", "IVF_FLAT", ...) adds a LanceDB ANN index (dot metric) on [r, bias]."""
    from hubless.index.index import augmented_rows

    corr = index.correction
    return lancedb_store.write(
        location, table, augmented_rows(corr), corr.gallery_, index.metadata, _info(index), overwrite=overwrite, batch=batch, ann=ann
    )


def export(index, uri: str, overwrite: bool = False, *, batch: int = 8192, ann: str | None = None):
    """Export ``index`` to a store URI (``lancedb://path/table``)."""
    u = parse_uri(uri)
    return to_lancedb(index, u.location, u.table, overwrite=overwrite, batch=batch, ann=ann)


def search(store_uri: str, queries, top_k: int = 10, *, corrected: bool = True, exact: bool = False, nprobes: int = 20,
           refine_factor: int = 10, **weight):  # fmt: skip
    """Top-k from the store: (scores, ids, metadata rows), the method's scores as Index.search.

    The correction is rebuilt from the stored spec only to compute W(q) for queries; methods
    whose W(q) needs raw neighbours (DIS gates, CSLS r_q) are refused here.
    """
    from hubless._validation import as_embeddings
    from hubless.corrections import make_correction

    u = parse_uri(store_uri)
    tbl, info = lancedb_store.open_table(u.location, u.table)
    if info.get("metric") != "dot":
        raise ValueError(f"store {store_uri} uses metric {info.get('metric')!r}: hubless needs dot (cosine would normalise [r, bias])")
    q = as_embeddings(queries, "queries", normalize=True)
    if q.shape[1] != info["dim"]:
        raise ValueError(f"queries have dimension {q.shape[1]} but store {store_uri} holds {info['dim']}-d items")
    top_k = min(int(top_k), int(info["n_items"]))
    if not corrected:
        return lancedb_store.query(tbl, q, top_k, column="plain")
    corr = make_correction(info["spec"])
    if corr.query_request.depth:
        raise ValueError(f"{info['spec']} needs raw neighbours per query: search it with hubless's own Index")
    weights = _weights(corr, q, weight, info)
    xq = np.hstack([q, -weights]).astype(np.float32)
    return lancedb_store.query(tbl, xq, top_k, exact=exact, nprobes=nprobes, refine_factor=refine_factor)


def _weights(corr, q, weight, info):
    """W(q) for the stored correction: NNN's W is the constant alpha and its method scores are
    the ranking scores. (DN's method scores need the bank means, not stored yet.)"""
    name = corr.weight_param
    if type(corr).__name__ != "NNN" or info["bias_columns"] != 1 or name is None:
        raise ValueError(f"{info['spec']}: only NNN is served from a store so far; use hubless's own Index")
    if set(weight) - {name}:
        raise TypeError(f"{info['spec']} accepts only {name}= as a query-time weight")
    value = np.asarray(corr.check_weight(weight.get(name, corr.get_params()[name])), np.float32)
    return np.broadcast_to(value.reshape(-1, 1), (len(q), 1))
