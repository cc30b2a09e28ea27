"""Reading indexes of formats 3 and 4 (before live indexes), to serve them and convert them.

Format 4: ``idx/CURRENT`` = ``{"format", "version": "v000007", "manifest_sha256"}`` naming a
version directory with ``manifest.json``, ``index.faiss``, ``correction.npz`` (the gallery and
the bank statistics), ``banks.npz`` and ``metadata.parquet``. Format 3: the same files directly
in ``idx/``, without ``CURRENT``. Items had no ids: an item's id is its position. Everything is
verified as it was (manifest checksum in ``CURRENT``, every field, the sha256 of every file);
the next write converts the index to the current format (:mod:`hubless.index.store`).
"""

from __future__ import annotations

import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from hubless._io import file_sha256
from hubless.corrections import Correction, make_additive, make_correction
from hubless.engine import BankStatistics
from hubless.errors import Busy, Corrupt, MissingDependencyError, optional_import
from hubless.index.config import IndexConfig
from hubless.index.faiss_build import plan_layout, stored_rows

__all__ = ["LegacyIndex", "load_legacy", "is_legacy_pointer"]

FORMAT = "hubless-index"
VERSION = 4
LEGACY_VERSION = 3
POINTER = "CURRENT"
MANIFEST = "manifest.json"
PARTS = ("index.faiss", "correction.npz", "banks.npz", "metadata.parquet")
REQUIRED_PARTS = ("index.faiss", "correction.npz")
_VERSION_NAME = re.compile(r"v\d{6}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_SMALL_FILE = 1 << 20


@dataclass
class LegacyIndex:
    """What a format-3/4 index holds; ``metadata`` is a pyarrow Table (or None)."""

    correction: Correction
    config: IndexConfig
    faiss_index: object
    faiss_dim: int
    banks: dict[str, np.ndarray]
    metadata: Any
    format_version: int


def is_legacy_pointer(pointer: Any) -> bool:
    """Whether a parsed ``CURRENT`` is a format-4 pointer (it names a version directory)."""
    return isinstance(pointer, dict) and "format_version" not in pointer and "version" in pointer


def load_legacy(path: Path, pointer: dict | None) -> LegacyIndex:
    """Read a format-4 index (``pointer``: its parsed ``CURRENT``) or, with ``pointer`` None, a
    format-3 one, verifying everything first."""
    for _ in range(5):  # a save may switch versions while we read: follow CURRENT again
        if pointer is None:
            return _load_version(path, path, None, LEGACY_VERSION)
        version, manifest_sha = _check_pointer(path, pointer)
        try:
            return _load_version(path, path / version, manifest_sha, VERSION)
        except _VersionGone:
            pointer = _reread(path)
            if not is_legacy_pointer(pointer):
                raise _Converted from None
            if _check_pointer(path, pointer)[0] == version:
                raise Corrupt(f"{path}: {version}, the version CURRENT names, is missing") from None
    raise Busy(f"{path} changed under five consecutive loads; retry when writes settle")


class _Converted(Exception):
    """CURRENT now names an index of the current format (a writer converted it)."""


def _reread(path: Path):
    return _read_small_json(path / POINTER, f"{path}: {POINTER}")[1]


def _check_pointer(path: Path, pointer) -> tuple[str, str]:
    version, sha = pointer.get("version"), pointer.get("manifest_sha256")
    if pointer.get("format") != FORMAT:
        raise Corrupt(f"{path}: {POINTER} is corrupt (not a hubless index pointer)")
    if not isinstance(version, str) or not _VERSION_NAME.fullmatch(version):
        raise Corrupt(f"{path}: {POINTER} is corrupt (version {version!r} is not a version name like v000001)")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise Corrupt(f"{path}: {POINTER} is corrupt (manifest_sha256 is not a sha256 digest)")
    return version, sha


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


class _VersionGone(Exception):
    """The version directory vanished while it was being read (a save removed it)."""


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


def _load_version(root: Path, folder: Path, manifest_sha: str | None, version: int) -> LegacyIndex:
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
    corr = make_additive(m["method"]).set_params(normalize=m["normalize"])
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
    with _reading(root, "index.faiss"):
        faiss_index = faiss.read_index(str(folder / "index.faiss"))
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
        if metadata.num_rows not in (corr.n_gallery_, 0):  # format 4 wrote 0 rows after a metadata-less add
            raise Corrupt(f"{root}: metadata.parquet has {metadata.num_rows} rows for {corr.n_gallery_} items")
        if metadata.num_rows == 0:
            metadata = None
    return LegacyIndex(corr, m["config"], faiss_index, m["faiss_dim"], banks, metadata, version)


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
            f"{what} has index format version {manifest.get('version')!r}; this hubless reads format versions 5, {VERSION} and {LEGACY_VERSION}"
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
        config = manifest.get("config")
        if not isinstance(config, dict):
            raise TypeError("its config is missing")
        out["config"] = IndexConfig.from_dict(config)
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


def _read_parquet(file: Path):
    pq = optional_import("pyarrow.parquet", "reading item metadata", "index", "pyarrow")
    return pq.ParquetFile(file).read(use_threads=False)  # not read_table: see store._read_base
