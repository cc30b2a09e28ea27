"""Keep an attached collection's sidecar in step with the collection (:func:`update`): two updates.

**The default update** reads the collection's ids (8 bytes each, no vector) and compares the id
sets; reads the added items' vectors; and reads a *rotating sample* of
:data:`~hubless.attached.digests.SAMPLE` kept items (from a cursor the sidecar records and each
update advances, so successive updates check successive items) and compares them with their
digests. Added items and sampled items found changed get their biases computed; removed items'
rows are dropped. A vector replaced in place outside the sample is not seen.

**The full check** (``full=True``, ``hubless attach --update --full``) reads every vector once,
compares each with its digest batch by batch, and refits exactly the items that changed: added,
removed, changed in place (swapped ids included), reserve items among them (their copies are
replaced or dropped). A FAISS file is read whole by any update, so its update is always the
full check (at no extra read).

Both keep the reserve's promise: a changed or added item whose bias falls under the reserve's
threshold joins the reserve (with its new vector), a changed or removed one leaves it. Methods
with gallery-wide statistics (DIS/DualDIS activation sets; DN without a gallery bank, whose shown
scores use the collection's mean, after removals or in-place changes a default update cannot
undo) re-read the whole collection when anything changed, and say so (``refit``); so does a
sidecar written before digests. The store's version mark (when it keeps one) is recorded after
the update, so an open collection serves again.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hubless._validation import check_positive_int
from hubless.attached.beam import BEAM_RECALL
from hubless.attached.digests import SAMPLE, changed_in_sample, sample_positions, vector_digests
from hubless.attached.fit import fit_and_write, reserve_sorted, sidecar_info, written_payload
from hubless.attached.prepare import collection_rows, correction_for, read_banks
from hubless.attached.sidecar import Sidecar, array_fingerprint, is_sidecar, read_sidecar, same_collection, write_sidecar
from hubless.attached.sources.base import BATCH, Source, open_source
from hubless.attached.stream import fit_stream, global_statistics
from hubless.errors import Conflict, InvalidInput, InvalidType
from hubless.export.base import without_password

__all__ = ["update"]


def update(
    out,
    source,
    query_bank,
    *,
    gallery_bank=None,
    full: bool = False,
    batch: int = BATCH,
    progress: bool | None = None,
    **source_options,
) -> dict:
    """Bring the sidecar in ``out`` in step with ``source`` (see the module docstring for what
    each update reads): the default update (ids, added items, a rotating sample), or with
    ``full`` the full check (every vector once, compared with its digest).

    The banks must be the ones the sidecar was fitted on (checked by fingerprint). A sidecar
    attached with ``write_payload`` writes the new biases into the same payload field. Returns
    ``{"added", "removed", "changed", "items", "checked", "full", "bytes_read", "read_items",
    "refit", "payload_items"}``: ``changed`` the items found changed in place, ``checked`` the
    vectors compared with their digests, ``read_items`` the vectors read, ``bytes_read`` what
    the process read (a FAISS file: its size), ``refit`` why every item was re-read (or None).
    """
    from hubless.index.lock import write_lock

    if not isinstance(full, (bool, np.bool_)):
        raise InvalidType(f"full must be True or False; got {full!r}")
    if not is_sidecar(out):
        read_sidecar(out)  # its error: no lock file is made in what is not a sidecar
    with write_lock(Path(out)):  # one attach or update of a sidecar at a time
        return _update(out, source, query_bank, gallery_bank, bool(full), batch, progress, source_options)


def _update(out, source, query_bank, gallery_bank, full, batch, progress, source_options) -> dict:
    batch = check_positive_int(batch, "batch")
    old = read_sidecar(out)
    src = open_source(source, **source_options)
    before = 0 if src is not source else src.bytes_read
    if not isinstance(source, Source) and not same_collection(src, old):
        raise Conflict(f"sidecar {out} is attached to {without_password(old.info['source']['uri'])}, not {src.uri}")
    corr = correction_for(old.spec, bool(old.info["normalize"]))
    request, qb, gb = read_banks(corr, query_bank, gallery_bank, src.dim)
    for name, bank in (("query_bank", qb), ("gallery_bank", gb)):
        if array_fingerprint(bank) != old.info["banks"][name]["sha256"]:
            raise InvalidInput(f"{name} is not the one sidecar {out} was fitted on (fingerprint differs): attach again to change banks")
    full = full or src.reads_whole  # a FAISS file is read whole anyway
    mark = src.version()
    gated = bool(request.query_activation_k or request.gallery_activation_k)
    mean_read = corr.name == "dn" and gb is None
    report = {"full": full, "refit": None, "payload_items": 0}
    if old.digests is None:
        report["refit"] = "the sidecar has no digests (written by an earlier hubless): every item was re-read"
    elif full:
        found = _full_changes(src, old, batch)
    else:
        found = _sampled_changes(src, old, batch)
    if report["refit"] is None:
        changes = found["added"].size + found["removed"].size + found["changed"].size
        if found.get("many"):
            report["refit"] = "more than a quarter of the collection changed: every item was re-read"
        elif gated and changes:
            report["refit"] = f"{corr.spec} gates by activation sets over the whole collection: every item was re-read"
        elif mean_read and not full and (found["removed"].size or found["changed"].size):
            report["refit"] = (
                "DN without a gallery bank shows scores with the collection's mean, which this change moves: every item was re-read"
            )
    if report["refit"] is not None:
        return _refit(out, src, old, query_bank, gallery_bank, batch, progress, report, before)
    if src.version() != mark:
        raise Conflict(f"{src.uri} changed while it was read (a write during the update): run the update again")
    added, removed, changed = found["added"], found["removed"], found["changed"]
    refit_ids = np.concatenate([added, changed])
    current = old.ids.size + added.size - removed.size
    if current == 0:
        raise InvalidInput(f"{src.uri} holds no items")
    corr.check_sizes(current, None if qb is None else qb.shape[0], None if gb is None else gb.shape[0])

    def new_batches():
        yield from found["read"]  # the vectors the check read (changed items; with the full check, added ones too)
        fetch = found["fetch"]
        for lo in range(0, fetch.size, batch):
            ids = fetch[lo : lo + batch]
            yield ids, src.fetch(ids, batch)

    threshold = np.asarray(old.info["reserve"]["threshold"], np.float32)
    fitted = fit_stream(corr, src, new_batches(), request, qb, gb, int(refit_ids.size), progress, below=threshold)
    gone = np.concatenate([removed, changed])  # their rows and reserve copies go; the changed ones come back refitted
    keep_reserve = ~np.isin(old.reserve_ids, gone)  # the threshold stays a lower bound: removals only raise the minimum
    reserve_ids, reserve_vectors = reserve_sorted(
        np.concatenate([old.reserve_ids[keep_reserve], fitted.reserve_ids]),
        np.concatenate([old.reserve_vectors[keep_reserve], fitted.reserve_vectors]),
    )
    keep = ~np.isin(old.ids, gone)
    order = np.argsort(np.concatenate([old.ids[keep], fitted.ids]), kind="stable")
    joined = {
        name: np.concatenate([getattr(old, name)[keep], getattr(fitted, name)])[order] for name in ("ids", "bias", "digests", "scale")
    }
    ids = joined["ids"]
    if full:
        gallery_sum, exact_mean = found["sum"], True
    else:
        gallery_sum = np.asarray(old.info["gallery_sum"], np.float64) + fitted.gallery_sum
        exact_mean = bool(old.info.get("gallery_mean_exact", True)) and removed.size == 0 and changed.size == 0
    info = sidecar_info(corr, src, ids, joined["bias"], qb, gb, gallery_sum, exact_mean=exact_mean, out=out)
    for kept in ("attached", "beam", "notes"):
        info[kept] = old.info.get(kept)
    info["source"]["options"] = old.info["source"].get("options", {})
    info["reserve"] = {**old.info["reserve"], "size": int(reserve_ids.size), "threshold": [float(v) for v in threshold]}
    info["checks"] = {"cursor": found["cursor"]}
    stats = global_statistics(request, ids.size, qb, gb, gallery_sum / max(ids.size, 1), {})
    recorded = old.info.get("payload")
    if recorded and fitted.ids.size:  # the new biases into the same field (the others' are unchanged: row-local biases)
        info["payload"] = {**recorded, **written_payload(src, recorded["name"], fitted.ids, fitted.bias, batch)}
        report["payload_items"] = int(fitted.ids.size)
    elif recorded:
        info["payload"] = recorded
    info["source"]["version"] = src.version()  # after hubless's own writes
    digests, scale = joined["digests"], joined["scale"]
    sidecar = Sidecar(
        ids, joined["bias"], stats, info, reserve_ids=reserve_ids, reserve_vectors=reserve_vectors, digests=digests, scale=scale
    )
    write_sidecar(out, sidecar)
    return {
        **report,
        "added": int(added.size),
        "removed": int(removed.size),
        "changed": int(changed.size),
        "items": int(ids.size),
        "checked": int(found["checked"]),
        "bytes_read": int(src.bytes_read - before),
        "read_items": int(found["read_items"]),
    }


def _sampled_changes(src: Source, old: Sidecar, batch: int) -> dict:
    """The default update's reads: every id, then a rotating sample of kept items' vectors."""
    current = np.sort(np.concatenate(list(src.scan_ids(batch)) or [np.zeros(0, np.int64)]))
    added = np.setdiff1d(current, old.ids)
    removed = np.setdiff1d(old.ids, current)
    cursor = int((old.info.get("checks") or {}).get("cursor", 0))
    assert old.digests is not None  # a sidecar without them is refitted instead
    kept = ~np.isin(old.ids, removed)
    positions = sample_positions(int(kept.sum()), cursor)  # over the items still there
    changed, _ = (
        changed_in_sample(src, old.ids[kept], old.digests[kept], positions, batch) if positions.size else (_NOTHING["changed"], None)
    )
    read = [(changed, src.fetch(changed, batch))] if changed.size else []  # few: read again, as the store holds them now
    return {
        "added": added,
        "removed": removed,
        "changed": changed,
        "read": read,
        "fetch": added,
        "checked": positions.size,
        "read_items": positions.size + changed.size + added.size,
        "cursor": cursor + 1,
    }


def _full_changes(src: Source, old: Sidecar, batch: int) -> dict:
    """The full check's read: every (id, vector) once, digests compared batch by batch; the
    changed items' vectors are kept for their refit (bounded: a check that finds more than a
    quarter of the collection changed refits everything instead), the collection's sum
    recomputed exactly."""
    ids, n, digests = old.ids, old.ids.size, old.digests
    assert digests is not None  # a sidecar without them is refitted instead
    corr = correction_for(old.spec, bool(old.info["normalize"]))
    seen = np.zeros(n, bool)
    total = np.zeros(src.dim, np.float64)
    added, changed, read = [], [], []
    checked = kept_items = 0
    for item_ids, vectors in src.scan(batch):
        item_ids = np.asarray(item_ids, np.int64)
        pos = np.minimum(np.searchsorted(ids, item_ids), max(n - 1, 0))
        known = (ids[pos] == item_ids) if n else np.zeros(item_ids.shape, bool)
        seen[pos[known]] = True
        differ = known & (vector_digests(vectors) != digests[pos])
        checked += int(known.sum())
        total += collection_rows(corr, src, vectors, item_ids).sum(axis=0, dtype=np.float64)
        added.append(item_ids[~known])
        changed.append(item_ids[differ])
        new = differ | ~known
        if new.any():
            read.append((item_ids[new], np.asarray(vectors, np.float32)[new]))
            kept_items += int(new.sum())
            if kept_items > max(4 * SAMPLE, n // 4):
                return {**_NOTHING, "many": True}
    return {
        "added": np.sort(np.concatenate(added)) if added else _NOTHING["added"],
        "removed": ids[~seen],
        "changed": np.concatenate(changed) if changed else _NOTHING["changed"],
        "read": read,
        "fetch": _NOTHING["added"],
        "checked": checked,
        "read_items": checked + int(sum(a.size for a in added)),
        "cursor": int((old.info.get("checks") or {}).get("cursor", 0)),
        "sum": total,
    }


#: A check that found nothing (or gave up: ``many``).
_NOTHING = {"added": np.zeros(0, np.int64), "removed": np.zeros(0, np.int64), "changed": np.zeros(0, np.int64)}


def _refit(out, src: Source, old: Sidecar, query_bank, gallery_bank, batch, progress, report: dict, before: int) -> dict:
    """Attach again over the whole collection (one more read), keeping the sidecar's options."""
    requested = old.info["reserve"].get("requested")
    kept = old.info["source"].get("options", {})  # recorded again (src is open: open_source ignores them)
    payload = (old.info.get("payload") or {}).get("name")
    old_ids = old.ids
    target = (old.info.get("beam") or {}).get("target", BEAM_RECALL)
    fresh = fit_and_write(
        src,
        query_bank,
        old.spec,
        out,
        gallery_bank,
        bool(old.info["normalize"]),
        requested,
        batch,
        progress,
        kept,
        payload=payload,
        beam_recall=target,
    )
    side = fresh.sidecar
    changed = 0
    if old.digests is not None and side.digests is not None:  # what changed in place, from the two sets of digests
        _, a, b = np.intersect1d(old_ids, side.ids, return_indices=True)
        changed = int((old.digests[a] != side.digests[b]).sum())
    return {
        **report,
        "added": int(np.setdiff1d(side.ids, old_ids).size),
        "removed": int(np.setdiff1d(old_ids, side.ids).size),
        "changed": changed,
        "items": int(side.ids.size),
        "checked": int(side.ids.size),
        "full": True,
        "bytes_read": int(src.bytes_read - before),
        "read_items": int(side.ids.size),
        "payload_items": int(side.ids.size) if payload is not None else 0,
    }
