"""A live index on disk: a base and one segment per write, committed by one atomic ``CURRENT``.

Layout (format version 5)::

    idx/
      CURRENT            the current version: a header line {"format", "format_version",
                         "manifest_sha256"} and the manifest (JSON): method, dimensions,
                         config, next_id, the metadata schema, the base (its files' sizes
                         and sha256) and the segments in order (with theirs)
      b000003/           a base, written by a build, a save, a compaction or a bank update:
        gallery.npy      (n, d) float32: a plain .npy, memory-mapped by ``load(mmap=True)``
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
                         checksum); the files they name are kept (:func:`record_version`)

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
(:func:`verify`, with the FAISS structure as a search reads it). A write through a mapped load
checksums the mapped files it computes from before writing (:class:`MappedFiles`): a damaged file
is never copied into a new base. Damage is a :class:`~hubless.errors.Corrupt` naming the file.

Item ids are any int64 from 0 to 2**63 - 2 (``next_id``, one past the largest, is an int64).

Other writers (hubless.distributed) add items with :mod:`hubless.index.segments`.
Indexes of earlier formats (3 and 4, written before live indexes, never released) are refused
with a :class:`~hubless.errors.Corrupt` saying to rebuild them (:func:`read_manifest`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap as _mmap_module
import os
import re
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from hubless._io import file_sha256, umask_mode
from hubless.corrections import make_correction
from hubless.engine import BankStatistics
from hubless.errors import Busy, Conflict, Corrupt, InvalidInput, MissingDependencyError, MissingFile, optional_import
from hubless.index import writer
from hubless.index.config import IndexConfig
from hubless.index.faiss_build import plan_layout, self_contained, stored_rows
from hubless.index.ids import MAX_ID
from hubless.index.live import SIDES, Snapshot, row_statistics_names
from hubless.index.metadata import Metadata, table_bytes, table_from_bytes

__all__ = [
    "FORMAT",
    "VERSION",
    "Loaded",
    "commit",
    "is_index",
    "load",
    "read_manifest",
    "state_arrays",
    "verify",
    "write_base",
    "write_delta",
]

FORMAT = "hubless-index"
VERSION = 5
POINTER = "CURRENT"
_BASE_NAME = re.compile(r"b\d{6}")
_SEGMENT_NAME = re.compile(r"s\d{6}\.seg")
_PENDING = re.compile(r"\.pending-[0-9a-f]{32}\.seg")
_STAT_FILE = re.compile(r"stat\.(query_topk|query_probes|(?:query|gallery)_lse@[0-9.e+-]+)\.npy")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIXED_BASE_FILES = (
    "gallery.npy",
    "ids.npy",
    "bias.npy",
    "state.npz",
    "index.faiss",
    "query_bank.npy",
    "gallery_bank.npy",
    "metadata.parquet",
)
_REQUIRED_BASE_FILES = ("gallery.npy", "ids.npy", "bias.npy", "state.npz")
#: Files ``load(mmap=True)`` maps instead of reading (size and header checked, sha256 by ``verify``).
_MAPPED = ("gallery.npy", "index.faiss", "query_bank.npy", "gallery_bank.npy")
_MAX_POINTER = 16 << 20
#: How ``load(mmap=True)`` maps a FAISS structure: FAISS's own whole-file map
#: (``IO_FLAG_MMAP_IFC``, FAISS >= 1.11: the lists, codes and graph are views of the file, the
#: index stays self-contained and is written back whole; FAISS advises the kernel of random
#: access). The older ``IO_FLAG_MMAP`` is not used: it turns IVF lists into
#: ``OnDiskInvertedLists`` that name a file, which ``write_index`` then saves as a reference to
#: an empty file name (a copy or compaction of such an index cannot be loaded). Without
#: ``IO_FLAG_MMAP_IFC`` the structure is read whole (and checksummed).
_MAP_FAISS = getattr(faiss, "IO_FLAG_MMAP_IFC", 0)
#: The names of an index of an earlier format (3/4) that a save over it (``overwrite=True``) removes.
_EARLIER_FILES = ("manifest.json", "index.faiss", "correction.npz", "banks.npz", "metadata.parquet")
_EARLIER_VERSION = re.compile(r"v\d{6}")


def is_index(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a hubless index (of this or an earlier format:
    a save with ``overwrite=True`` may replace either; only this format loads)."""
    path = Path(path)
    return path.is_dir() and ((path / POINTER).is_file() or (path / "manifest.json").is_file())


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
    return {
        "version": version,
        "method": snap.spec,
        "normalize": snap.normalize,
        "dim": snap.dim,
        "faiss_dim": int(snap.faiss_dim),
        "bias_columns": int(snap.bias.shape[1]),
        "config": snap.config.to_dict(),
        "next_id": int(snap.next_id),
        "n_items": snap.n_alive,
        "n_rows": snap.n_rows,
        "metadata_schema": None if snap.metadata is None else snap.metadata.schema_text(),
        "base": base,
        "segments": segments,
    }


