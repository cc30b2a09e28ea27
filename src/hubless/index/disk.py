"""A live index on disk: a base and one segment per write, committed by one atomic ``CURRENT``.

Layout (format version 5)::

    idx/
      CURRENT            the current version: a header line {"format", "format_version",
                         "manifest_sha256"} and the manifest (JSON): method, dimensions,
                         config, next_id, the metadata schema, the base (its files' sizes
                         and sha256) and the segments in order (with theirs)
      b000003/           a base, written by a build, a save, a compaction or a bank update:
        gallery.npy      (n, d) float32: a plain .npy, memory-mapped by ``reading.load(mmap=True)``
        ids.npy          (n,) int64 item ids
        bias.npy         (n, c) float32 bias columns (derived from the statistics when written)
        stat.NAME.npy    per-item bank statistics (top-k, log-sum-exps): what updates merge into
        state.npz        the banks' global values: sizes, means, activation sets, gallery sum
        index.faiss      the FAISS structure over [r, bias(r)] (none for Flat: searched exactly)
        query_bank.npy   the reference banks, so new items get their biases (optional)
        gallery_bank.npy
        metadata.parquet item metadata (optional)
      s000012.seg        one write (an uncompressed .npz): the new rows, their ids, bias,
                         statistics and metadata (Arrow IPC), the rows it removed, and the
                         activation lists it changed
      versions/          with ``config.keep_versions`` = N > 0: v000012.json, the manifest of
                         each of the N latest versions as ``CURRENT`` held it (same header and
                         checksum); the files they name are kept (:mod:`hubless.index.versions`)
      .hubless-lock      empty, while a writer holds the file lock (:mod:`hubless.index.lock`)

A write appends one segment file and replaces ``CURRENT`` (both written, then fsynced together,
then the rename, then the directory fsynced): the file it adds is the only one written, no
existing file is changed, and a crash
or ``kill -9`` at any moment leaves ``CURRENT`` naming a complete version. Loading reads the
base and replays the segments in order (:func:`hubless.index.writer.replayed`).
Compaction (:func:`write_base`) writes the live items as a new base; what no version in use
names any more (older bases and segments, leftovers of interrupted writes) is removed by the next
commit, keeping the previous version's files for readers that loaded it a moment ago.

Checksums: every file's sha256 and size are recorded when it is written. A load checks the
manifest's own sha256, every field, and the size of every file; it verifies the sha256 of every
file it reads whole: all of them by default, and with ``mmap=True`` all but the memory-mapped
ones (gallery, statistics, banks, the FAISS structure, mapped whole by FAISS's
``IO_FLAG_MMAP_IFC`` so that it stays self-contained), which ``hubless index verify`` checks
(:func:`hubless.index.integrity.verify`, with the FAISS structure as a search reads it). A write
through a mapped load checksums the mapped files it computes from before writing
(:class:`hubless.index.reading.MappedFiles`): a damaged file is never copied into a new base.
Damage is a :class:`~hubless.errors.Corrupt` naming the file.

Item ids are any int64 from 0 to 2**63 - 2 (``next_id``, one past the largest, is an int64).

This module writes the format. The others each have one job: :mod:`hubless.index.pointer` reads
and checks ``CURRENT`` and its manifest, :mod:`hubless.index.reading` loads a version,
:mod:`hubless.index.versions` keeps and reads earlier versions, :mod:`hubless.index.integrity`
verifies an index, and other writers (hubless.distributed) add items with
:mod:`hubless.index.segments`. Indexes of earlier formats (3 and 4, written before live indexes,
never released) are refused with a :class:`~hubless.errors.Corrupt` saying to rebuild them
(:func:`hubless.index.pointer.read_manifest`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from hubless._atomic import file_sha256, umask_mode
from hubless.engine import BankStatistics
from hubless.errors import InvalidInput, optional_import
from hubless.index.config import IndexConfig
from hubless.index.faiss_build import self_contained
from hubless.index.live import SIDES, Snapshot
from hubless.index.metadata import Metadata, table_bytes
from hubless.index.pointer import BASE_NAME, FORMAT, POINTER, SEGMENT_NAME, VERSION, names_in
from hubless.index.versions import record_version

__all__ = ["commit", "keep_version", "manifest_for", "segment_arrays", "state_arrays", "write_base", "write_delta"]

#: The names of an index of an earlier format (3/4) that a save over it (``overwrite=True``) removes.
_EARLIER_FILES = ("manifest.json", "index.faiss", "correction.npz", "banks.npz", "metadata.parquet")
_EARLIER_VERSION = re.compile(r"v\d{6}")


# ---------------------------------------------------------------------------------- writing
class _Hashing(io.RawIOBase):
    """A write-only file that hashes what passes through (one pass writes and checksums)."""

    def __init__(self, fh) -> None:
        self.fh, self.sha, self.size = fh, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.fh.write(view)
        self.size += view.nbytes
        return view.nbytes


def _write_file(file: Path, write) -> dict:
    """Write ``file`` with ``write(fileobj)``, fsync it; its {"sha256", "bytes"}."""
    with open(file, "wb") as fh:
        sink = _Hashing(fh)
        write(sink)
        fh.flush()
        os.fsync(fh.fileno())
    return {"sha256": sink.sha.hexdigest(), "bytes": sink.size}


def _fsync_together(fds: Sequence[int]) -> None:
    """fsync every file of ``fds`` at the same time (the first here, the others on threads): a
    journaling file system (ext4, xfs) commits them in one transaction, so a write waits for
    about one device flush instead of one per file (measured on ext4 here: two files in 1.5 ms
    together, 3.7 ms one after the other)."""
    errors: list[BaseException] = []

    def sync(fd: int) -> None:
        try:
            os.fsync(fd)
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=sync, args=(fd,), daemon=True) for fd in fds[1:]]
    for thread in threads:
        thread.start()
    sync(fds[0])
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _npy(array) -> Any:
    return lambda fh: np.save(fh, np.ascontiguousarray(array), allow_pickle=False)


def write_base(path: Path, snap: Snapshot, version: int) -> dict:
    """Write ``snap`` (compacted: no dead rows, no tail) as the base ``b{version}``; returns
    its manifest entry. Nothing names it until :func:`commit`."""
    if snap.n_tail or snap.n_dead:  # pragma: no cover - callers compact first
        raise InvalidInput("only a compacted snapshot is written as a base")
    if snap.mapped is not None:  # what a mapped load has not checksummed is verified before it is copied
        snap.mapped.verify()
    if snap.faiss is not None and not self_contained(snap.faiss):
        raise InvalidInput(
            "this FAISS index keeps its inverted lists in another file (OnDiskInvertedLists): it cannot be saved in an index"
        )
    name = f"b{version:06d}"
    folder = path / name
    shutil.rmtree(folder, ignore_errors=True)  # a leftover of an interrupted write of this version
    folder.mkdir(mode=umask_mode(0o777))
    files = {
        "gallery.npy": _write_file(folder / "gallery.npy", _npy(snap.base_rows)),
        "ids.npy": _write_file(folder / "ids.npy", _npy(snap.ids)),
        "bias.npy": _write_file(folder / "bias.npy", _npy(snap.bias)),
    }
    for stat, values in snap.stats_base.items():
        files[f"stat.{stat}.npy"] = _write_file(folder / f"stat.{stat}.npy", _npy(values))
    state: dict[str, Any] = _state_arrays(snap)
    files["state.npz"] = _write_file(folder / "state.npz", lambda fh: np.savez(fh, **state))
    if snap.faiss is not None:
        faiss.write_index(snap.faiss, str(folder / "index.faiss"))
        with open(folder / "index.faiss", "rb") as fh:
            os.fsync(fh.fileno())
        files["index.faiss"] = {"sha256": file_sha256(folder / "index.faiss"), "bytes": (folder / "index.faiss").stat().st_size}
    for bank in ("query_bank", "gallery_bank"):
        if snap.banks.get(bank) is not None:
            files[f"{bank}.npy"] = _write_file(folder / f"{bank}.npy", _npy(snap.banks[bank]))
    if snap.metadata is not None and snap.metadata.schema.names:
        pq = optional_import("pyarrow.parquet", "saving item metadata", "index", "pyarrow")

        table = snap.metadata.table
        files["metadata.parquet"] = _write_file(folder / "metadata.parquet", lambda fh: pq.write_table(table, fh))
    _fsync_dir(folder)
    return {"name": name, "rows": snap.n_rows, "files": files}


def _state_arrays(snap: Snapshot) -> dict[str, np.ndarray]:
    return state_arrays(snap.bank, snap.gallery_sum)


def state_arrays(bank: BankStatistics, gallery_sum: np.ndarray) -> dict[str, np.ndarray]:
    """The members of a base's ``state.npz``: the banks' sizes, means and activation sets
    (``bank``, its per-row arrays ignored) and the float64 sum of the base's rows."""
    out = {
        "sizes": np.array([bank.n_query_bank, -1 if bank.n_gallery_bank is None else bank.n_gallery_bank], dtype=np.int64),
        "query_bank_mean": np.asarray(bank.query_bank_mean, np.float64),
        "gallery_sum": np.asarray(gallery_sum, np.float64),
    }
    if bank.gallery_bank_mean is not None:
        out["gallery_bank_mean"] = np.asarray(bank.gallery_bank_mean, np.float64)
    for side in SIDES:
        if getattr(bank, f"{side}_activation") is not None:
            out[f"{side}_activation"] = getattr(bank, f"{side}_activation")
            out[f"{side}_activation_scores"] = getattr(bank, f"{side}_activation_scores")
    return out


