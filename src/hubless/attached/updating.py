"""Keep an attached collection's sidecar in step with the collection (:func:`update`).

The collection's id set is read (ids only, in batches) and compared with the sidecar's; only
added items' vectors are read and their biases computed; removed items' rows are dropped.
Methods with gallery-wide statistics (DIS/DualDIS activation sets; DN without a gallery bank,
whose shown scores use the collection's mean, after removals) re-read the whole collection and
say so. A collection is *changed* when its count, id range or sample hash (the vectors of 32
evenly spaced ids) differ from the sidecar's fingerprint: search refuses it until updated (a
vector replaced in place at an unsampled id is not detected: update after such writes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hubless._validation import check_positive_int
from hubless.attached.fit import fingerprint, fit_and_write, fit_stream, global_statistics, reserve_sorted, sidecar_info, written_payload
from hubless.attached.prepare import correction_for, read_banks
from hubless.attached.sidecar import Sidecar, array_fingerprint, is_sidecar, read_sidecar, source_location, write_sidecar
from hubless.attached.sources.base import BATCH, Source, open_source
from hubless.errors import Conflict, InvalidInput
from hubless.export.base import without_password

__all__ = ["update"]


def update(
    out,
    source,
    query_bank,
    *,
    gallery_bank=None,
    batch: int = BATCH,
    progress: bool | None = None,
    **source_options,
) -> dict:
    """Bring the sidecar in ``out`` in step with ``source`` after items were added or removed
    there: the ids are compared (read in batches; no vector), only added items' vectors are read
    and their biases computed, removed items' rows dropped. DIS/DualDIS (activation sets over the
    whole collection) and DN without a gallery bank after removals (its shown scores use the
    collection's mean) re-read the whole collection: the report says so (``refit``).

    The banks must be the ones the sidecar was fitted on (checked by fingerprint). A sidecar
    attached with ``write_payload`` writes the added items' biases (all, on a refit) into the
    same payload field. Returns ``{"added", "removed", "items", "bytes_read", "read_items",
    "refit", "payload_items"}`` (``payload_items``: the items whose payload field was written).
    """
    from hubless.index.lock import write_lock

    if not is_sidecar(out):
        read_sidecar(out)  # its error: no lock file is made in what is not a sidecar
    with write_lock(Path(out)):  # one attach or update of a sidecar at a time
        return _update(out, source, query_bank, gallery_bank, batch, progress, source_options)


def _update(out, source, query_bank, gallery_bank, batch, progress, source_options) -> dict:
    batch = check_positive_int(batch, "batch")
    old = read_sidecar(out)
    src = open_source(source, **source_options)
    if not isinstance(source, Source) and not same_collection(src, old):
        raise Conflict(f"sidecar {out} is attached to {without_password(old.info['source']['uri'])}, not {src.uri}")
    corr = correction_for(old.spec, bool(old.info["normalize"]))
    request, qb, gb = read_banks(corr, query_bank, gallery_bank, src.dim)
    for name, bank in (("query_bank", qb), ("gallery_bank", gb)):
        if array_fingerprint(bank) != old.info["banks"][name]["sha256"]:
            raise InvalidInput(f"{name} is not the one sidecar {out} was fitted on (fingerprint differs): attach again to change banks")
    before = src.bytes_read
    current = np.concatenate(list(src.scan_ids(batch)) or [np.zeros(0, np.int64)])
    current = np.sort(current)
    added = np.setdiff1d(current, old.ids, assume_unique=False)
    removed = np.setdiff1d(old.ids, current)
    mean_read = corr.name == "dn" and gb is None
    refit = None
    if added.size == 0 and removed.size == 0:
        fp = fingerprint(src, old.ids)
        if fp["sample_sha256"] != old.info["fingerprint"]["sample_sha256"]:
            refit = "the sampled items' vectors changed in place (same ids): every item was re-read"
        else:
            return {
                "added": 0,
                "removed": 0,
                "items": int(old.ids.size),
                "bytes_read": int(src.bytes_read - before),
                "read_items": 0,
                "refit": None,
                "payload_items": 0,
            }
    if request.query_activation_k or request.gallery_activation_k:
        refit = f"{corr.spec} gates by activation sets over the whole collection: every item was re-read"
    elif mean_read and removed.size:
        refit = "DN without a gallery bank shows scores with the collection's mean, which removals change: every item was re-read"
    if refit is not None:
        requested = old.info["reserve"].get("requested")
        kept = old.info["source"].get("options", {})  # recorded again (src is open: open_source ignores them)
        payload = (old.info.get("payload") or {}).get("name")
        fit_and_write(
            src, query_bank, old.spec, out, gallery_bank, bool(old.info["normalize"]), requested, batch, progress, kept, payload=payload
        )
        return {
            "added": int(added.size),
            "removed": int(removed.size),
            "items": int(current.size),
            "bytes_read": int(src.bytes_read - before),
            "read_items": int(current.size),
            "refit": refit,
            "payload_items": int(current.size) if payload is not None else 0,
        }
    if current.size == 0:
        raise InvalidInput(f"{src.uri} holds no items")
    corr.check_sizes(current.size, None if qb is None else qb.shape[0], None if gb is None else gb.shape[0])

    def new_batches():
        for lo in range(0, added.size, batch):
            ids = added[lo : lo + batch]
            yield ids, src.fetch(ids, batch)

    threshold = np.asarray(old.info["reserve"]["threshold"], np.float32)
    fitted = fit_stream(corr, src, new_batches(), request, qb, gb, int(added.size), progress, below=threshold)
    keep_reserve = ~np.isin(old.reserve_ids, removed)  # the threshold stays a lower bound: removals only raise the minimum
    reserve_ids, reserve_vectors = reserve_sorted(
        np.concatenate([old.reserve_ids[keep_reserve], fitted.reserve_ids]),
        np.concatenate([old.reserve_vectors[keep_reserve], fitted.reserve_vectors]),
    )
    keep = ~np.isin(old.ids, removed)
    ids = np.concatenate([old.ids[keep], fitted.ids])
    bias = np.concatenate([old.bias[keep], fitted.bias])
    order = np.argsort(ids, kind="stable")
    ids, bias = ids[order], bias[order]
    gallery_sum = np.asarray(old.info["gallery_sum"], np.float64) + fitted.gallery_sum
    exact_mean = bool(old.info.get("gallery_mean_exact", True)) and removed.size == 0
    info = sidecar_info(corr, src, ids, bias, qb, gb, gallery_sum, exact_mean=exact_mean, out=out)
    info["attached"] = old.info.get("attached")
    info["source"]["options"] = old.info["source"].get("options", {})
    info["reserve"] = {**old.info["reserve"], "size": int(reserve_ids.size), "threshold": [float(v) for v in threshold]}
    stats = global_statistics(request, ids.size, qb, gb, gallery_sum / max(ids.size, 1), {})
    recorded = old.info.get("payload")
    if recorded:  # the added items' biases into the same field (the others' are unchanged: row-local biases)
        info["payload"] = {**recorded, **written_payload(src, recorded["name"], fitted.ids, fitted.bias, batch)}
    write_sidecar(out, Sidecar(ids, bias, stats, info, reserve_ids=reserve_ids, reserve_vectors=reserve_vectors))
    return {
        "added": int(added.size),
        "removed": int(removed.size),
        "items": int(ids.size),
        "bytes_read": int(src.bytes_read - before),
        "read_items": int(added.size),
        "refit": None,
        "payload_items": int(fitted.ids.size) if recorded else 0,
    }


def same_collection(src: Source, sidecar: Sidecar) -> bool:
    """Whether ``src`` is the collection ``sidecar`` records: the same address, or the same local
    file or folder (given by an address relative to another working folder)."""
    recorded = sidecar.info["source"]
    if src.uri == without_password(recorded["uri"]):  # a sidecar of an earlier hubless may hold one
        return True
    if src.local is None:
        return False
    here = Path(src.local).resolve()
    found = source_location(sidecar)
    return str(here) == recorded.get("location") or (found is not None and found.resolve() == here)