def commit(path: Path, manifest: dict, keep: set[str] | frozenset[str] = frozenset(), *, unsynced: Sequence[Path] = ()) -> None:
    """Make ``manifest`` the current version: ``CURRENT`` replaced atomically (written to a
    temporary file, fsynced, renamed, the directory fsynced). ``unsynced``: files of this
    version written without their fsync (a write's segment), fsynced together with the new
    ``CURRENT`` before the rename (:func:`_fsync_together`). Then remove what neither it nor
    ``keep`` (the names the previous version used) names."""
    text = json.dumps(manifest, separators=(",", ":"), allow_nan=False).encode()
    header = {"format": FORMAT, "format_version": VERSION, "manifest_sha256": hashlib.sha256(text).hexdigest()}
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


def names_in(manifest: dict | None) -> set[str]:
    """The directory entries a manifest uses (its base and segments)."""
    if manifest is None:
        return set()
    return {manifest["base"]["name"], *(s["name"] for s in manifest["segments"])}


def _clean(path: Path, keep: set[str] | frozenset[str]) -> None:
    """Remove what earlier writes left and no kept version names: bases, segments, leftovers
    of interrupted writes, the files of an index of an earlier format saved over. Nothing else
    is touched."""
    for name in os.listdir(path):  # names only: a Path per entry cost more than the rest of a small write
        stale = (
            ((_BASE_NAME.fullmatch(name) or _SEGMENT_NAME.fullmatch(name)) and name not in keep)
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


# ---------------------------------------------------------------------------------- reading
@dataclass
class Loaded:
    """A snapshot read from disk and the manifest it came from."""

    snapshot: Snapshot
    manifest: dict
    stamp: tuple = ()
    base: Snapshot | None = None  # the base alone, before the segments


def pointer_stamp(path: Path) -> tuple:
    """What changes whenever ``CURRENT`` is replaced (inode, size, mtime): a cheap check for
    versions written by others."""
    try:
        st = os.stat(path / POINTER)
    except FileNotFoundError:
        return ()
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read_manifest(path: str | os.PathLike) -> tuple[dict, Any]:
    """(manifest, parsed CURRENT header) of the index at ``path``. An index of an earlier format
    (3: ``manifest.json`` without ``CURRENT``; 4: ``CURRENT`` naming a ``v000001`` directory) is
    a :class:`~hubless.errors.Corrupt` saying that it must be rebuilt (:func:`earlier_format`)."""
    path = _check_index_dir(Path(path))
    file = path / POINTER
    if not file.exists():
        raise earlier_format(path, 3)  # format 3 kept manifest.json beside its files
    what = f"{path}: {POINTER}"
    if not file.is_file() or file.stat().st_size > _MAX_POINTER:
        raise Corrupt(f"{what} is not a hubless pointer file")
    raw = file.read_bytes()
    if raw.count(b"\n") != 2:  # format 4 wrote one JSON object (indented) naming a version directory
        whole = _json(raw, what)
        if isinstance(whole, dict) and whole.get("format") == FORMAT and "format_version" not in whole and "version" in whole:
            raise earlier_format(path, 4)
    first, _, rest = raw.partition(b"\n")
    header = _json(first, what)
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise Corrupt(f"{what} is corrupt (not a hubless index pointer)")
    version = header.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and 0 < version < VERSION:
        raise earlier_format(path, version)
    if version != VERSION:
        raise Corrupt(f"{what} has index format version {version!r}; this hubless reads version {VERSION}")
    text = rest.removesuffix(b"\n")
    if hashlib.sha256(text).hexdigest() != header.get("manifest_sha256"):
        raise Corrupt(f"{what} is corrupt or was altered (its manifest does not match its checksum)")
    manifest = _json(text, what)
    if not isinstance(manifest, dict):
        raise Corrupt(f"{what} is corrupt (the manifest is not a JSON object)")
    return _validate_manifest(manifest, what), header


def earlier_format(path: Path, version: int) -> Corrupt:
    """The error for an index written in an earlier format: this hubless reads only
    :data:`VERSION` (formats 3 and 4 came before live indexes and were never released)."""
    return Corrupt(
        f"{path} is a hubless index of format {version}, written by an earlier format of hubless; this hubless reads "
        f"format {VERSION} only: rebuild the index (`hubless index build --gallery ... --out {path} --overwrite`, or "
        "`Index.build(...).save(path, overwrite=True)`)"
    )


def _json(raw: bytes, what: str):
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise Corrupt(f"{what} is corrupt: {' '.join(str(exc).split())[:200]}") from None


def _no_constant(name: str):
    raise Corrupt(f"{name} is not valid JSON")


def _check_index_dir(path: Path) -> Path:
    if not path.exists():
        raise MissingFile(f"no such index directory: {path}")
    if not path.is_dir():
        raise InvalidInput(f"{path} is not a directory; an index is a directory written by `hubless index build`")
    if not is_index(path):
        raise MissingFile(f"{path} is not a hubless index (no {POINTER})")
    return path


def _validate_manifest(m: Any, what: str) -> dict:
    """Every field of a manifest, type- and range-checked; a clear error for the first bad one."""

    def field_(name, kind, check=lambda v: True, need="valid", source=m):
        value = source.get(name) if isinstance(source, dict) else None
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind) or not check(value):
            raise Corrupt(f"{what}: field {name!r} is missing or invalid (must be {need})")
        return value

    count = (lambda v: 0 <= v < 1 << 40), "a count"
    field_("version", int, lambda v: 0 < v < 10**6, "a version number")
    field_("method", str, lambda v: 0 < len(v) < 1000, "a correction spec")
    field_("normalize", bool, need="true or false")
    dim = field_("dim", int, lambda v: 0 < v < 1 << 20, "a positive dimension")
    field_("faiss_dim", int, lambda v: v == 0 or dim <= v < 1 << 20, "0 or a dimension >= dim")
    field_("bias_columns", int, lambda v: 0 < v < 16, "a number of bias columns")
    field_("next_id", int, lambda v: 0 <= v <= MAX_ID + 1, "an id count: 0 to 2**63 - 1")  # ids are any int64 >= 0
    field_("n_items", int, *count)
    field_("n_rows", int, *count)
    try:
        corr = make_correction(m["method"])
        IndexConfig.from_dict(m.get("config"))
    except (ValueError, TypeError) as exc:
        raise Corrupt(f"{what}: {' '.join(str(exc).split())}") from None
    if not corr.additive:
        raise Corrupt(f"{what}: {m['method']} cannot be served from an index")
    schema = m.get("metadata_schema")
    if schema is not None:
        if not isinstance(schema, str):
            raise Corrupt(f"{what}: field 'metadata_schema' is invalid")
        try:
            Metadata.schema_from_text(schema)
        except MissingDependencyError:
            raise
        except Exception:  # noqa: BLE001 - any parse failure of a damaged schema
            raise Corrupt(f"{what}: field 'metadata_schema' cannot be read") from None
    base = m.get("base")
    if not isinstance(base, dict) or not isinstance(base.get("name"), str) or not _BASE_NAME.fullmatch(base["name"]):
        raise Corrupt(f"{what}: field 'base' is missing or invalid (must name a base like b000001)")
    field_("rows", int, *count, source=base)
    files = base.get("files")
    if not isinstance(files, dict):
        raise Corrupt(f"{what}: the base's 'files' is missing or invalid")
    for name, entry in files.items():
        if name not in _FIXED_BASE_FILES and not _STAT_FILE.fullmatch(name):  # never open a path the manifest makes up
            raise Corrupt(f"{what}: unexpected file name {name!r} in the base")
        _check_entry(entry, name, what)
    for name in _REQUIRED_BASE_FILES:
        if name not in files:
            raise Corrupt(f"{what}: the base's {name} is not listed")
    segments = m.get("segments")
    if not isinstance(segments, list):
        raise Corrupt(f"{what}: field 'segments' is missing or invalid")
    for entry in segments:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not _SEGMENT_NAME.fullmatch(entry["name"]):
            raise Corrupt(f"{what}: a segment entry is invalid (must name a segment like s000002.seg)")
        _check_entry(entry, entry["name"], what)
        field_("rows", int, *count, source=entry)
        if "first_id" in entry:
            last = MAX_ID + 1 - entry["rows"]  # the segment's ids run from first_id on
            field_("first_id", int, lambda v, last=last: 0 <= v <= last, "an id", source=entry)
    return m


