"""Every change of an index, as a function from one :class:`~hubless.index.live.Snapshot` to the next.

A write never changes a snapshot: each function here returns a new one sharing what did not
change (so a search holding the old one sees one consistent version). They are the one way an
index changes, whoever writes it: :class:`hubless.Index` (in memory, or committed by
:class:`hubless.index.directory.Directory`), :func:`hubless.index.reading.replay` (a saved
segment applied on load) and :func:`hubless.index.segments.commit_segments`.

* :func:`built`: the first version, over a fitted correction (its FAISS structure built).
* :func:`added` / :func:`removed` / :func:`upserted` / :func:`removed_where`: items in and out,
  O(batch). An added row's bank statistics and bias come from the banks alone (n_new x n_bank
  similarities: every bias is row-local, see
  :meth:`hubless.corrections.base.AdditiveCorrection.row_bias`); a removal marks rows dead and
  recomputes the DIS/DualDIS activation lists that lost a row, over the live rows.
* :func:`with_metadata`: metadata changed, the rows written again at the end (no similarity).
* :func:`replayed`: one saved write (a segment) applied: rows appended, rows marked dead,
  activation lists merged or replaced.
* :func:`compacted` / :func:`with_bank_items` / :func:`rebased`: a new base (the live items; a
  bank grown; biases changed).

The shared state (activation sets, the live gallery sum) is kept exact, so after any sequence
of writes searching the snapshot equals a fresh build over its live items (tested against a
dict model in ``tests/index/test_live_index.py``).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from hubless.corrections import AdditiveCorrection, incremental
from hubless.corrections.serving import check_additive
from hubless.engine import compute_statistics
from hubless.engine.merge import merge_topk_ids
from hubless.engine.topk import NO_ID
from hubless.errors import AlreadyExists, Corrupt, InvalidInput, InvalidType, NotFitted
from hubless.index.config import IndexConfig
from hubless.index.factory import is_flat
from hubless.index.faiss_build import build_faiss, default_factory
from hubless.index.ids import assigned_ids, check_ids, first_few
from hubless.index.live import SIDES, Snapshot, _with_rows, augmented_rows, split_statistics
from hubless.index.metadata import Metadata
from hubless.index.rows import Growable

__all__ = [
    "added",
    "appended",
    "built",
    "compacted",
    "rebased",
    "killed",
    "removed",
    "removed_where",
    "replayed",
    "upserted",
    "with_bank_items",
    "with_config",
    "with_metadata",
]


def appended(snap: Snapshot, rows, bias, ids, part_rows: dict, meta) -> Snapshot:
    """Rows, their bias, ids and per-row statistics appended, alive (no other change)."""
    n0, t0 = snap.n_rows, snap.n_tail
    if snap.tail is None:
        tail = Growable(rows)
    else:
        tail, _ = snap.tail.extended(t0, rows)
    bias_buf, _ = snap.bias_buf.extended(n0, bias)
    ids_buf, _ = snap.ids_buf.extended(n0, ids)
    alive_buf = snap.alive_buf if snap.alive_buf is not None else Growable(snap.alive)  # a copy once after a removal
    alive_buf, alive = alive_buf.extended(n0, np.ones(rows.shape[0], dtype=bool))
    stats_tail = {}
    for name in snap.stats_base:
        buffer = snap.stats_tail.get(name)
        stats_tail[name] = Growable(part_rows[name]) if buffer is None else buffer.extended(t0, part_rows[name])[0]
    return replace(
        snap,
        tail=tail,
        n_rows=n0 + rows.shape[0],
        bias_buf=bias_buf,
        ids_buf=ids_buf,
        alive=alive,
        alive_buf=alive_buf,
        stats_tail=stats_tail,
        id_map=snap.id_map.extended(n0, ids),
        next_id=max(snap.next_id, int(ids.max(initial=-1)) + 1),
        metadata=meta,
        extra={},
    )


def replayed(snap: Snapshot, part: dict) -> Snapshot:
    """This snapshot with one saved write applied (see :mod:`hubless.index.disk`): rows
    appended (their ids, bias, statistics, metadata), rows marked dead, activation lists
    merged (rows' own nearest lists) or replaced (recomputed at the write)."""
    start = part.get("start")
    if start is not None and start != snap.n_rows:
        raise Corrupt(f"{part['name']} was written after row {start}; the index has {snap.n_rows} rows before it")
    rows = part["rows"]
    first_row = snap.n_rows
    dead = part["dead"]
    if dead.size and (dead.min() < 0 or dead.max() >= first_row + rows.shape[0]):
        raise Corrupt(f"{part['name']} removes rows the index does not have")
    snap = killed(snap, dead[dead < first_row], part)  # removals first: an upsert adds an id it removes
    if rows.shape[0]:
        ids = part["ids"]
        taken = snap.id_map.rows(ids, snap.n_rows)
        if ((taken >= 0) & snap.alive[np.maximum(taken, 0)]).any():
            raise Corrupt(f"{part['name']} adds ids the index holds already")
        stats = {name: part["statistics"][name] for name in snap.stats_base}
        snap = appended(snap, rows, part["bias"], ids, stats, part["metadata"])
        snap = replace(snap, gallery_sum=snap.gallery_sum + rows.sum(axis=0, dtype=np.float64))
    snap = killed(snap, dead[dead >= first_row], part)
    bank = snap.bank
    for side in SIDES:
        lists = getattr(bank, f"{side}_activation")
        merge, replaced = part["activation"].get(f"{side}.merge"), part["activation"].get(f"{side}.replace")
        if lists is None:
            if merge is not None or replaced is not None:
                raise Corrupt(f"{part['name']} holds {side}-bank activation sets this correction does not use")
            continue
        scores = getattr(bank, f"{side}_activation_scores")
        for kind, record in (("merge", merge), ("replace", replaced)):
            if record is None:
                continue
            which, new_ids, new_scores = record
            if which.size and (which.min() < 0 or which.max() >= lists.shape[0]) or new_ids.shape != (which.size, lists.shape[1]):
                raise Corrupt(f"{part['name']}: its {side}-bank activation lists do not fit the bank")
            lists, scores = lists.copy(), scores.copy()
            if kind == "merge":
                offset = np.where(new_ids == NO_ID, NO_ID, new_ids + first_row)
                scores[which], lists[which] = merge_topk_ids((scores[which], lists[which]), (new_scores, offset))
            else:
                lists[which], scores[which] = new_ids, new_scores
        valid = lists[lists != NO_ID]
        if valid.size and (valid.max() >= snap.n_rows or not snap.alive[valid].all()):
            raise Corrupt(f"{part['name']}: its {side}-bank activation lists name rows that are not live")
        bank = replace(bank, **{f"{side}_activation": lists, f"{side}_activation_scores": scores})
    return replace(snap, bank=bank, next_id=max(snap.next_id, part.get("next_id", 0)), extra={})


def killed(snap: Snapshot, dead: np.ndarray, part: dict) -> Snapshot:
    if not dead.size:
        return snap
    if not snap.alive[dead].all():
        raise Corrupt(f"{part['name']} removes rows that are not live rows of the index")
    alive = snap.alive.copy()
    alive[dead] = False
    gone = snap.gather(dead).sum(axis=0, dtype=np.float64)
    return replace(
        snap,
        alive=alive,
        alive_buf=None,
        n_dead_rows=snap.n_dead_rows + np.unique(dead).size,
        gallery_sum=snap.gallery_sum - gone,
        extra={},
    )


def added(snap: Snapshot, rows: np.ndarray, ids=None, metadata=None, *, progress: bool | None = None) -> tuple[Snapshot, np.ndarray]:
    """This snapshot with ``rows`` (validated float32) added as new items; returns it and
    their ids. Ids given must be new (not live here); ``None`` assigns ``next_id, ...``.
    Everything is checked before anything is computed; nothing here is changed."""
    n = rows.shape[0]
    if ids is None:
        ids = assigned_ids(snap.next_id, n)
    else:
        ids = check_ids(ids, n)
        present = snap.id_map.rows(ids, snap.n_rows)
        taken = (present >= 0) & snap.alive[np.maximum(present, 0)]
        if taken.any():
            raise AlreadyExists(f"ids already in the index: {first_few(ids[taken])} (use upsert to replace items)")
    meta = snap.metadata
    if metadata is not None or meta is not None:
        meta = (meta if meta is not None else Metadata.empty(snap.n_rows)).appended(metadata, n)
    corr = snap.serving
    corr.check_sizes(snap.n_alive + n, snap.bank.n_query_bank if corr.needs_query_bank else None, snap.bank.n_gallery_bank)
    query_bank, gallery_bank = snap._banks_for_update(required=True)
    snap.verify_mapped(["query_bank.npy", "gallery_bank.npy"])  # the new rows' statistics come from them
    means = (snap.bank.query_bank_mean, snap.bank.gallery_bank_mean)  # the banks did not change
    part = compute_statistics(rows, query_bank, gallery_bank, snap.request, progress=progress, bank_means=means)
    part = replace(
        part,
        n_query_bank=snap.bank.n_query_bank,
        n_gallery_bank=snap.bank.n_gallery_bank,
        query_bank_mean=snap.bank.query_bank_mean,
        gallery_bank_mean=snap.bank.gallery_bank_mean,
    )
    part_rows, _ = split_statistics(part)
    bias = corr.row_bias(rows, _with_rows(snap._statistics_for(n), part_rows, n))
    bank = snap.bank
    for side in SIDES:
        lists = getattr(bank, f"{side}_activation")
        if lists is None:
            continue
        local = getattr(part, f"{side}_activation")
        merged_scores, merged = merge_topk_ids(
            (getattr(bank, f"{side}_activation_scores"), lists),
            (getattr(part, f"{side}_activation_scores"), np.where(local == NO_ID, NO_ID, local + snap.n_rows)),
        )
        bank = replace(bank, **{f"{side}_activation": merged, f"{side}_activation_scores": merged_scores})
    snap = appended(snap, rows, bias, ids, part_rows, meta)
    return replace(snap, bank=bank, gallery_sum=snap.gallery_sum + rows.sum(axis=0, dtype=np.float64)), ids


def removed(snap: Snapshot, ids, *, progress: bool | None = None) -> Snapshot:
    """This snapshot without the items ``ids`` (all must be live: else NotFound, nothing
    changed). Their rows are marked dead; activation lists that held one are recomputed
    over the live rows."""
    ids = np.unique(np.asarray(ids).ravel()) if np.size(ids) else np.zeros(0, np.int64)
    rows = snap.rows_of(ids)
    return _without_rows(snap, rows, progress=progress)


def _without_rows(snap: Snapshot, rows: np.ndarray, *, progress: bool | None = None, check: bool = True) -> Snapshot:
    """Rows marked dead. ``check=False`` (an upsert, which adds items back at once) lets the
    index hold fewer items than the correction needs for a moment."""
    if rows.size == 0:
        return snap
    left = snap.n_alive - rows.size
    if check and left < 1:
        raise InvalidInput("cannot remove every item of an index")
    corr = snap.serving
    if check:
        corr.check_sizes(left, snap.bank.n_query_bank if corr.needs_query_bank else None, snap.bank.n_gallery_bank)
    alive = snap.alive.copy()
    alive[rows] = False
    bank = snap.bank
    for side in SIDES:
        lists = getattr(bank, f"{side}_activation")
        if lists is None:
            continue
        lost = np.isin(lists, rows).any(axis=1)
        if not lost.any():
            continue
        bank_rows = snap.banks.get(f"{side}_bank")
        if bank_rows is None:
            raise InvalidInput(f"removing these items changes the {side}-bank activation sets, which needs the {side} bank")
        snap.verify_mapped(["gallery.npy", f"{side}_bank.npy"])  # the lists are recomputed from them
        lists = lists.copy()
        scores = getattr(bank, f"{side}_activation_scores").copy()
        scores[lost], lists[lost] = snap._nearest(np.ascontiguousarray(bank_rows[lost]), lists.shape[1], alive, progress=progress)
        bank = replace(bank, **{f"{side}_activation": lists, f"{side}_activation_scores": scores})
    gone = snap.gather(rows).sum(axis=0, dtype=np.float64)
    return replace(
        snap,
        alive=alive,
        alive_buf=None,
        n_dead_rows=snap.n_dead_rows + np.unique(rows).size,
        bank=bank,
        gallery_sum=snap.gallery_sum - gone,
        extra={},
    )


def upserted(snap: Snapshot, rows: np.ndarray, ids, metadata=None, *, progress: bool | None = None) -> Snapshot:
    """Items ``ids`` set to ``rows`` (and ``metadata``): the present ones are removed, then
    every one is added (at the end, as a fresh build over the new items would have them)."""
    ids = check_ids(ids, rows.shape[0])
    present = snap.id_map.rows(ids, snap.n_rows)
    present = present[(present >= 0) & snap.alive[np.maximum(present, 0)]]
    snap = _without_rows(snap, present, check=False) if present.size else snap
    return added(snap, rows, ids, metadata, progress=progress)[0]


def removed_where(snap: Snapshot, where, *, progress: bool | None = None) -> tuple[Snapshot, np.ndarray]:
    """This snapshot without the live items matching ``where``, and their ids (sorted): a
    removal as :meth:`removed` (rows marked dead: O(matches) written), none when nothing
    matches."""
    rows = snap.matching_rows(where)
    return _without_rows(snap, rows, progress=progress), np.sort(snap.ids[rows])


def with_metadata(snap: Snapshot, rows: np.ndarray, values=None, unset=None) -> Snapshot:
    """Live physical ``rows`` (distinct) with their metadata changed and nothing else: keys of
    ``values`` set (a dict: the same values for every row; a list of dicts: one per row,
    changing only the keys it names), keys of ``unset`` set to null, the other keys kept.
    Values are typed as an add's (:meth:`Metadata.appended`: a value of another type than its
    key's is refused, changing nothing; a new key adds a column).

    The embeddings, biases and bank statistics are kept (an item's bias depends only on its
    row and the banks): each item is written again at the end of the index, as an upsert
    with the same row would write it (its old row marked dead, the activation lists that
    named it renamed to its new row), so a write costs O(rows changed) and a saved index
    holds it as one segment; only the order of ties moves (the item was written last)."""
    from hubless.index.metadata import as_columns, pyarrow

    rows = np.asarray(rows, dtype=np.int64)
    n = rows.size
    unset = [] if unset is None else list(unset)
    if values is None and not unset:
        raise InvalidInput("a metadata update needs values to set and/or keys to unset")
    if isinstance(unset, str) or any(not isinstance(k, str) for k in unset):
        raise InvalidInput(f"unset takes a list of metadata keys; got {unset!r}")
    meta = snap.metadata if snap.metadata is not None else Metadata.empty(snap.n_rows)
    known = meta.schema.names
    missing = [k for k in unset if k not in known]
    if missing:
        raise InvalidInput(f"unset: no metadata key {missing[0]!r} in this index (keys: {', '.join(known) or 'none'})")
    if n == 0:
        return snap
    current = meta.table.take(pyarrow().array(rows)).to_pydict() if known else {}
    if values is None:
        updates: dict[str, list] = {}
    elif isinstance(values, dict):
        updates = {key: column * n for key, column in as_columns([values], 1).items()}
    elif isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidType(f"values must be a dict of keys to set, or with ids a list of dicts (one per id); got a {type(values).__name__}")
    else:
        records = list(values)
        given = as_columns(records, n)  # one record per row (checks the count and the keys)
        updates = {}
        for key, column in given.items():
            old = current.get(key, [None] * n)
            updates[key] = [v if key in (r or {}) else old[i] for i, (v, r) in enumerate(zip(column, records))]
    both = sorted(set(updates) & set(unset))
    if both:
        raise InvalidInput(f"metadata key {both[0]!r} is both set and unset")
    columns = {**current, **updates, **{key: [None] * n for key in unset}}
    new_meta = meta.appended(columns, n)  # typed as an add; raises before anything changes
    embeddings = snap.gather(rows)
    stats = {}
    for name in snap.stats_base:
        base, tail = snap.row_statistics(name)
        out = np.empty((n, *base.shape[1:]), dtype=base.dtype)
        in_base = rows < snap.n_base
        out[in_base] = base[rows[in_base]]
        out[~in_base] = tail[rows[~in_base] - snap.n_base]
        stats[name] = out
    first = snap.n_rows
    snap = killed(snap, rows, {"name": "a metadata update"})
    snap = appended(snap, embeddings, snap.bias[rows], snap.ids[rows], stats, new_meta)
    snap = replace(snap, gallery_sum=snap.gallery_sum + embeddings.sum(axis=0, dtype=np.float64))
    bank = snap.bank
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    for side in SIDES:
        lists = getattr(bank, f"{side}_activation")
        if lists is None:
            continue
        at = np.minimum(np.searchsorted(ordered, lists), n - 1)
        moved = (ordered[at] == lists) & (lists != NO_ID)
        if moved.any():
            bank = replace(bank, **{f"{side}_activation": np.where(moved, first + order[at], lists)})
    return replace(snap, bank=bank, extra={})


def compacted(snap: Snapshot) -> Snapshot:
    """The live items as a new base, in order (dead rows dropped, the FAISS structure refilled
    with its training kept; an HNSW graph rebuilt)."""
    from hubless.index.faiss_build import refill_faiss

    snap.verify_mapped()
    corr = snap.correction
    faiss_index, config = None, snap.config
    if snap.faiss is not None:
        faiss_index, layout = refill_faiss(snap.faiss, config.factory, corr.gallery_, augmented_rows(corr), snap.layout)
        config = _with_layout(config, layout)
    meta = None if snap.metadata is None else snap.metadata.select(snap.live_rows)
    return Snapshot.from_correction(
        corr,
        config,
        ids=snap.live_ids,
        faiss=faiss_index,
        faiss_dim=snap.faiss_dim,
        banks=snap.banks,
        metadata=meta,
        next_id=snap.next_id,
        mapped=snap.mapped,
    )


def with_bank_items(snap: Snapshot, items: np.ndarray, side: str, *, progress: bool | None = None) -> Snapshot:
    """The banks' ``side`` grown by ``items``: every item's statistics merge the new bank
    items in (n_items x n_new), so every bias changes: a new base."""
    snap.verify_mapped()
    corr = copy.copy(snap.correction)
    grow = incremental.add_query_bank if side == "query" else incremental.add_gallery_bank
    corr = grow(corr, items, progress=progress)
    banks = dict(snap.banks)
    if banks.get(f"{side}_bank") is not None:
        banks[f"{side}_bank"] = np.concatenate([banks[f"{side}_bank"], items])
    return rebased(snap, corr, banks)


def rebased(snap: Snapshot, corr: AdditiveCorrection, banks: dict) -> Snapshot:
    """A new base of ``snap``'s live items, in order, fitted as ``corr`` (their biases changed:
    a bank grown or replaced, :func:`hubless.index.bank_swap.with_query_bank`), holding
    ``banks``: the FAISS structure refilled with its training kept (an HNSW graph kept when no
    item changed)."""
    from hubless.index.faiss_build import refill_faiss

    faiss_index, config = None, snap.config
    if snap.faiss is not None:
        same = snap.n_dead == 0 and snap.n_tail == 0
        faiss_index, layout = refill_faiss(snap.faiss, config.factory, corr.gallery_, augmented_rows(corr), snap.layout, same_items=same)
        config = _with_layout(config, layout)
    meta = None if snap.metadata is None else snap.metadata.select(snap.live_rows)
    return Snapshot.from_correction(
        corr,
        config,
        ids=snap.live_ids,
        faiss=faiss_index,
        faiss_dim=snap.faiss_dim,
        banks=banks,
        metadata=meta,
        next_id=snap.next_id,
        mapped=snap.mapped,
    )


def with_config(snap: Snapshot, config: IndexConfig) -> Snapshot:
    return replace(snap, config=config, extra={})


def _with_layout(config: IndexConfig, layout) -> IndexConfig:
    """``config`` recording a FAISS layout (spill share and threshold, bias offset)."""
    return dataclasses.replace(config, spill=layout.spill, spill_below=layout.spill_below, bias_offset=layout.bias_offset)


def built(
    correction: AdditiveCorrection,
    factory: str | None = None,
    *,
    ids=None,
    metadata=None,
    metadata_schema=None,
    banks: dict | None = None,
    spill: float | None = None,
    faiss_built=None,
    rescore: bool | None = None,
    **config,
) -> Snapshot:
    """The first version of an index over the fitted ``correction``'s gallery (item ``i`` has
    ``ids[i]``, default ``i``): its FAISS structure built for ``factory`` (default: by the
    gallery's size; none for Flat; ``faiss_built``: ``(faiss index, layout)`` built elsewhere);
    ``rescore`` (default: on for every ANN index) and ``config`` (model, search defaults) go to
    its :class:`~hubless.index.config.IndexConfig`, with the layout and the build time."""
    check_additive(correction)
    if not correction.is_fitted:
        raise NotFitted(f"{type(correction).__name__} is not fitted: fit it first, or use Index.build")
    n = correction.n_gallery_
    factory = factory or default_factory(n)
    rescore = not is_flat(factory) if rescore is None else rescore
    settings = IndexConfig(factory, rescore=rescore, **config)
    ids = np.arange(n, dtype=np.int64) if ids is None else check_ids(ids, n)
    meta = None
    if metadata is not None or metadata_schema is not None:
        meta = Metadata.from_records(metadata, n, metadata_schema) if metadata is not None else Metadata.empty(n, metadata_schema)
    t0 = time.perf_counter()
    faiss_index, dim = None, 0
    if not is_flat(settings.factory):  # Flat needs no FAISS structure: it is searched exactly
        if faiss_built is not None:  # built elsewhere (see Index.from_faiss)
            faiss_index, layout = faiss_built
        else:
            faiss_index, layout = build_faiss(settings.factory, correction.gallery_, augmented_rows(correction), spill=spill)
        settings = _with_layout(settings, layout)
        dim = layout.dim
    settings.build_seconds = time.perf_counter() - t0
    return Snapshot.from_correction(correction, settings, ids=ids, faiss=faiss_index, faiss_dim=dim, banks=banks, metadata=meta)
