"""Saving and loading an :class:`~hubless.index.Index` as a directory: one atomic switch per save.

Layout (format version 4)::

    idx/
      CURRENT              {"format", "version": "v000007", "manifest_sha256"}: the one pointer
      v000007/             the current version (the previous one is kept until the next save)
        manifest.json      format, version, method spec, dims, the index config (FAISS factory,
                           model, search defaults; see IndexConfig) and the sha256 + size of
                           every other file
        index.faiss        the FAISS index over [r, bias(r)]
        correction.npz     the gallery and the bank statistics the correction keeps (top-k,
                           log-sum-exps, activation top-k, means), from which its biases and
                           gates are derived on load and kept current by add/remove
        banks.npz          the reference banks, so ``add`` can compute new biases (optional)
        metadata.parquet   per-item metadata (optional; needs pyarrow)

A save holds the index's write lock (:mod:`hubless.index.lock`), writes the new version into a
temporary directory inside ``idx/``, fsyncs it, renames it to the next ``vNNNNNN`` and then
atomically replaces ``CURRENT``. A crash at any point leaves ``CURRENT`` naming a complete
version (the old one until the switch, the new one after it); leftovers of an interrupted save
are removed by the next one. Readers take no lock: they follow ``CURRENT``, and the version it
named a moment ago is kept for one more save, so a load never sees a half-written index.

A load checks the manifest against the checksum in ``CURRENT``, validates every manifest field,
refuses file names other than the parts above, checks every part's size and checksum before
reading it, and reports damage as a ValueError naming the damaged file. Indexes of format 3
(the files directly in ``idx/``, no ``CURRENT``) are still read; the next save converts them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from hubless._io import file_sha256, umask_mode, write_json
from hubless.corrections import Correction, make_correction
from hubless.engine import BankStatistics
from hubless.errors import AlreadyExists, Busy, Corrupt, InvalidInput, MissingDependencyError, MissingFile, optional_import
from hubless.index.config import IndexConfig
from hubless.index.faiss_build import plan_layout, stored_rows
from hubless.index.lock import write_lock

__all__ = ["FORMAT", "VERSION", "SavedIndex", "current_dir", "is_index", "load_index", "save_index"]

FORMAT = "hubless-index"
VERSION = 4
LEGACY_VERSION = 3
POINTER = "CURRENT"
MANIFEST = "manifest.json"
#: The only files a version may hold besides its manifest (nothing else is ever opened).
PARTS = ("index.faiss", "correction.npz", "banks.npz", "metadata.parquet")
REQUIRED_PARTS = ("index.faiss", "correction.npz")
_VERSION_NAME = re.compile(r"v\d{6}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_SMALL_FILE = 1 << 20  # CURRENT and manifest.json are a few hundred bytes


@dataclass
class SavedIndex:
    """What :func:`load_index` reads: the parts an :class:`~hubless.index.Index` is made of."""

    correction: Correction
    config: IndexConfig
    faiss_index: object
    faiss_dim: int
    banks: dict[str, np.ndarray]
    metadata: list[dict] | None


def is_index(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a hubless index (of this or the previous format)."""
    path = Path(path)
    return path.is_dir() and ((path / POINTER).is_file() or (path / MANIFEST).is_file())


# ---------------------------------------------------------------------------------- saving
def save_index(
    path: str | os.PathLike,
    *,
    faiss_index,
    faiss_dim: int,
    correction: Correction,
    config: IndexConfig,
    banks: dict[str, np.ndarray | None],
    metadata: list[dict] | None,
    overwrite: bool = False,
    locked: bool = False,
) -> Path:
    """Write an index's parts as a new version of the directory ``path`` (see the module
    docstring). ``overwrite`` replaces an existing hubless index, never anything else; ``locked``
    says the caller already holds the write lock (as :meth:`Index.update` does)."""
    path = Path(path)
    _check_target(path, overwrite)
    if locked:
        return _save(path, faiss_index, faiss_dim, correction, config, banks, metadata)
    with write_lock(path):
        _check_target(path, overwrite)  # another writer may have created it meanwhile
        return _save(path, faiss_index, faiss_dim, correction, config, banks, metadata)