def _check_entry(entry: Any, name: str, what: str) -> None:
    if (
        not isinstance(entry, dict)
        or not isinstance(entry.get("sha256"), str)
        or not _SHA256.fullmatch(entry["sha256"])
        or isinstance(entry.get("bytes"), bool)
        or not isinstance(entry.get("bytes"), int)
        or entry["bytes"] < 0
    ):
        raise Corrupt(f"{what}: the entry of {name} is invalid (needs sha256 and bytes)")


class MappedFiles:
    """The files of a base that a memory-mapped load uses without having checksummed them
    (gallery, statistics, banks, FAISS structure). A write that carries their contents into a
    new file checksums them first (:meth:`verify`; once: the files never change), so a damaged
    file is refused (a :class:`~hubless.errors.Corrupt` naming it) instead of being copied into a
    new base that verifies (issue 38). Shared by every snapshot derived from one load."""

    def __init__(self, parts: Sequence[_Part]) -> None:
        self._parts = {part.file.name: part for part in parts}
        self._lock = threading.Lock()

    def verify(self, names: Sequence[str] | None = None) -> None:
        """Checksum the files ``names`` (file names such as "gallery.npy"; None: all) not
        verified yet: a Corrupt naming a damaged one; a Conflict when one was removed meanwhile
        (another writer compacted the index: reload it)."""
        with self._lock:
            for name, part in list(self._parts.items()):
                if names is not None and name not in names:
                    continue
                try:
                    part.verify()
                except Gone:
                    raise Conflict(
                        f"{part.root}: {part.label}, which this index maps, was removed (another writer compacted the "
                        "index) before it was verified: load the index again"
                    ) from None
                del self._parts[name]


class Gone(Exception):
    """A file vanished while it was read (a writer compacted meanwhile): follow CURRENT again."""


