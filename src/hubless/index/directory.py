"""The directory an index is saved in, and the one owner of what it holds: :class:`Directory`.

An index directory (:mod:`hubless.index.disk`) holds a base and segments named by ``CURRENT``.
:class:`Directory` is what an :class:`~hubless.index.Index` loaded from one keeps of it: the
committed version (its snapshot, manifest and ``CURRENT`` stamp) and its base alone. It opens
(:meth:`Directory.load`), commits a new version under the write lock
(:meth:`Directory.commit`: one segment per write, the segments folded into one past
:data:`MAX_SEGMENTS`, a new base past the compaction thresholds), catches up with versions
other writers committed (:meth:`Directory.catch_up`), and lists and restores kept versions
(:func:`versions`, :func:`restore`). :func:`new_base` is the one way a directory gets a fresh
base, for :meth:`Index.save <hubless.index.Index.save>` and the distributed build alike.
The file lock itself is :func:`hubless.index.lock.write_lock` (:func:`index_lock` for a saved
index, :func:`new_base` for a directory being written).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hubless._validation import check_positive_int
from hubless.errors import AlreadyExists
from hubless.index import disk, pointer, reading, writer
from hubless.index import versions as kept_versions
from hubless.index.config import IndexConfig
from hubless.index.live import Snapshot
from hubless.index.lock import LOCK_FILE, write_lock

__all__ = [
    "COMPACT_FRACTION",
    "COMPACT_MIN_BYTES",
    "COMPACT_MIN_ROWS",
    "MAX_SEGMENTS",
    "Directory",
    "check_target",
    "load_version",
    "new_base",
    "next_number",
    "restore",
    "same_dir",
    "storage",
    "versions",
]

#: A write folds every segment into one when the index would otherwise hold more than this many.
MAX_SEGMENTS = 64
#: A write compacts the index (a new base of the live items) once the rows written since the
#: base, or the removed rows, exceed COMPACT_MIN_ROWS + COMPACT_FRACTION x the base's rows; or
#: once its segments' bytes exceed COMPACT_MIN_BYTES + COMPACT_FRACTION x the base's bytes (writes
#: whose segments are large for their rows: long metadata, recomputed activation lists), so
#: folding the segments at MAX_SEGMENTS never rewrites more than a share of what compaction would.
COMPACT_MIN_ROWS = 1000
COMPACT_FRACTION = 0.1
COMPACT_MIN_BYTES = 16 << 20


class Directory:
    """The directory an index was loaded from (see the module docstring): ``path``, whether its
    files are memory-mapped (``mmap``), the committed version (``committed``: its snapshot;
    ``manifest``; ``stamp``: ``CURRENT``'s stamp when it was read or written) and ``base`` (the
    base alone, before the segments were replayed: what folding segments replays over)."""

    def __init__(self, path: Path, loaded: reading.Loaded, base: Snapshot, *, mmap: bool = False) -> None:
        self.path = Path(path)
        self.mmap = mmap
        self.bind(loaded, base)

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False) -> Directory:
        """The current version of the index at ``path`` (verified as :func:`hubless.index.reading.load` does)."""
        loaded = reading.load(Path(path), mmap=mmap)
        base = getattr(loaded, "base", None)
        return cls(Path(path), loaded, base if base is not None else loaded.snapshot, mmap=mmap)

    def bind(self, loaded: reading.Loaded, base: Snapshot) -> None:
        """Record ``loaded`` as the committed version (``base``: its base alone)."""
        self.committed: Snapshot = loaded.snapshot
        self.manifest: dict = loaded.manifest
        self.stamp = loaded.stamp
        self.base = base

    def changed(self) -> bool:
        """Whether another writer committed since this version was read or written (one stat)."""
        return pointer.pointer_stamp(self.path) != self.stamp

    def lock(self, timeout: float | None = None):
        """The index's write lock (:func:`index_lock`)."""
        return index_lock(self.path, timeout=timeout)

    def commit(self, new: Snapshot, *, full: bool = False) -> Snapshot:
        """Write what ``new`` changed since the committed version (the file lock is held): one
        segment; all segments folded into one past :data:`MAX_SEGMENTS`; a new base when the
        base changed, past the compaction thresholds, or when ``full``. Returns the snapshot
        now committed (``new``, or ``new`` compacted into the new base)."""
        path, old, manifest = self.path, self.committed, self.manifest
        version = next_number(path, manifest)
        grown = max(new.n_tail, new.n_dead) > COMPACT_MIN_ROWS + COMPACT_FRACTION * new.n_base or _segments_grown(manifest)
        same_base = new.base_rows is old.base_rows and new.faiss is old.faiss
        unsynced: list[Path] = []  # the segment written here: fsynced together with CURRENT
        if full or grown or not same_base:
            snap = writer.compacted(new) if new.n_tail or new.n_dead else new
            base_entry = disk.write_base(path, snap, version)
            segments, base = [], snap
        else:
            snap, base_entry, base = new, manifest["base"], self.base
            changed = new.n_rows != old.n_rows or new.killed_since(old).size > 0 or _lists_changed(old, new)
            segments = list(manifest["segments"])
            if changed and len(segments) + 1 > MAX_SEGMENTS:
                segments = [disk.write_delta(path, base, new, version, sync=False)]
            elif changed:
                segments.append(disk.write_delta(path, old, new, version, sync=False))
            if changed:
                unsynced = [path / segments[-1]["name"]]
            elif new.config.to_dict() == IndexConfig.from_dict(manifest["config"]).to_dict() and new.next_id == manifest["next_id"]:
                return new  # nothing to write
        body = disk.manifest_for(snap, version, base_entry, segments)
        disk.commit(path, body, keep=pointer.names_in(manifest), unsynced=unsynced)
        self.bind(reading.Loaded(snap, body, pointer.pointer_stamp(path)), base)
        return snap

    def record(self, new: Snapshot) -> int:
        """Write ``new`` as a new base and record it as a kept version that is not current (the
        file lock is held; ``CURRENT`` is not touched: see :func:`hubless.index.disk.keep_version`).
        Returns its number (never reused: its base's folder is on disk)."""
        version = next_number(self.path, self.manifest)
        snap = writer.compacted(new) if new.n_tail or new.n_dead else new
        base_entry = disk.write_base(self.path, snap, version)
        disk.keep_version(self.path, disk.manifest_for(snap, version, base_entry, []))
        return version

    def catch_up(self) -> Snapshot | None:
        """Follow versions committed by other writers since ours: their segments are replayed
        when they extend our version (O(what they wrote)), else the index is loaded anew.
        Returns the snapshot now committed, or None when nothing was committed since."""
        path = self.path
        stamp = pointer.pointer_stamp(path)
        if stamp == self.stamp:
            return None
        manifest, _ = pointer.read_manifest(path)
        old = self.manifest
        if manifest["base"] == old["base"]:
            k = len(old["segments"])
            try:
                if manifest["segments"][:k] == old["segments"]:  # later writes appended segments: read those
                    snap = reading.replay(path, self.committed, manifest, manifest["segments"][k:])
                else:  # segments were folded into one: replay them over our base
                    snap = reading.replay(path, self.base, manifest, manifest["segments"])
            except reading.Gone:
                snap = None  # compacted again meanwhile: load anew
            if snap is not None:
                snap = writer.with_config(snap, IndexConfig.from_dict(manifest["config"]))
                self.bind(reading.Loaded(snap, manifest, stamp), self.base)
                return snap
        fresh = Directory.load(path, mmap=self.mmap)
        self.bind(reading.Loaded(fresh.committed, fresh.manifest, fresh.stamp), fresh.base)
        return self.committed