def _check_target(path: Path, overwrite: bool) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_dir():
        raise AlreadyExists(f"{path} exists and is not a directory; an index is saved as a directory")
    if is_index(path):
        if not overwrite:
            raise AlreadyExists(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
    elif any(path.iterdir()):
        raise AlreadyExists(f"{path} is a directory that is not a hubless index; refusing to write into it, even with overwrite")


def _save(path: Path, faiss_index, faiss_dim, corr: Correction, config: IndexConfig, banks, metadata) -> Path:
    created = not path.exists()
    path.mkdir(parents=True, exist_ok=True)
    previous = _pointed_version(path)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=path))
    try:
        faiss.write_index(faiss_index, str(tmp / "index.faiss"))
        arrays = {f"statistics.{k}": v for k, v in corr.statistics_.to_arrays().items()}
        np.savez(tmp / "correction.npz", gallery=corr.gallery_, **arrays)
        banks = {k: v for k, v in banks.items() if v is not None}
        if banks:
            np.savez(tmp / "banks.npz", **banks)
        if metadata is not None:
            _write_parquet(metadata, tmp / "metadata.parquet")
        files = {f.name: {"sha256": file_sha256(f), "bytes": f.stat().st_size} for f in sorted(tmp.iterdir())}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "method": corr.spec,
            "normalize": bool(corr.normalize),
            "dim": int(corr.dim_),
            "faiss_dim": int(faiss_dim),
            "n_items": int(corr.n_gallery_),
            "config": config.to_dict(),
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, allow_nan=False))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, umask_mode(0o777))
        version = _next_version(path)
        os.replace(tmp, path / version)  # complete, but not current until CURRENT names it
        _fsync_dir(path)
        pointer = {"format": FORMAT, "version": version, "manifest_sha256": file_sha256(path / version / MANIFEST)}
        write_json(path / POINTER, pointer)  # the switch: one atomic rename
        _fsync_dir(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:  # a failed first save leaves no empty directory behind
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    _clean(path, keep={version, previous})
    return path


def _next_version(path: Path) -> str:
    numbers = [int(p.name[1:]) for p in path.iterdir() if _VERSION_NAME.fullmatch(p.name)]
    return f"v{max(numbers, default=0) + 1:06d}"


def _pointed_version(path: Path) -> str | None:
    try:
        return _read_pointer(path)[0]
    except (OSError, ValueError):
        return None


def _clean(path: Path, keep: set) -> None:
    """Remove what earlier saves left: versions older than the kept ones, temporary directories
    of interrupted saves, and the files of a format-3 index. Nothing else is touched."""
    for entry in path.iterdir():
        stale = (
            (_VERSION_NAME.fullmatch(entry.name) and entry.name not in keep)
            or entry.name.startswith(".tmp-")
            or entry.name in (MANIFEST, *PARTS)
        )
        if stale:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------------------------- loading
def current_dir(path: str | os.PathLike) -> Path:
    """The directory holding the current version's files (``idx/vNNNNNN``, or ``idx`` itself
    for a format-3 index)."""
    path = _check_index_dir(Path(path))
    if (path / POINTER).exists():
        return path / _read_pointer(path)[0]
    return path


def load_index(path: str | os.PathLike, *, mmap: bool = False) -> SavedIndex:
    """Read the parts of an index saved by :func:`save_index`, verifying everything first."""
    path = _check_index_dir(Path(path))
    for _ in range(5):  # a save may switch versions while we read: follow CURRENT again
        if not (path / POINTER).exists():
            return _load_version(path, path, None, LEGACY_VERSION, mmap)
        version, manifest_sha = _read_pointer(path)
        try:
            return _load_version(path, path / version, manifest_sha, VERSION, mmap)
        except _VersionGone:
            if _pointed_version(path) == version:
                raise Corrupt(f"{path}: {version}, the version CURRENT names, is missing") from None
    raise Busy(f"{path} changed under five consecutive loads; retry when writes settle")


class _VersionGone(Exception):
    """The version directory vanished while it was being read (a save removed it)."""


def _check_index_dir(path: Path) -> Path:
    if not path.exists():
        raise MissingFile(f"no such index directory: {path}")
    if not path.is_dir():
        raise InvalidInput(f"{path} is not a directory; an index is a directory written by `hubless index build`")
    if not is_index(path):
        raise MissingFile(f"{path} is not a hubless index (no {POINTER} or {MANIFEST})")
    return path


def _read_small_json(file: Path, what: str):
    if not file.is_file():
        raise Corrupt(f"{what} is missing or not a regular file")
    if file.stat().st_size > _MAX_SMALL_FILE:
        raise Corrupt(f"{what} is too large to be a hubless {file.name}")
    raw = file.read_bytes()
    try:
        return raw, json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise Corrupt(f"{what} is corrupt: {exc}") from None


def _no_constant(name: str):
    raise Corrupt(f"{name} is not valid JSON")


def _read_pointer(path: Path) -> tuple[str, str]:
    _, pointer = _read_small_json(path / POINTER, f"{path}: {POINTER}")
    if not isinstance(pointer, dict) or pointer.get("format") != FORMAT:
        raise Corrupt(f"{path}: {POINTER} is corrupt (not a hubless index pointer)")
    version, sha = pointer.get("version"), pointer.get("manifest_sha256")
    if not isinstance(version, str) or not _VERSION_NAME.fullmatch(version):
        raise Corrupt(f"{path}: {POINTER} is corrupt (version {version!r} is not a version name like v000001)")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise Corrupt(f"{path}: {POINTER} is corrupt (manifest_sha256 is not a sha256 digest)")
    return version, sha


def _load_version(root: Path, folder: Path, manifest_sha: str | None, version: int, mmap: bool) -> SavedIndex:
    if not folder.is_dir():
        raise _VersionGone
    what = f"{root}: {MANIFEST}"
    if manifest_sha is not None and (folder / MANIFEST).is_file() and file_sha256(folder / MANIFEST) != manifest_sha:
        raise Corrupt(f"{what} is corrupt or was altered (its checksum differs from the one in {POINTER})")
    _, manifest = _read_small_json(folder / MANIFEST, what)
    m = _validate_manifest(manifest, version, what)
    for name, expected in m["files"].items():
        f = folder / name
        if not f.is_file():
            if not folder.is_dir():
                raise _VersionGone
            raise Corrupt(f"{root}: {name} is missing")
        if f.stat().st_size != expected["bytes"]:
            raise Corrupt(f"{root}: {name} is truncated or altered (size differs from the manifest)")
        if file_sha256(f) != expected["sha256"]:
            raise Corrupt(f"{root}: {name} is corrupt (checksum mismatch)")
    corr = make_correction(m["method"]).set_params(normalize=m["normalize"])
    with _reading(root, "correction.npz"), np.load(folder / "correction.npz", allow_pickle=False) as data:
        gallery = data["gallery"]
        stats = BankStatistics.from_arrays({k.removeprefix("statistics."): data[k] for k in data.files if k != "gallery"})
    expected = (m["n_items"], m["dim"])
    if gallery.shape != expected or stats.n_gallery != expected[0]:
        raise Corrupt(f"{root}: gallery is {gallery.shape} with statistics of {stats.n_gallery} items, manifest says {expected}")
    with _reading(root, "correction.npz"):
        corr.fit_from_statistics(gallery, stats)  # biases and gates are derived from the kept statistics
    banks = {}
    if "banks.npz" in m["files"]:
        with _reading(root, "banks.npz"), np.load(folder / "banks.npz", allow_pickle=False) as data:
            banks = {k: data[k] for k in data.files}
    flags = faiss.IO_FLAG_MMAP if mmap else 0
    with _reading(root, "index.faiss"):
        faiss_index = faiss.read_index(str(folder / "index.faiss"), flags)
    config, n_bias = m["config"], corr.bias_columns_.shape[1]
    rows = stored_rows(corr.bias_columns_, config.spill_below)  # IVF items spilled to a second list count twice
    if faiss_index.d != m["faiss_dim"] or faiss_index.ntotal != rows:
        raise Corrupt(f"{root}: index.faiss has d={faiss_index.d}, {faiss_index.ntotal} rows; manifest says {m['faiss_dim']}, {rows}")
    offsets = {corr.dim_, plan_layout(config.factory, corr.dim_, n_bias)[2]}  # before / since PQ's own bias codes
    if config.bias_offset is not None and (config.bias_offset not in offsets or config.bias_offset + n_bias > faiss_index.d):
        raise Corrupt(f"{root}: the manifest puts the bias at column {config.bias_offset} of {faiss_index.d}; {config.factory} cannot")
    metadata = None
    if "metadata.parquet" in m["files"]:
        with _reading(root, "metadata.parquet"):
            metadata = _read_parquet(folder / "metadata.parquet")
        if len(metadata) != corr.n_gallery_:
            raise Corrupt(f"{root}: metadata.parquet has {len(metadata)} rows for {corr.n_gallery_} items")
    return SavedIndex(corr, m["config"], faiss_index, m["faiss_dim"], banks, metadata)


class _reading:
    """Turn a failure to parse one part into a ValueError naming it (a part whose checksum
    matches can still be unreadable, e.g. written by a broken tool with a forged manifest)."""

    def __init__(self, root: Path, name: str) -> None:
        self.root, self.name = root, name

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, MissingDependencyError):
            return False
        if isinstance(exc, (zipfile.BadZipFile, RuntimeError, OSError, ValueError, KeyError, TypeError, EOFError, IndexError)):
            detail = " ".join(str(exc).split())[:200]
            raise Corrupt(f"{self.root}: {self.name} cannot be read ({type(exc).__name__}: {detail})") from None
        return False


