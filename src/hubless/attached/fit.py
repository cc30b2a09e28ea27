"""Attach a correction to a collection the user already has: one streamed pass, a sidecar.

**Attach** (:func:`attach`): the collection's (ids, vectors) are read in bounded batches
(:mod:`hubless.attached.sources`) and each batch's bank statistics are computed against the
reference banks and turned into its bias columns at once (every bias of NNN, CSLS, IS, DN,
DualIS and DIS/DualDIS is row-local: it reads the item and the banks only, see
:meth:`~hubless.corrections.additive.AdditiveCorrection.row_bias`), so one streamed pass fits the
correction with only the ids and biases kept (n x (8 + 4c) bytes). The gallery-wide statistics
(DIS/DualDIS activation sets: each bank item's k_a nearest items; the collection's mean) are
merged batch by batch (:func:`hubless.engine.merge.merge_topk_ids`). The result is a sidecar
directory (:mod:`hubless.attached.sidecar`) beside the collection; the sidecar also keeps the
*reserve*, the vectors of the items of smallest bias, which the certified search
(:mod:`hubless.attached.certified`) scores exactly on every search. Nothing is written to the
collection unless ``write_payload`` asks for the bias as a payload field
(:meth:`hubless.attached.sources.base.Source.write_payload`).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hubless._validation import check_positive_int
from hubless.attached.certified import AttachedCollection
from hubless.attached.prepare import collection_rows, correction_for, read_banks
from hubless.attached.sidecar import Sidecar, array_fingerprint, write_sidecar
from hubless.attached.sources.base import BATCH, Source, open_source, sample_hash
from hubless.engine import BankStatistics, StatisticsRequest, compute_statistics
from hubless.engine.merge import merge_topk_ids, offset_ids
from hubless.engine.topk import NO_ID
from hubless.errors import InvalidInput, InvalidType

__all__ = ["DEFAULT_RESERVE", "attach"]

#: Default reserve: 1% of the collection, at least / at most these many items.
DEFAULT_RESERVE = (64, 16384)


@dataclass
class _Fitted:
    ids: np.ndarray
    bias: np.ndarray
    gallery_sum: np.ndarray
    activation: dict  # side -> (scores, rows in stream order)
    reserve_ids: np.ndarray  # the reserve's ids and vectors (see _keep_reserve)
    reserve_vectors: np.ndarray


def _keep_reserve(kept: tuple[np.ndarray, np.ndarray, np.ndarray], ids, rows, bias, size: int, below) -> tuple:
    """The reserve after one more batch: the ``size`` items of smallest summed bias so far, or
    (``below`` given: an update) every new item with a bias column under its threshold."""
    if below is not None:
        take = np.flatnonzero((bias < np.asarray(below, np.float32)[None, :]).any(axis=1))
    else:
        take = np.arange(ids.size)
    keys = np.concatenate([kept[2], bias[take].sum(axis=1, dtype=np.float64)])
    all_ids = np.concatenate([kept[0], ids[take]])
    all_rows = np.concatenate([kept[1], rows[take]])
    if below is None and keys.size > size:
        pick = np.argpartition(keys, size - 1)[:size] if size else np.zeros(0, np.int64)
        return all_ids[pick], all_rows[pick], keys[pick]
    return all_ids, all_rows, keys


def fit_stream(
    corr, source: Source, batches, request: StatisticsRequest, qb, gb, n_total: int, progress, *, reserve: int = 0, below=None
) -> _Fitted:
    """Biases of every (ids, vectors) batch, the merged gallery-wide statistics and the reserve."""
    from hubless.progress import progress_bar

    means = (
        np.zeros(source.dim) if qb is None else qb.mean(axis=0, dtype=np.float64),
        None if gb is None else gb.mean(axis=0, dtype=np.float64),
    )
    id_parts, bias_parts = [], []
    total = np.zeros(source.dim, np.float64)
    activation: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    seen = 0
    kept = (np.zeros(0, np.int64), np.zeros((0, source.dim), np.float32), np.zeros(0, np.float64))
    bar = progress_bar(None, progress, total=n_total, desc="attach", unit="item") if n_total else None
    for ids, vectors in batches:
        rows = collection_rows(corr, source, vectors, seen)
        part = compute_statistics(rows, qb, gb, request, bank_means=means)
        bias = corr.row_bias(rows, part)
        bias_parts.append(bias)
        id_parts.append(np.asarray(ids, np.int64))
        kept = _keep_reserve(kept, id_parts[-1], rows, bias, reserve, below)
        total += rows.sum(axis=0, dtype=np.float64)
        for side, k in (("query", request.query_activation_k), ("gallery", request.gallery_activation_k)):
            if not k:
                continue
            local = (getattr(part, f"{side}_activation_scores"), offset_ids(getattr(part, f"{side}_activation"), seen))
            acc = activation.get(side)
            if acc is None:
                n_bank = local[0].shape[0]
                acc = (np.zeros((n_bank, 0), np.float32), np.zeros((n_bank, 0), np.int64))
            activation[side] = merge_topk_ids(acc, local, k)
        seen += rows.shape[0]
        if bar is not None:
            bar.update(rows.shape[0])
    if bar is not None:
        bar.close()
    ids = np.concatenate(id_parts) if id_parts else np.zeros(0, np.int64)
    width = bias_parts[0].shape[1] if bias_parts else 1
    bias = np.concatenate(bias_parts) if bias_parts else np.zeros((0, width), np.float32)
    return _Fitted(ids, bias, total, activation, kept[0], kept[1])


def global_statistics(request: StatisticsRequest, n: int, qb, gb, gallery_mean, activation: dict) -> BankStatistics:
    """The gallery-wide statistics with empty per-row arrays (what the query side reads)."""
    dim = gallery_mean.shape[0]
    stats = BankStatistics(
        n_gallery=n,
        n_query_bank=0 if qb is None else qb.shape[0],
        n_gallery_bank=None if gb is None else gb.shape[0],
        query_bank_mean=np.zeros(dim) if qb is None else qb.mean(axis=0, dtype=np.float64),
        gallery_mean=np.asarray(gallery_mean, np.float64),
        gallery_bank_mean=None if gb is None else gb.mean(axis=0, dtype=np.float64),
    )
    if request.query_topk:
        stats.query_topk = np.zeros((0, request.query_topk), np.float32)
    stats.query_lse = {b: np.zeros(0, np.float64) for b in request.query_betas}
    stats.gallery_lse = {b: np.zeros(0, np.float64) for b in request.gallery_betas}
    for side, (scores, rows) in activation.items():
        setattr(stats, f"{side}_activation_scores", scores)
        setattr(stats, f"{side}_activation", rows)
    return stats


def _sorted(fitted: _Fitted, uri: str) -> tuple[np.ndarray, np.ndarray, dict]:
    order = np.argsort(fitted.ids, kind="stable")
    ids = fitted.ids[order]
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        raise InvalidInput(f"{uri} holds id {int(ids[dup[0]])} more than once: attach needs unique ids")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    activation = {side: (s, np.where(r == NO_ID, NO_ID, inverse[np.maximum(r, 0)])) for side, (s, r) in fitted.activation.items()}
    return ids, fitted.bias[order], activation


def fingerprint(source: Source, ids: np.ndarray) -> dict:
    sample, digest = sample_hash(source, ids)
    return {
        "count": int(ids.size),
        "id_min": int(ids[0]) if ids.size else None,
        "id_max": int(ids[-1]) if ids.size else None,
        "sample_ids": sample,
        "sample_sha256": digest,
    }


def attach(
    source,
    query_bank,
    method="nnn:alpha=0.75,k=16",
    *,
    out,
    gallery_bank=None,
    normalize: bool | None = None,
    reserve: int | None = None,
    batch: int = BATCH,
    progress: bool | None = None,
    write_payload: bool | str = False,
    **source_options,
) -> AttachedCollection:
    """Fit ``method`` on the collection ``source`` (a FAISS index file or ``faiss.Index``, or a
    store URI: ``lancedb://``, ``qdrant://``, ``qdrant+http://``, ``postgresql://``, ``chroma://``,
    ``milvus://``; see :mod:`hubless.attached.sources`) against ``query_bank`` (and
    ``gallery_bank`` for DualIS/DualDIS) in one streamed pass of ``batch`` items, and save the
    sidecar to ``out`` (atomically; an existing sidecar there is replaced). The collection is
    only read. Returns the :class:`AttachedCollection`, ready to search.

    ``source_options``: the source's own (``id_field``, ``vector_field``, ``metric``, ``shard``,
    ``client``);
    ``normalize``: the correction's (default: the method's, True: unit vectors expected);
    ``reserve``: how many lowest-bias items the sidecar keeps the vectors of, to score them
    exactly on every search and tighten the certificate (default 1% of the collection, at
    least 64, at most 16,384; 0: none, the bound then uses the collection's smallest bias);
    ``write_payload``: also write each item's bias into the collection, as the payload field
    (or column) ``hubless_bias`` (a string: that name; ``name_0``, ``name_1``, ... for a
    method of several bias columns), through the store's own payload update, no vector
    re-inserted (:meth:`~hubless.attached.sources.base.Source.write_payload`; LanceDB, Qdrant,
    pgvector, Chroma, Milvus; a FAISS file refuses, before anything is read). :func:`update`
    keeps the field in step.
    """
    if out is None or not isinstance(out, (str, Path)):
        raise InvalidType(f"out must be a directory path for the sidecar; got {out!r}")
    return fit_and_write(
        source,
        query_bank,
        method,
        out,
        gallery_bank,
        normalize,
        reserve,
        batch,
        progress,
        source_options,
        payload=payload_name(write_payload),
        lock=True,
    )


#: The payload field ``write_payload=True`` writes.
PAYLOAD_FIELD = "hubless_bias"


def payload_name(write_payload) -> str | None:
    """The payload field ``write_payload`` asks for (None: none)."""
    if write_payload is None or write_payload is False:
        return None
    if write_payload is True:
        return PAYLOAD_FIELD
    if not isinstance(write_payload, str):
        raise InvalidType(f"write_payload must be True, False or a field name; got {write_payload!r}")
    return write_payload


def fit_and_write(
    source,
    query_bank,
    method,
    out,
    gallery_bank,
    normalize,
    reserve,
    batch,
    progress,
    source_options,
    *,
    payload: str | None = None,
    lock: bool = False,
) -> AttachedCollection:
    """Check everything, then (holding the sidecar's write lock with ``lock``: one attach or
    update of a sidecar at a time, taken only once the input is checked) fit and write."""
    batch = check_positive_int(batch, "batch")
    src = open_source(source, **source_options)
    if payload is not None:
        src.payload_fields(payload, 1)  # a store that can, a valid name: refused before anything is read
    corr = correction_for(method, normalize)
    request, qb, gb = read_banks(corr, query_bank, gallery_bank, src.dim)
    n = src.count()
    if n == 0:
        raise InvalidInput(f"{src.uri} holds no items")
    corr.check_sizes(n, None if qb is None else qb.shape[0], None if gb is None else gb.shape[0])
    requested = reserve
    if reserve is None:
        reserve = min(n, max(DEFAULT_RESERVE[0], n // 100), DEFAULT_RESERVE[1])
    elif isinstance(reserve, bool) or not isinstance(reserve, (int, np.integer)) or reserve < 0:
        raise InvalidInput(f"reserve must be a whole number of items >= 0; got {reserve!r}")
    with contextlib.ExitStack() as held:
        if lock:
            from hubless.index.lock import write_lock

            held.enter_context(write_lock(Path(out), create=True))
        return _fitted_and_written(src, corr, request, qb, gb, n, reserve, requested, batch, progress, source_options, payload, out)


def _fitted_and_written(src, corr, request, qb, gb, n, reserve, requested, batch, progress, source_options, payload, out):
    started, before = time.perf_counter(), src.bytes_read
    fitted = fit_stream(corr, src, src.scan(batch), request, qb, gb, n, progress, reserve=min(int(reserve), n))
    ids, bias, activation = _sorted(fitted, src.uri)
    reserve_ids, reserve_vectors = reserve_sorted(fitted.reserve_ids, fitted.reserve_vectors)
    info = sidecar_info(corr, src, ids, bias, qb, gb, fitted.gallery_sum, exact_mean=True, out=out)
    info["reserve"] = {"size": int(reserve_ids.size), "threshold": _thresholds(ids, bias, reserve_ids), "requested": requested}
    info["attached"] = {"seconds": round(time.perf_counter() - started, 3), "bytes_read": int(src.bytes_read - before), "items": int(n)}
    info["source"]["options"] = _recorded_options(source_options)
    stats = global_statistics(request, ids.size, qb, gb, fitted.gallery_sum / max(ids.size, 1), activation)
    if payload is not None:  # before the sidecar: a failed write leaves the previous sidecar in place
        info["payload"] = written_payload(src, payload, ids, bias, batch)
    sidecar = Sidecar(ids, bias, stats, info, reserve_ids=reserve_ids, reserve_vectors=reserve_vectors)
    write_sidecar(out, sidecar)
    return AttachedCollection(src, sidecar, verify=False)


def written_payload(src: Source, name: str, ids: np.ndarray, bias: np.ndarray, batch: int) -> dict:
    """Write ``bias`` into the payload field(s) ``name`` of ``ids``; what the sidecar records."""
    fields = src.payload_fields(name, bias.shape[1])
    started = time.perf_counter()
    n = src.write_payload(ids, bias, fields, batch)
    return {"name": name, "fields": fields, "items": n, "seconds": round(time.perf_counter() - started, 3)}


def _recorded_options(options: dict) -> dict:
    """The source options worth recording in the sidecar, so that the collection can be opened
    again from it alone (``hubless serve``): plain values (``id_field``, ``vector_field``,
    ``metric``), never an open client or shard."""
    return {k: v for k, v in options.items() if isinstance(v, (str, int, float, bool)) and v is not None}


def reserve_sorted(ids: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(ids, kind="stable")
    return np.ascontiguousarray(ids[order]), np.ascontiguousarray(vectors[order], np.float32)


def _thresholds(ids: np.ndarray, bias: np.ndarray, reserve_ids: np.ndarray) -> list[float]:
    """Each bias column's smallest value over the items *outside* the reserve (the certificate's
    bound; the collection's smallest when everything is in the reserve)."""
    outside = ~np.isin(ids, reserve_ids)
    part = bias[outside] if outside.any() else bias
    return [float(v) for v in part.min(axis=0).astype(np.float64)]


def sidecar_info(corr, src: Source, ids, bias, qb, gb, gallery_sum, *, exact_mean: bool, out) -> dict:
    return {
        "spec": corr.spec,
        "normalize": bool(corr.normalize),
        "dim": int(src.dim),
        "bias_columns": int(bias.shape[1]),
        "source": {"kind": src.kind, "uri": src.uri, **source_location(src, out)},
        "fingerprint": fingerprint(src, ids),
        "banks": {
            "query_bank": {"sha256": array_fingerprint(qb), "n": None if qb is None else int(qb.shape[0])},
            "gallery_bank": {"sha256": array_fingerprint(gb), "n": None if gb is None else int(gb.shape[0])},
        },
        "b_min": [float(v) for v in (bias.min(axis=0).astype(np.float64) if bias.size else np.zeros(bias.shape[1]))],
        "gallery_sum": [float(v) for v in gallery_sum],
        "gallery_mean_exact": bool(exact_mean),
    }


def source_location(src: Source, out) -> dict:
    """Where a local collection (a file or folder) lives, recorded in the sidecar so that it is
    found again from any working folder (:func:`hubless.attached.sidecar.source_address`):
    ``location`` (absolute) and ``location_from_sidecar`` (relative to the sidecar folder, so a
    sidecar moved together with its collection still finds it). Nothing for a server's collection."""
    if src.local is None:
        return {}
    location = Path(src.local).resolve()
    return {"location": str(location), "location_from_sidecar": os.path.relpath(location, Path(out).resolve())}