def index_lock(path: str | os.PathLike, *, timeout: float | None = None):
    """The write lock of the saved index at ``path`` (:func:`hubless.index.lock.write_lock`, inside
    the index directory), once ``path`` is checked to be one: a path that is not an index gets
    its error and no lock file."""
    return write_lock(pointer.check_index_dir(Path(path)), timeout=timeout)


@contextlib.contextmanager
def new_base(path: Path, *, overwrite: bool = False, check: bool = True, remove_partial: bool = False) -> Iterator[tuple[int, dict | None]]:
    """Make ``path`` hold a new base, whatever it held before: under the index's write lock,
    the target checked (:func:`check_target`, again once the lock is held), the directory made,
    and ``(version, previous manifest or None)`` yielded; the caller writes the base
    ``b{version}`` and commits (``disk.commit(..., keep=pointer.names_in(previous))``). If that
    raises, a directory made here is removed again; else the unfinished base folder is left to
    the next commit's cleanup (its number is never reused), or with ``remove_partial`` removed
    at once (a distributed build's base: the size of the gallery). The write lock is taken once
    the target is checked, inside the directory (made here if missing, and removed again by the
    lock when a failed first write leaves it empty)."""
    if check:
        check_target(path, overwrite)
    with write_lock(path, create=True):
        if check:
            check_target(path, overwrite)  # another writer may have created it meanwhile
        fresh = set(os.listdir(path)) <= {LOCK_FILE}
        try:
            previous, _ = pointer.read_manifest(path) if pointer.is_index(path) else (None, None)
        except ValueError:
            previous = None
        version = next_number(path, previous)
        try:
            yield version, previous
        except BaseException:
            if fresh:  # a failed first write leaves nothing behind
                _remove_all_but_the_lock(path)
            elif remove_partial:
                shutil.rmtree(path / f"b{version:06d}", ignore_errors=True)
            raise


def _remove_all_but_the_lock(path: Path) -> None:
    for name in os.listdir(path):
        entry = path / name
        if name == LOCK_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