def _validate_manifest(manifest: Any, version: int, what: str) -> dict:
    """Every field of a manifest, type- and range-checked; a clear error for the first bad one."""
    if not isinstance(manifest, dict):
        raise Corrupt(f"{what} is corrupt (not a JSON object)")
    if manifest.get("format") != FORMAT:
        raise Corrupt(f"{what} is not a hubless manifest (format {manifest.get('format')!r})")
    if manifest.get("version") != version:
        raise Corrupt(
            f"{what} has index format version {manifest.get('version')!r}; this hubless reads version {VERSION} (and {LEGACY_VERSION})"
        )

    def field(name, kind, check=lambda v: True, need="valid"):
        value = manifest.get(name)
        if isinstance(value, bool) and kind is not bool or not isinstance(value, kind) or not check(value):
            raise Corrupt(f"{what}: field {name!r} is missing or invalid (must be {need})")
        return value

    out = {
        "method": field("method", str, lambda v: 0 < len(v) < 1000, "a correction spec"),
        "normalize": field("normalize", bool, need="true or false"),
        "dim": field("dim", int, lambda v: 0 < v < 1 << 20, "a positive dimension"),
        "n_items": field("n_items", int, lambda v: 0 <= v < 1 << 40, "a number of items"),
        "faiss_dim": field("faiss_dim", int, lambda v: 0 < v < 1 << 20, "a positive dimension"),
    }
    if out["faiss_dim"] < out["dim"]:
        raise Corrupt(f"{what}: faiss_dim {out['faiss_dim']} is smaller than dim {out['dim']}")
    try:
        make_correction(out["method"])
        out["config"] = IndexConfig.from_dict(manifest.get("config"))
    except (ValueError, TypeError) as exc:
        raise Corrupt(f"{what}: {' '.join(str(exc).split())}") from None
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise Corrupt(f"{what}: field 'files' is missing or invalid")
    for name in files:
        if name not in PARTS:  # never open a path the manifest makes up (../../etc/passwd)
            raise Corrupt(f"{what}: unexpected file name {name!r} (an index holds only {', '.join(PARTS)})")
    for name in REQUIRED_PARTS:
        if name not in files:
            raise Corrupt(f"{what}: {name} is not listed")
    for name, entry in files.items():
        if (
            not isinstance(entry, dict)
            or not isinstance(entry.get("sha256"), str)
            or not _SHA256.fullmatch(entry["sha256"])
            or isinstance(entry.get("bytes"), bool)
            or not isinstance(entry.get("bytes"), int)
            or entry["bytes"] < 0
        ):
            raise Corrupt(f"{what}: the entry of {name} is invalid (needs sha256 and bytes)")
    out["files"] = files
    return out


def _write_parquet(records: list[dict], file: Path) -> None:
    pa = optional_import("pyarrow", "saving item metadata", "index")
    pq = optional_import("pyarrow.parquet", "saving item metadata", "index", "pyarrow")
    pq.write_table(pa.Table.from_pylist(records), file)


def _read_parquet(file: Path) -> list[dict]:
    pq = optional_import("pyarrow.parquet", "reading item metadata", "index", "pyarrow")
    return pq.read_table(file).to_pylist()