def segment_arrays(old: Snapshot, new: Snapshot) -> dict[str, np.ndarray]:
    """What ``new`` changed since ``old`` (same base), as the members of a segment file: rows
    appended, rows marked dead, activation lists replaced."""
    start = old.n_rows
    out: dict[str, np.ndarray] = {
        "rows": new.tail_rows[old.n_tail :],
        "ids": new.ids[start:],
        "bias": new.bias[start:],
    }
    for name in new.stats_base:
        out[f"stat.{name}"] = new.row_statistics(name)[1][old.n_tail :]
    dead = new.killed_since(old)
    out["dead"] = np.concatenate([dead, start + np.flatnonzero(~new.alive[start:])]).astype(np.int64)
    for side in SIDES:
        lists = getattr(new.bank, f"{side}_activation")
        if lists is None:
            continue
        before = getattr(old.bank, f"{side}_activation")
        changed = np.flatnonzero((lists != before).any(axis=1))
        if changed.size:
            out[f"act.{side}.replace.rows"] = changed.astype(np.int64)
            out[f"act.{side}.replace.ids"] = lists[changed]
            out[f"act.{side}.replace.scores"] = getattr(new.bank, f"{side}_activation_scores")[changed]
    if new.metadata is not None and new.metadata.schema.names and new.n_rows > start:
        out["metadata"] = np.frombuffer(table_bytes(new.metadata.rows_from(start)), dtype=np.uint8)
    info = {"start": start, "next_id": int(new.next_id)}
    out["info"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
    return out


def _write_segment_file(file: Path, arrays: dict[str, Any], *, sync: bool = True) -> dict:
    """Write one segment file; ``sync=False`` leaves its fsync to :func:`commit` (``unsynced``)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    raw = buffer.getvalue()
    with open(file, "wb") as fh:
        fh.write(raw)
        fh.flush()
        if sync:
            os.fsync(fh.fileno())
    return {"name": file.name, "sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw)}


def write_delta(path: Path, old: Snapshot, new: Snapshot, version: int, *, sync: bool = True) -> dict:
    """Write what ``new`` changed since ``old`` as the segment ``s{version}.seg``; its entry.
    ``sync=False``: not fsynced yet; pass the file to :func:`commit`'s ``unsynced``."""
    arrays = segment_arrays(old, new)
    if new.mapped is not None:  # the mapped files this write's values were computed from, verified first
        used = {"query_bank.npy", "gallery_bank.npy"} if arrays["rows"].shape[0] else set()
        if any(key.startswith("act.") for key in arrays):  # activation lists recomputed over the gallery
            used |= {"gallery.npy", "query_bank.npy", "gallery_bank.npy"}
        new.mapped.verify(sorted(used))
    entry = _write_segment_file(path / f"s{version:06d}.seg", arrays, sync=sync)
    return {**entry, "rows": int(arrays["rows"].shape[0])}


def manifest_for(snap: Snapshot, version: int, base: dict, segments: list[dict]) -> dict:
    """The manifest of version ``version`` of ``snap`` (its base entry and segment entries)."""
    return manifest_fields(
        version=version,
        spec=snap.spec,
        normalize=snap.normalize,
        dim=snap.dim,
        faiss_dim=int(snap.faiss_dim),
        bias_columns=int(snap.bias.shape[1]),
        config=snap.config,
        next_id=int(snap.next_id),
        n_items=snap.n_alive,
        n_rows=snap.n_rows,
        metadata=snap.metadata,
        base=base,
        segments=segments,
    )


def manifest_fields(
    *,
    version: int,
    spec: str,
    normalize: bool,
    dim: int,
    faiss_dim: int,
    bias_columns: int,
    config: IndexConfig,
    next_id: int,
    n_items: int,
    n_rows: int,
    metadata: Metadata | None,
    base: dict,
    segments: list[dict],
) -> dict:
    """A manifest from its fields: the one place that writes one (:func:`manifest_for` from a
    snapshot; :class:`hubless.index.base_files.BaseFiles` for a base written piece by piece)."""
    return {
        "version": version,
        "method": spec,
        "normalize": bool(normalize),
        "dim": dim,
        "faiss_dim": int(faiss_dim),
        "bias_columns": int(bias_columns),
        "config": config.to_dict(),
        "next_id": int(next_id),
        "n_items": int(n_items),
        "n_rows": int(n_rows),
        "metadata_schema": None if metadata is None else metadata.schema_text(),
        "base": base,
        "segments": segments,
    }


def commit(path: Path, manifest: dict, keep: set[str] | frozenset[str] = frozenset(), *, unsynced: Sequence[Path] = ()) -> None:
    """Make ``manifest`` the current version: ``CURRENT`` replaced atomically (written to a
    temporary file, fsynced, renamed, the directory fsynced). ``unsynced``: files of this
    version written without their fsync (a write's segment), fsynced together with the new
    ``CURRENT`` before the rename (:func:`_fsync_together`). Then remove what neither it nor
    ``keep`` (the names the previous version used) names."""
    header, text = _manifest_text(manifest)
    fd, tmp = tempfile.mkstemp(prefix=f".{POINTER}.", suffix=".tmp", dir=path)
    others: list[int] = []
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(json.dumps(header).encode() + b"\n" + text + b"\n")
            fh.flush()
            others = [os.open(file, os.O_RDONLY) for file in unsynced]
            _fsync_together([fh.fileno(), *others])
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path / POINTER)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        for other in others:
            os.close(other)
    _fsync_dir(path)
    kept = record_version(path, manifest, header, text)
    _clean(path, keep | names_in(manifest) | kept)


