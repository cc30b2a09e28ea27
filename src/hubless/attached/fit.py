"""Attach a correction to a collection the user already has: one streamed pass, a sidecar.

**Attach** (:func:`attach`): the collection's (ids, vectors) are read in bounded batches
(:mod:`hubless.attached.sources`) and each batch's bias columns, content digests and scales are
computed at once (:func:`hubless.attached.stream.fit_stream`), so one streamed pass fits the
correction with only the ids, biases, digests and scales kept (n x (20 + 4c) bytes). The
result is a sidecar directory (:mod:`hubless.attached.sidecar`) beside the collection; the
sidecar also keeps the *reserve*, the vectors of the items of smallest bias, which the
certified search (:mod:`hubless.attached.certified`) scores exactly on every search, the
store's version mark when it keeps one, and on an ANN store the default beam chosen from the
store's recall measured on the way (:mod:`hubless.attached.beam`). Nothing is written to the
collection unless ``write_payload`` asks for the bias as a payload field
(:meth:`hubless.attached.sources.base.Source.write_payload`). An existing sidecar is replaced
only with ``overwrite=True``; a folder that holds something else never.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np

from hubless._validation import check_positive_int, check_target_recall
from hubless.attached.beam import BEAM_RECALL, PROBE_K, RecallProbe, calibrate, probe_queries
from hubless.attached.certified import AttachedCollection
from hubless.attached.prepare import correction_for, read_banks
from hubless.attached.sidecar import Sidecar, array_fingerprint, is_sidecar, read_sidecar, write_sidecar
from hubless.attached.sources.base import BATCH, Source, open_source
from hubless.attached.stream import Fitted, fit_stream, global_statistics
from hubless.engine.topk import NO_ID
from hubless.errors import AlreadyExists, Conflict, HublessError, InvalidInput, InvalidType

__all__ = ["DEFAULT_RESERVE", "attach"]

#: Default reserve: 1% of the collection, at least / at most these many items.
DEFAULT_RESERVE = (64, 16384)


def _sorted(fitted: Fitted, uri: str) -> tuple[np.ndarray, dict, dict]:
    """The fitted rows in id order (``ids``, ``bias``, ``digests``, ``scale``) and the activation
    sets as rows of those ids; an id read twice is refused."""
    order = np.argsort(fitted.ids, kind="stable")
    ids = fitted.ids[order]
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        raise InvalidInput(f"{uri} holds id {int(ids[dup[0]])} more than once: attach needs unique ids")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    activation = {side: (s, np.where(r == NO_ID, NO_ID, inverse[np.maximum(r, 0)])) for side, (s, r, _) in fitted.activation.items()}
    rows = {"ids": ids, "bias": fitted.bias[order], "digests": fitted.digests[order], "scale": fitted.scale[order]}
    return ids, rows, activation


def fingerprint(ids: np.ndarray) -> dict:
    """What an attach or update read: the count and the id range (the vectors' digests are
    ``digests.npy``)."""
    return {"count": int(ids.size), "id_min": int(ids[0]) if ids.size else None, "id_max": int(ids[-1]) if ids.size else None}


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
    overwrite: bool = False,
    beam_recall: float | None = None,
    **source_options,
) -> AttachedCollection:
    """Fit ``method`` on the collection ``source`` (a FAISS index file or ``faiss.Index``, or a
    store URI: ``lancedb://``, ``qdrant://``, ``qdrant+http://``, ``postgresql://``, ``chroma://``,
    ``milvus://``; see :mod:`hubless.attached.sources`) against ``query_bank`` (and
    ``gallery_bank`` for DualIS/DualDIS) in one streamed pass of ``batch`` items, and save the
    sidecar to ``out`` (atomically). The collection is only read. Returns the
    :class:`AttachedCollection`, ready to search; its sidecar's ``info["replaced"]`` names the
    sidecar it replaced, ``info["notes"]`` what the user should know (ids that are positions).

    ``beam_recall``: on an ANN store, the store's plain recall@k' the default beam is chosen to
    reach on a sample of the query bank (default :data:`hubless.attached.beam.BEAM_RECALL`,
    0.99; :mod:`hubless.attached.beam`);
    ``overwrite``: replace a sidecar already in ``out`` (without it,
    :class:`~hubless.errors.AlreadyExists` names what it holds); a folder holding anything but
    a sidecar is never replaced.

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
    if not isinstance(overwrite, (bool, np.bool_)):
        raise InvalidType(f"overwrite must be True or False; got {overwrite!r}")
    target = BEAM_RECALL if beam_recall is None else check_target_recall(beam_recall)
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
        overwrite=bool(overwrite),
        beam_recall=target,
    )