class _Part:
    """Read one file of a version: sizes always checked, sha256 when read whole."""

    def __init__(self, root: Path, file: Path, entry: dict, label: str) -> None:
        self.root, self.file, self.entry, self.label = root, file, entry, label

    def check_size(self) -> None:
        try:
            size = self.file.stat().st_size
        except FileNotFoundError:
            raise Gone from None
        if size != self.entry["bytes"]:
            raise Corrupt(f"{self.root}: {self.label} is truncated or altered (size differs from the manifest)")

    def verify(self) -> None:
        """Check the file's size and sha256 (streamed: nothing kept in memory)."""
        self.check_size()
        try:
            digest = file_sha256(self.file)
        except FileNotFoundError:
            raise Gone from None
        if digest != self.entry["sha256"]:
            raise Corrupt(f"{self.root}: {self.label} is corrupt (checksum mismatch)")

    def read_bytes(self) -> bytes:
        self.check_size()
        try:
            raw = self.file.read_bytes()
        except FileNotFoundError:
            raise Gone from None
        if hashlib.sha256(raw).hexdigest() != self.entry["sha256"]:
            raise Corrupt(f"{self.root}: {self.label} is corrupt (checksum mismatch)")
        return raw

    def array(self, *, mmap: bool) -> np.ndarray:
        """A .npy part: memory-mapped (size checked) or read and verified (a read-only view
        of the bytes read: no second copy of a gallery)."""
        with self.parsing():
            if mmap:
                self.check_size()
                return np.load(self.file, mmap_mode="r", allow_pickle=False)
            return _npy_view(self.read_bytes())

    def parsing(self):
        return _parsing(self.root, self.label)


def _npy_view(raw: bytes) -> np.ndarray:
    """The array a .npy file's bytes hold, as a read-only view of ``raw`` (``np.load`` of a
    BytesIO copies the data in chunks: a second gallery in memory and a third of a plain load's
    time); object arrays are refused as ``np.load(allow_pickle=False)`` refuses them."""
    fh = io.BytesIO(raw)
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:  # a version np.save does not write for these arrays: numpy's own reader
        return np.load(io.BytesIO(raw), allow_pickle=False)
    if dtype.hasobject:
        return np.load(io.BytesIO(raw), allow_pickle=False)  # raises: no pickles
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - fh.tell() < count * dtype.itemsize:
        raise ValueError("the array's data is shorter than its header says")
    array = np.frombuffer(raw, dtype=dtype, count=count, offset=fh.tell())
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


class _parsing:
    """Turn a failure to parse one part into a Corrupt naming it (a part whose checksum matches
    can still be unreadable, e.g. written by a broken tool with a forged manifest)."""

    def __init__(self, root: Path, label: str) -> None:
        self.root, self.label = root, label

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (MissingDependencyError, Corrupt, Gone)):
            return False
        if isinstance(exc, FileNotFoundError):
            raise Gone from None
        if isinstance(exc, (zipfile.BadZipFile, RuntimeError, OSError, ValueError, KeyError, TypeError, EOFError, IndexError)):
            detail = " ".join(str(exc).split())[:200]
            raise Corrupt(f"{self.root}: {self.label} cannot be read ({type(exc).__name__}: {detail})") from None
        return False


def load(path: str | os.PathLike, *, mmap: bool = False) -> Loaded:
    """Read the index at ``path``, verifying as the module docstring says."""
    path = _check_index_dir(Path(path))
    for _ in range(5):  # a commit may switch versions while we read: follow CURRENT again
        stamp = pointer_stamp(path)
        manifest, _ = read_manifest(path)
        try:
            base = _read_base(path, manifest, mmap=mmap)
            snap = replay(path, base, manifest, manifest["segments"])
        except Gone:
            if pointer_stamp(path) == stamp:
                raise Corrupt(f"{path}: a file the current version names is missing") from None
            continue
        return Loaded(snap, manifest, stamp, base=base)
    raise Busy(f"{path} changed under five consecutive loads; retry when writes settle")