def _manifest_text(manifest: dict) -> tuple[dict, bytes]:
    """(header, text) of a manifest as ``CURRENT`` and the version records hold it."""
    text = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode()
    return {"format": FORMAT, "format_version": VERSION, "manifest_sha256": hashlib.sha256(text).hexdigest()}, text


def keep_version(path: Path, manifest: dict) -> None:
    """Record ``manifest`` (its base written) as a kept version that is not the current one:
    ``CURRENT`` is not touched, so readers never see it, but it is listed, loaded and restored
    by number like the others (:mod:`hubless.index.versions`; e.g. a refit its guard rejected,
    :mod:`hubless.index.bank_swap`). Its files are kept as long as its record is."""
    header, text = _manifest_text(manifest)
    record_version(path, manifest, header, text)


def _clean(path: Path, keep: set[str] | frozenset[str]) -> None:
    """Remove what earlier writes left and no kept version names: bases, segments, leftovers
    of interrupted writes, the files of an index of an earlier format saved over. Nothing else
    is touched."""
    for name in os.listdir(path):  # names only: a Path per entry cost more than the rest of a small write
        stale = (
            ((BASE_NAME.fullmatch(name) or SEGMENT_NAME.fullmatch(name)) and name not in keep)
            or name.startswith(".tmp-")
            or (name.startswith(f".{POINTER}.") and name.endswith(".tmp"))
            or _EARLIER_VERSION.fullmatch(name)
            or name in _EARLIER_FILES
        )
        if stale:
            entry = path / name
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