def replaceable(out: Path, overwrite: bool) -> dict | None:
    """What ``out`` holds that an attach would replace: None (nothing, or an empty folder), the
    sidecar's spec and collection (with ``overwrite``); :class:`~hubless.errors.AlreadyExists`
    for a sidecar without ``overwrite`` and for anything else."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        return None
    if not is_sidecar(out):
        raise AlreadyExists(f"{out} exists and is not a sidecar: choose another --out (attach replaces only a sidecar)")
    try:
        info = read_sidecar(out).info
        held = {"spec": info["spec"], "source": info["source"]["uri"]}
    except HublessError:  # damaged: still a sidecar, replaceable
        held = {"spec": None, "source": None}
    if not overwrite:
        what = f"{held['spec']} attached to {held['source']}" if held["spec"] else "a damaged sidecar"
        raise AlreadyExists(
            f"{out} holds a sidecar already ({what}): pass overwrite=True (--overwrite) to replace it, or choose another --out"
        )
    return held


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
    overwrite: bool = False,
    beam_recall: float = BEAM_RECALL,
) -> AttachedCollection:
    """Check everything, then (holding the sidecar's write lock with ``lock``: one attach or
    update of a sidecar at a time, taken only once the input is checked) fit and write."""
    batch = check_positive_int(batch, "batch")
    src = open_source(source, **source_options)
    before = 0 if src is not source else src.bytes_read  # a source opened here: what opening it read counts
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
    replaced = replaceable(Path(out), overwrite) if lock else None  # refused before the lock file is made in out
    with contextlib.ExitStack() as held:
        if lock:
            from hubless.index.lock import write_lock

            held.enter_context(write_lock(Path(out), create=True))
        return _fitted_and_written(
            src, corr, request, qb, gb, n, reserve, requested, batch, progress, source_options, payload, out, replaced, beam_recall, before
        )


def _fitted_and_written(
    src, corr, request, qb, gb, n, reserve, requested, batch, progress, source_options, payload, out, replaced, beam_recall, before
):
    started = time.perf_counter()
    mark = src.version()
    ann = qb is not None and src.beam_knob is not None and not src.searches_exactly({})
    probe = RecallProbe(probe_queries(qb), PROBE_K) if ann else None
    fitted = fit_stream(corr, src, src.scan(batch), request, qb, gb, n, progress, reserve=min(int(reserve), n), probe=probe)
    if src.version() != mark:
        raise Conflict(f"{src.uri} changed while it was read (a write during the attach): attach again")
    ids, rows, activation = _sorted(fitted, src.uri)
    reserve_ids, reserve_vectors = reserve_sorted(fitted.reserve_ids, fitted.reserve_vectors)
    info = sidecar_info(corr, src, ids, rows["bias"], qb, gb, fitted.gallery_sum, exact_mean=True, out=out)
    info["reserve"] = {"size": int(reserve_ids.size), "threshold": _thresholds(ids, rows["bias"], reserve_ids), "requested": requested}
    info["beam"] = None if probe is None else calibrate(src, probe, beam_recall)
    info["attached"] = {"seconds": round(time.perf_counter() - started, 3), "bytes_read": int(src.bytes_read - before), "items": int(n)}
    info["source"]["options"] = _recorded_options(source_options)
    info["notes"] = source_notes(src, payload is not None)
    if replaced is not None:
        info["replaced"] = replaced
    stats = global_statistics(request, ids.size, qb, gb, fitted.gallery_sum / max(ids.size, 1), activation)
    if payload is not None:  # before the sidecar: a failed write leaves the previous sidecar in place
        info["payload"] = written_payload(src, payload, ids, rows["bias"], batch)
    info["source"]["version"] = src.version()  # after hubless's own writes
    sidecar = Sidecar(
        ids,
        rows["bias"],
        stats,
        info,
        reserve_ids=reserve_ids,
        reserve_vectors=reserve_vectors,
        digests=rows["digests"],
        scale=rows["scale"],
    )
    write_sidecar(out, sidecar)
    return AttachedCollection(src, sidecar, verify=False)


def source_notes(src: Source, payload_written: bool = False) -> list[str]:
    """What a user should know of how the collection is attached (printed by ``hubless attach``)."""
    notes = []
    if getattr(src, "positions_as_ids", False):
        notes.append(
            f"{src.uri} has no id map: its ids are its positions, which FAISS renumbers when items are removed; "
            "an update compares every vector of a FAISS file, so renumbered items are found and refitted "
            "(wrap the index in IndexIDMap2 to keep ids of your own)"
        )
    if payload_written and src.payload_note:
        notes.append(src.payload_note)
    return notes


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
        "fingerprint": fingerprint(ids),
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
