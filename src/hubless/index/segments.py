"""Items written by other processes (distributed workers) as index segments, committed together.

    import hubless.index.segments as segments
    files = [segments.write_segment("idx/", rows, ids=keys, metadata=records) for rows, keys, records in parts]  # anywhere, in parallel
    segments.commit_segments("idx/", files)        # one new version naming them all, or none

:func:`write_segment` writes one segment file in the index's format (the rows, their ids, their
bias columns, per-item bank statistics and metadata; see :mod:`hubless.index.disk`) beside the
index, under a pending name that no version names (so it changes nothing, and no cleanup of
another writer removes it); many processes may write at once. :func:`commit_segments` takes the
index's write lock, checks each pending segment as a load would (ids new and not repeated,
metadata of the index's types, shapes), renames them to the next segment names in the order
given and commits one version naming them (the atomic ``CURRENT`` switch). Items whose ids were
left to the commit get consecutive ids from the index's ``next_id``.

The rows' bank statistics come from the worker (``statistics=``: what
:func:`hubless.engine.compute_statistics` gives for the rows against the index's banks, or a
slice of a tiled fit) or are computed from the banks the index keeps; for DIS/DualDIS they hold
each bank item's nearest of these rows, which a load merges into the activation sets exactly.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np

from hubless.engine import BankStatistics
from hubless.errors import InvalidInput
from hubless.index import writer
from hubless.index.directory import Directory, index_lock
from hubless.index.disk import _write_segment_file, commit, manifest_for
from hubless.index.ids import assigned_ids
from hubless.index.live import SIDES, row_statistics_names
from hubless.index.metadata import Metadata, table_bytes, table_from_bytes
from hubless.index.pointer import BASE_NAME, PENDING, SEGMENT_NAME, check_index_dir, names_in, pointer_stamp
from hubless.index.reading import Loaded, load, parse_segment, parsing

__all__ = ["commit_segments", "write_segment"]


def write_segment(
    path: str | os.PathLike, rows, *, ids=None, metadata=None, statistics: BankStatistics | None = None, progress=None
) -> Path:
    """Write new items for the index at ``path`` as a pending segment file (nothing changes
    until :func:`commit_segments` names it): their rows, their ids (None: assigned at commit,
    counting from the index's ``next_id``), their metadata, and their bank statistics.

    ``statistics``: the rows' own statistics against the index's banks (per-row arrays, the
    banks' global values, and for DIS/DualDIS each bank item's nearest of these rows, with row
    ids counted from 0), as computed by a distributed worker, e.g. ``compute_statistics(rows,
    query_bank, gallery_bank, request)`` or a slice of a tiled fit
    (:func:`hubless.engine.updates.gallery_rows` plus the bank's nearest rows). None computes
    them here from the banks the index keeps. Biases are derived from them. Safe to call from
    many processes at once; the file is written beside the index as ``.pending-<uuid>.seg``.
    Returns its path."""
    from hubless._validation import as_embeddings
    from hubless.engine import compute_statistics
    from hubless.index.ids import check_ids
    from hubless.index.live import _with_rows, split_statistics

    path = check_index_dir(Path(path))
    loaded = load(path, mmap=True)
    snap = loaded.snapshot
    rows = as_embeddings(rows, "rows", normalize=snap.normalize, dim=snap.dim)
    n = rows.shape[0]
    if ids is not None:
        ids = check_ids(ids, n)
    if statistics is None:
        query_bank, gallery_bank = snap._banks_for_update(required=True)
        means = (snap.bank.query_bank_mean, snap.bank.gallery_bank_mean)
        statistics = compute_statistics(rows, query_bank, gallery_bank, snap.request, progress=progress, bank_means=means)
    if statistics.n_gallery != n or statistics.missing(snap.request):
        raise InvalidInput(f"statistics must describe the {n} rows with {', '.join(row_statistics_names(snap.request)) or 'nothing'}")
    if (statistics.n_query_bank, statistics.n_gallery_bank) != (snap.bank.n_query_bank, snap.bank.n_gallery_bank):
        raise InvalidInput("statistics were computed against banks of other sizes than the index's")
    statistics = statistics.restricted(snap.request)
    stats_rows, _ = split_statistics(statistics)
    globals_ = replace(snap._statistics_for(n), query_bank_mean=snap.bank.query_bank_mean)
    bias = snap.serving.row_bias(rows, _with_rows(globals_, stats_rows, n))
    arrays: dict[str, np.ndarray] = {"rows": rows, "bias": bias}
    if ids is not None:
        arrays["ids"] = ids
    for name, values in stats_rows.items():
        arrays[f"stat.{name}"] = values
    for side in SIDES:
        lists = getattr(statistics, f"{side}_activation")
        if lists is not None:
            arrays[f"act.{side}.merge.rows"] = np.arange(lists.shape[0], dtype=np.int64)
            arrays[f"act.{side}.merge.ids"] = lists
            arrays[f"act.{side}.merge.scores"] = getattr(statistics, f"{side}_activation_scores")
    if metadata is not None:
        table = Metadata.from_records(metadata, n, None if snap.metadata is None else snap.metadata.schema).table
        arrays["metadata"] = np.frombuffer(table_bytes(table), dtype=np.uint8)
    arrays["info"] = np.frombuffer(json.dumps({"start": None}).encode(), dtype=np.uint8)
    file = path / f".pending-{uuid.uuid4().hex}.seg"
    _write_segment_file(file, arrays)
    return file


def commit_segments(path: str | os.PathLike, files, *, timeout: float | None = None) -> dict:
    """Make pending segments written by :func:`write_segment` part of the index at ``path``,
    in the order given, as one new version (under the index's write lock): each is renamed to
    the next segment name and checked as a load would (ids new and not repeated, metadata of the
    index's types, sizes); ids left to the commit are assigned here. All or nothing: on any
    error none is committed. Returns ``{"version", "ids"}`` (the ids, in order)."""
    path = Path(path)
    files = [Path(f) for f in files]
    for f in files:
        if f.parent.resolve() != path.resolve() or not PENDING.fullmatch(f.name) or not f.is_file():
            raise InvalidInput(f"{f} is not a pending segment of {path} (written by write_segment)")
    with index_lock(path, timeout=timeout):
        return commit_pending(Directory.load(path), files)


def commit_pending(bound: Directory, files: list[Path]) -> dict:
    """The body of :func:`commit_segments`, for an index directory read under its write lock."""
    path = bound.path
    old_manifest = bound.manifest
    snap = bound.committed
    version = max(
        old_manifest["version"],
        *(int(p.name[1:7]) for p in path.iterdir() if BASE_NAME.fullmatch(p.name) or SEGMENT_NAME.fullmatch(p.name)),
    )
    entries, all_ids = [], []
    for f in files:
        raw = f.read_bytes()
        entry = {"name": f.name, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}
        with parsing(path, f.name):
            with np.load(io.BytesIO(raw), allow_pickle=False) as data:
                n = int(data["rows"].shape[0])
                has_ids = "ids" in data.files
                table = table_from_bytes(data["metadata"].tobytes()) if "metadata" in data.files else None
        entry["rows"] = n
        if not has_ids:
            assigned_ids(snap.next_id, n)  # an InvalidInput past the largest id
            entry["first_id"] = int(snap.next_id)
        with parsing(path, f.name):
            meta_before = snap.metadata
            if table is not None or meta_before is not None:  # typed against the index's schema now
                meta_before = (meta_before if meta_before is not None else Metadata.empty(snap.n_rows)).appended(table, n)
            part = parse_segment(raw, entry, snap, None if meta_before is None else meta_before.schema)
        snap = writer.replayed(snap, part)
        all_ids.append(snap.ids[snap.n_rows - n :])
        version += 1
        entries.append({**entry, "name": f"s{version:06d}.seg"})
    for f, entry in zip(files, entries):
        os.replace(f, path / str(entry["name"]))
    body = manifest_for(snap, version, old_manifest["base"], [*old_manifest["segments"], *entries])
    commit(path, body, keep=names_in(old_manifest))
    bound.bind(Loaded(snap, body, pointer_stamp(path)), bound.base)
    return {"version": version, "ids": np.concatenate(all_ids) if all_ids else np.zeros(0, np.int64)}