def write_snapshot(path: Path, snap: Snapshot, *, overwrite: bool = False) -> reading.Loaded:
    """``path`` made to hold ``snap`` (compacted first) as a new base (:func:`new_base`): what
    :meth:`Index.save <hubless.index.Index.save>` writes to a directory it was not loaded from."""
    snap = writer.compacted(snap) if snap.n_tail or snap.n_dead else snap
    with new_base(path, overwrite=overwrite) as (version, previous):
        base = disk.write_base(path, snap, version)
        body = disk.manifest_for(snap, version, base, [])
        disk.commit(path, body, keep=pointer.names_in(previous))
    return reading.Loaded(snap, body, pointer.pointer_stamp(path))


def storage(snap: Snapshot, bound: Directory | None, *, mmap: bool = False) -> dict:
    """How an index is held (:meth:`Index.storage <hubless.index.Index.storage>`): ``snap``'s
    rows in its base and written since, removed rows not yet compacted, and for an index bound
    to a directory its version and segments."""
    manifest = None if bound is None else bound.manifest
    return {
        "path": None if bound is None else str(bound.path),
        "format_version": pointer.VERSION,
        "version": None if manifest is None else manifest["version"],
        "base_rows": snap.n_base,
        "rows_since_base": snap.n_tail,
        "removed_rows": snap.n_dead,
        "segments": 0 if manifest is None else len(manifest["segments"]),
        "memory_mapped": mmap,
    }


def load_version(path: str | os.PathLike, version: int, *, mmap: bool = False) -> Snapshot:
    """Kept version ``version`` of the index at ``path``, as it was committed (verified as a load is)."""
    return kept_versions.load_version(Path(path), check_positive_int(version, "version"), mmap=mmap).snapshot


def versions(path: str | os.PathLike) -> list[dict]:
    """The versions of the saved index at ``path`` that can be read (:func:`hubless.index.versions.list_versions`)."""
    return kept_versions.list_versions(Path(path))


def restore(path: str | os.PathLike, version: int, *, timeout: float | None = None) -> int:
    """Make kept version ``version`` of the index at ``path`` current again, as a new version
    (see :meth:`Index.restore <hubless.index.Index.restore>`); returns its number."""
    path = Path(path)
    version = check_positive_int(version, "version")
    with index_lock(path, timeout=timeout):
        current, _ = pointer.read_manifest(path)
        kept_versions.load_version(path, version, mmap=True)  # every file there and readable
        target = kept_versions.read_version(path, version)
        config = dict(target["config"])
        keep = int(current["config"].get("keep_versions") or 0)
        config.pop("keep_versions", None)
        if keep:
            config["keep_versions"] = keep
        number = next_number(path, current)
        body = {**target, "version": number, "config": config, "next_id": max(int(target["next_id"]), int(current["next_id"]))}
        disk.commit(path, body, keep=pointer.names_in(current))
    return number


def _segments_grown(manifest: dict | None) -> bool:
    """Whether a version's segments outgrew its base in bytes (see :data:`COMPACT_MIN_BYTES`)."""
    if manifest is None or not manifest["segments"]:
        return False
    written = sum(s["bytes"] for s in manifest["segments"])
    base = sum(f["bytes"] for f in manifest["base"]["files"].values())
    return written > COMPACT_MIN_BYTES + COMPACT_FRACTION * base


def _lists_changed(old: Snapshot, new: Snapshot) -> bool:
    for side in ("query", "gallery"):
        a, b = getattr(old.bank, f"{side}_activation"), getattr(new.bank, f"{side}_activation")
        if a is not None and (a is not b) and not np.array_equal(a, b):
            return True
    return False


_VERSIONED = re.compile(r"[bs](\d{6})(?:\.seg)?")


def next_number(path: Path, manifest: dict | None) -> int:
    """The next version number: above the current one and every base or segment on disk (a
    leftover of an interrupted write is never reused)."""
    numbers = [int(m.group(1)) for name in os.listdir(path) if (m := _VERSIONED.fullmatch(name))]
    return max([0 if manifest is None else manifest["version"], *numbers]) + 1


def same_dir(a: Path, b: Path) -> bool:
    """Whether two paths name the same directory."""
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def check_target(path: Path, overwrite: bool) -> None:
    """Refuse to write an index where it would replace what it must not: a file, a directory
    that is not a hubless index, or (without ``overwrite``) an index."""
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_dir():
        raise AlreadyExists(f"{path} exists and is not a directory; an index is saved as a directory")
    if pointer.is_index(path):
        if not overwrite:
            raise AlreadyExists(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
    elif any(p.name != LOCK_FILE for p in path.iterdir()):  # the lock alone: a first write killed before it wrote
        raise AlreadyExists(f"{path} is a directory that is not a hubless index; refusing to write into it, even with overwrite")