def _read_base(path: Path, m: dict, *, mmap: bool) -> Snapshot:
    base = m["base"]
    folder = path / base["name"]
    files = base["files"]
    corr = make_correction(m["method"])
    request = corr.statistics_request()

    def part(name: str) -> _Part:
        return _Part(path, folder / name, files[name], f"{base['name']}/{name}")

    n, dim, columns = base["rows"], m["dim"], m["bias_columns"]
    mapped: list[_Part] = []  # the parts mapped, not checksummed (MappedFiles)

    def read_array(name: str) -> np.ndarray:
        one = part(name)
        if mmap:
            mapped.append(one)
        return one.array(mmap=mmap)

    gallery = read_array("gallery.npy")
    ids = part("ids.npy").array(mmap=False)
    bias = part("bias.npy").array(mmap=False)
    expect = {"gallery.npy": ((n, dim), np.float32), "ids.npy": ((n,), np.int64), "bias.npy": ((n, columns), np.float32)}
    for name, array in (("gallery.npy", gallery), ("ids.npy", ids), ("bias.npy", bias)):
        shape, dtype = expect[name]
        if array.shape != shape or array.dtype != dtype:
            raise Corrupt(f"{path}: {base['name']}/{name} holds {array.dtype} {array.shape}; the manifest says {np.dtype(dtype)} {shape}")
    names = row_statistics_names(request)
    listed = sorted(name[5:-4] for name in files if _STAT_FILE.fullmatch(name))
    if listed != sorted(names):
        raise Corrupt(f"{path}: the base holds statistics {listed}; {m['method']} needs {sorted(names)}")
    stats = {}
    for name in names:
        stats[name] = read_array(f"stat.{name}.npy")
        if stats[name].shape[0] != n:
            raise Corrupt(f"{path}: {base['name']}/stat.{name}.npy has {stats[name].shape[0]} rows for {n} items")
    state = part("state.npz")
    with state.parsing(), np.load(io.BytesIO(state.read_bytes()), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    with state.parsing():
        bank, gallery_sum = _bank_from_state(arrays, n, dim, request)
    banks = {}
    for name in ("query_bank", "gallery_bank"):
        if f"{name}.npy" in files:
            banks[name] = read_array(f"{name}.npy")
            if banks[name].ndim != 2 or banks[name].shape[1] != dim or banks[name].dtype != np.float32:
                raise Corrupt(f"{path}: {base['name']}/{name}.npy is not a ({dim}-d) float32 bank")
    faiss_index = None
    if "index.faiss" in files:
        faiss_part = part("index.faiss")
        with faiss_part.parsing(), _lists_elsewhere(path, faiss_part.label):
            if mmap and _MAP_FAISS:
                faiss_part.check_size()
                faiss_index = faiss.read_index(str(faiss_part.file), _MAP_FAISS | faiss.IO_FLAG_READ_ONLY)
                mapped.append(faiss_part)
            else:
                raw = faiss_part.read_bytes()
                faiss_index = faiss.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
        config = IndexConfig.from_dict(m["config"])
        rows = stored_rows(bias, config.spill_below)  # IVF items spilled to a second list count twice
        if faiss_index.d != m["faiss_dim"] or faiss_index.ntotal != rows:
            raise Corrupt(
                f"{path}: {base['name']}/index.faiss has d={faiss_index.d}, {faiss_index.ntotal} rows; the manifest says {m['faiss_dim']}, {rows}"
            )
        offsets = {dim, plan_layout(config.factory, dim, columns)[2]}
        if config.bias_offset is not None and (config.bias_offset not in offsets or config.bias_offset + columns > faiss_index.d):
            raise Corrupt(f"{path}: the manifest puts the bias at column {config.bias_offset} of {faiss_index.d}; {config.factory} cannot")
    if mmap and faiss_index is not None:
        _advise_random(gallery)  # an ANN index reads its candidates' rows, scattered (FAISS advises its own map)
    schema = None if m["metadata_schema"] is None else Metadata.schema_from_text(m["metadata_schema"])
    metadata = None
    if schema is not None:
        table = None
        if "metadata.parquet" in files:
            pa = optional_import("pyarrow", "reading item metadata", "index")
            pq = optional_import("pyarrow.parquet", "reading item metadata", "index", "pyarrow")

            meta_part = part("metadata.parquet")
            with meta_part.parsing():
                # ParquetFile, one thread: pq.read_table goes through Arrow's dataset layer (and
                # imports pandas), whose thread pools next to FAISS's OpenMP threads can abort the
                # interpreter at exit ("terminate called without an active exception")
                table = pq.ParquetFile(pa.BufferReader(meta_part.read_bytes())).read(use_threads=False)
            if table.num_rows != n:
                raise Corrupt(f"{path}: {base['name']}/metadata.parquet has {table.num_rows} rows for {n} items")
        metadata = Metadata(schema, [(n, table)] if n else [])
    config = IndexConfig.from_dict(m["config"])
    return Snapshot.from_arrays(
        spec=m["method"], normalize=m["normalize"], config=config, gallery=gallery, bias=bias, ids=ids, stats=stats, bank=bank,
        gallery_sum=gallery_sum, banks=banks, metadata=metadata, faiss=faiss_index, faiss_dim=m["faiss_dim"], next_id=m["next_id"],
        mapped=MappedFiles(mapped) if mapped else None,
    )  # fmt: skip


@contextlib.contextmanager
def _lists_elsewhere(path: Path, label: str):
    """A FAISS file whose inverted lists name another file (what an earlier hubless wrote when a
    memory-mapped IVF index was compacted or saved: issue 38) said as such, not as FAISS's error."""
    try:
        yield
    except RuntimeError as exc:
        if "OnDiskInvertedLists" not in str(exc):
            raise
        raise Corrupt(
            f"{path}: {label} keeps its inverted lists in another file (OnDiskInvertedLists), which cannot be opened: "
            "the IVF lists are not in the index (an index compacted or saved from a memory-mapped load by an earlier "
            "hubless); build the index again from its items"
        ) from None


def _advise_random(array: np.ndarray) -> None:
    """``madvise(MADV_RANDOM)`` on a memory-mapped array: each page fault reads that page only,
    not the kernel's read-ahead around it (most of which a scattered reader never uses; measured
    in ``benchmarks/index_writes.py``). Left to the default where the platform lacks it."""
    advice = getattr(_mmap_module, "MADV_RANDOM", None)
    mapping = getattr(array, "_mmap", None)
    if advice is None or mapping is None:
        return
    with contextlib.suppress(OSError, ValueError):
        mapping.madvise(advice)


def _bank_from_state(arrays: dict, n: int, dim: int, request) -> tuple[BankStatistics, np.ndarray]:
    sizes = arrays["sizes"]
    if sizes.shape != (2,):
        raise ValueError("sizes must hold two numbers")
    n_query_bank, n_gallery_bank = int(sizes[0]), int(sizes[1])
    bank = BankStatistics(
        n_gallery=n,
        n_query_bank=n_query_bank,
        n_gallery_bank=None if n_gallery_bank < 0 else n_gallery_bank,
        query_bank_mean=arrays["query_bank_mean"],
        gallery_mean=np.zeros(dim),
        gallery_bank_mean=arrays.get("gallery_bank_mean"),
    )
    for side in SIDES:
        k = getattr(request, f"{side}_activation_k")
        lists, scores = arrays.get(f"{side}_activation"), arrays.get(f"{side}_activation_scores")
        if not k:
            continue
        size = getattr(bank, f"n_{side}_bank")
        if lists is None or scores is None or lists.shape != (size, k) or scores.shape != (size, k) or lists.dtype != np.int64:
            raise ValueError(f"the {side}-bank activation sets are missing or not ({size}, {k})")
        setattr(bank, f"{side}_activation", lists)
        setattr(bank, f"{side}_activation_scores", scores)
    if arrays["query_bank_mean"].shape != (dim,) or arrays["gallery_sum"].shape != (dim,):
        raise ValueError(f"the bank means are not {dim}-d")
    return bank, arrays["gallery_sum"]


def replay(path: Path, snap: Snapshot, manifest: dict, segments: list[dict]) -> Snapshot:
    """``snap`` with ``segments`` (manifest entries, in order) read, verified and applied."""
    schema = None if manifest["metadata_schema"] is None else Metadata.schema_from_text(manifest["metadata_schema"])
    for entry in segments:
        seg = _Part(path, path / entry["name"], entry, entry["name"])
        raw = seg.read_bytes()
        with seg.parsing():
            part = _parse_segment(raw, entry, snap, schema)
        snap = writer.replayed(snap, part)
    if (snap.n_alive, snap.n_rows) != (manifest["n_items"], manifest["n_rows"]):
        raise Corrupt(
            f"{path}: the base and segments hold {snap.n_alive} items in {snap.n_rows} rows; the manifest says {manifest['n_items']} in {manifest['n_rows']}"
        )
    return replace(snap, next_id=max(snap.next_id, manifest["next_id"]))


def _parse_segment(raw: bytes, entry: dict, snap: Snapshot, schema) -> dict:
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    info = json.loads(arrays.pop("info").tobytes().decode()) if "info" in arrays else {}
    rows = arrays["rows"]
    n = rows.shape[0]
    if rows.ndim != 2 or rows.shape[1] != snap.dim or rows.dtype != np.float32 or n != entry["rows"]:
        raise ValueError(f"rows are {rows.dtype} {rows.shape}; the index needs {entry['rows']} x {snap.dim} float32")
    if "ids" in arrays:
        ids = arrays["ids"]
    elif "first_id" in entry:
        ids = np.arange(entry["first_id"], entry["first_id"] + n, dtype=np.int64)
    else:
        raise ValueError("the segment's rows have no ids")
    bias = arrays["bias"]
    if ids.shape != (n,) or ids.dtype != np.int64 or (ids.size and ids.min() < 0) or bias.shape != (n, snap.bias.shape[1]):
        raise ValueError("its ids or bias columns do not fit its rows")
    if bias.dtype != np.float32 or not np.isfinite(bias).all():
        raise ValueError("its bias columns are not finite float32")
    statistics = {}
    for name in snap.stats_base:
        values = arrays.get(f"stat.{name}")
        if values is None or values.shape != (n, *snap.stats_base[name].shape[1:]):
            raise ValueError(f"its statistics {name} are missing or of another shape")
        statistics[name] = values.astype(snap.stats_base[name].dtype, copy=False)
    dead = arrays.get("dead", np.zeros(0, np.int64))
    activation = {}
    for side in SIDES:
        for kind in ("merge", "replace"):
            key = f"act.{side}.{kind}"
            if f"{key}.rows" in arrays:
                activation[f"{side}.{kind}"] = (arrays[f"{key}.rows"], arrays[f"{key}.ids"], arrays[f"{key}.scores"])
    table = table_from_bytes(arrays["metadata"].tobytes()) if "metadata" in arrays else None
    if table is not None and table.num_rows != n:
        raise ValueError(f"its metadata has {table.num_rows} rows for {n}")
    meta = snap.metadata
    if schema is not None and (table is not None or meta is not None):
        meta = Metadata(
            schema, [*(meta.parts if meta is not None else ([(snap.n_rows, None)] if snap.n_rows else [])), (n, table)]
        ).folded()
    elif table is not None:
        raise ValueError("it holds metadata but the manifest has no metadata schema")
    start = info.get("start")
    return {
        "name": entry["name"], "start": None if start is None else int(start), "rows": rows, "ids": ids, "bias": bias,
        "statistics": statistics, "dead": np.asarray(dead, np.int64), "activation": activation, "metadata": meta,
        "next_id": int(info.get("next_id", 0)),
    }  # fmt: skip


# ---------------------------------------------------------------------------------- verify
def verify(path: str | os.PathLike) -> dict:
    """Check what a load and a search read: every file of the current version against its
    recorded size and sha256 (what a memory-mapped load skips), then the version loaded as a
    mapped load reads it, then the FAISS structure as a search reads it (its lists or graph in
    the file itself, every stored row's id a row of the base, a search of a few base rows
    answered with rows of the base; :func:`check_faiss`). Returns ``{"files", "bytes",
    "items", "faiss"}``. Damage is a :class:`~hubless.errors.Corrupt` naming the file and what
    is wrong with it."""
    path = _check_index_dir(Path(path))
    manifest, _ = read_manifest(path)
    base = manifest["base"]
    checked = total = 0
    entries = [(f"{base['name']}/{name}", path / base["name"] / name, entry) for name, entry in base["files"].items()]
    entries += [(s["name"], path / s["name"], s) for s in manifest["segments"]]
    for label, file, entry in entries:
        if not file.is_file():
            raise Corrupt(f"{path}: {label} is missing")
        if file.stat().st_size != entry["bytes"]:
            raise Corrupt(f"{path}: {label} is truncated or altered (size differs from the manifest)")
        if file_sha256(file) != entry["sha256"]:
            raise Corrupt(f"{path}: {label} is corrupt (checksum mismatch)")
        checked += 1
        total += entry["bytes"]
    loaded = load(path, mmap=True)
    base_snap = loaded.base if loaded.base is not None else loaded.snapshot
    faiss_text = None
    if base_snap.faiss is not None:
        faiss_text = check_faiss(base_snap, path, f"{base['name']}/index.faiss")
    return {"files": checked, "bytes": total, "items": loaded.snapshot.n_alive, "format": VERSION, "faiss": faiss_text}


def check_faiss(snap: Snapshot, root: Path, label: str, *, probes: int = 8) -> str:
    """Check a base's FAISS structure as a search reads it: its data in the file itself (not
    lists of another file: ``OnDiskInvertedLists``), as many stored entries as the base needs,
    every entry's id a row of the base, and ``probes`` base rows searched (every list probed)
    answered with finite scores and rows of the base. Returns a description ("IVF: 8 lists,
    700 entries"); a Corrupt naming ``label`` (the file, under the index ``root``) and saying what
    is wrong."""
    from hubless.index.faiss_build import _hnsw, _ivf, search_parameters, search_rows, self_contained

    what = f"{root}: {label}"
    index, n = snap.faiss, snap.n_base
    expect = stored_rows(snap.bias, snap.config.spill_below)
    if not self_contained(index):
        raise Corrupt(f"{what} keeps its inverted lists in another file (OnDiskInvertedLists): a load cannot read them")
    if index.ntotal != expect:
        raise Corrupt(f"{what} holds {index.ntotal} entries; the base's {n} items need {expect}")
    ivf, text = _ivf(index), type(faiss.downcast_index(index)).__name__
    if ivf is not None:
        lists = ivf.invlists
        sizes = np.array([lists.list_size(i) for i in range(ivf.nlist)], dtype=np.int64)
        if sizes.sum() != expect:
            raise Corrupt(f"{what}: its {ivf.nlist} inverted lists hold {int(sizes.sum())} entries; the base needs {expect}")
        for i in np.flatnonzero(sizes):
            ids = faiss.rev_swig_ptr(lists.get_ids(int(i)), int(sizes[i]))
            bad = (ids < 0) | (ids >= n)
            if bad.any():
                raise Corrupt(f"{what}: inverted list {int(i)} holds id {int(ids[bad][0])}, not a row of the base's {n} items")
        text = f"IVF: {ivf.nlist} lists, {expect} entries"
    elif _hnsw(index) is not None:
        hnsw = _hnsw(index)
        if faiss.downcast_index(hnsw.storage).ntotal != index.ntotal:
            raise Corrupt(f"{what}: its HNSW graph and its stored vectors differ in size")
        text = f"HNSW: {index.ntotal} nodes"
    rows = np.linspace(0, n - 1, num=min(probes, n)).astype(np.int64)
    knob = ivf.nlist if ivf is not None else 64
    params = search_parameters(index, nprobe=knob, ef_search=knob)
    zeros = np.zeros((rows.size, snap.bias.shape[1]), np.float32)
    with _parsing(root, label):
        scores, found = search_rows(index, np.ascontiguousarray(snap.gather(rows)), zeros, 1, params, snap.layout)
    hit = found[:, 0]
    if ((hit < 0) | (hit >= n)).any() or not np.isfinite(scores[:, 0]).all():
        raise Corrupt(f"{what}: a search of {rows.size} of the base's rows did not answer rows of the base")
    return text


# ---------------------------------------------------------------------------------- versions
#: The folder of a saved index that holds the manifests of the versions it keeps.
VERSIONS = "versions"
_VERSION_FILE = re.compile(r"v(\d{6})\.json")


def _keep_versions(manifest: dict) -> int:
    return int((manifest.get("config") or {}).get("keep_versions") or 0)


def record_version(path: Path, manifest: dict, header: dict, text: bytes) -> set[str]:
    """Keep the version just committed (``config.keep_versions`` = N > 0): its manifest, as
    ``CURRENT`` holds it, is written to ``versions/vNNNNNN.json`` (a temporary file renamed: a
    crash loses at most this record, never an index file), the records beyond the newest N are
    removed, and the names (bases, segments) the kept versions use are returned, so the clean-up
    of this commit keeps their files. N = 0 removes every record."""
    folder = path / VERSIONS
    n = _keep_versions(manifest)
    if n <= 0:
        if folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
        return set()
    folder.mkdir(mode=umask_mode(0o777), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".v.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(json.dumps(header).encode() + b"\n" + text + b"\n")
        os.chmod(tmp, umask_mode())
        os.replace(tmp, folder / f"v{manifest['version']:06d}.json")
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    kept: set[str] = set()
    for number in sorted(version_numbers(path), reverse=True)[n:]:
        (folder / f"v{number:06d}.json").unlink(missing_ok=True)
    for number in version_numbers(path):
        try:
            kept |= names_in(_read_version_file(path, number))
        except (Corrupt, MissingFile):  # a damaged record keeps nothing (and is listed as damaged)
            continue
    for name in os.listdir(folder):
        if name.endswith(".tmp"):
            (folder / name).unlink(missing_ok=True)
    return kept


def version_numbers(path: Path) -> list[int]:
    """The numbers of the versions whose records ``versions/`` holds, in order."""
    folder = Path(path) / VERSIONS
    if not folder.is_dir():
        return []
    return sorted(int(m.group(1)) for name in os.listdir(folder) if (m := _VERSION_FILE.fullmatch(name)))


def read_version(path: str | os.PathLike, version: int) -> dict:
    """The manifest of version ``version`` of the index at ``path``: the current one (from
    ``CURRENT``) or one kept in ``versions/``; checked as :func:`read_manifest` checks ``CURRENT``.
    A version not kept is a :class:`~hubless.errors.MissingFile` naming the ones kept."""
    path = _check_index_dir(Path(path))
    current, _ = read_manifest(path)
    if current["version"] == version:
        return current
    if not (path / VERSIONS / f"v{int(version):06d}.json").is_file():
        kept = sorted({*version_numbers(path), current["version"]})
        raise MissingFile(f"{path} keeps no version {version} (versions kept: {', '.join(map(str, kept)) or 'none'})")
    return _read_version_file(path, int(version))


def _read_version_file(path: Path, version: int) -> dict:
    file = path / VERSIONS / f"v{version:06d}.json"
    what = f"{path}: {VERSIONS}/{file.name}"
    try:
        raw = file.read_bytes()
    except FileNotFoundError:
        raise MissingFile(f"{what} is missing") from None
    first, _, rest = raw.partition(b"\n")
    header = _json(first, what)
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("format_version") != VERSION:
        raise Corrupt(f"{what} is corrupt (not a hubless version record)")
    body = rest.removesuffix(b"\n")
    if hashlib.sha256(body).hexdigest() != header.get("manifest_sha256"):
        raise Corrupt(f"{what} is corrupt or was altered (its manifest does not match its checksum)")
    manifest = _json(body, what)
    if not isinstance(manifest, dict) or manifest.get("version") != version:
        raise Corrupt(f"{what} is corrupt (not the manifest of version {version})")
    return _validate_manifest(manifest, what)


def load_version(path: str | os.PathLike, version: int, *, mmap: bool = False) -> Loaded:
    """Version ``version`` of the index at ``path`` (see :func:`read_version`), read and checked
    as :func:`load` reads the current one."""
    path = _check_index_dir(Path(path))
    manifest = read_version(path, version)
    try:
        base = _read_base(path, manifest, mmap=mmap)
        snap = replay(path, base, manifest, manifest["segments"])
    except Gone:
        raise MissingFile(f"{path}: version {version} is no longer kept (its files were removed)") from None
    return Loaded(snap, manifest, (), base=base)


def list_versions(path: str | os.PathLike) -> list[dict]:
    """The versions of the index at ``path`` that can be read, oldest first: each one's number,
    items, rows, segments, base, when it was committed (UTC, ISO 8601) and whether it is the
    current one. A damaged record is listed with ``"damaged": true``."""
    import datetime

    path = _check_index_dir(Path(path))
    current, _ = read_manifest(path)
    out = []
    for number in sorted({*version_numbers(path), current["version"]}):
        file = path / POINTER if number == current["version"] else path / VERSIONS / f"v{number:06d}.json"
        when = None
        with contextlib.suppress(OSError):
            when = datetime.datetime.fromtimestamp(file.stat().st_mtime, datetime.timezone.utc).isoformat(timespec="seconds")
        try:
            m = current if number == current["version"] else _read_version_file(path, number)
        except (Corrupt, MissingFile):
            out.append({"version": number, "damaged": True, "committed": when, "current": False})
            continue
        out.append({
            "version": number, "items": m["n_items"], "rows": m["n_rows"], "segments": len(m["segments"]),
            "base": m["base"]["name"], "committed": when, "current": number == current["version"],
        })  # fmt: skip
    return out
