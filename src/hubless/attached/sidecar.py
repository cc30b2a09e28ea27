"""The sidecar of an attached collection: a directory beside the user's collection (never in it).

Layout: ``<sidecar>/CURRENT`` names the live version ``v-<hex>/``, which holds

* ``ids.npy`` (n,) int64: the collection's ids, ascending;
* ``bias.npy`` (n, n_columns) float32: each item's bias columns, row for row with ``ids.npy``;
* ``reserve_ids.npy`` / ``reserve.npy``: the reserve, the ids (ascending) and vectors of the items
  of smallest bias (1% by default), scored exactly on every search (the certificate's bound then
  uses the smallest bias *outside* the reserve, ``reserve.threshold`` in ``attach.json``);
* ``digests.npy`` (n,) uint64: a content digest of each item's vector as the store gave it
  (:func:`hubless.attached.digests.vector_digests`), row for row with ``ids.npy``: what an update
  or an open compares to find vectors changed in place;
* ``scale.npy`` (n,) float32: the store's score of each item over the correction's similarity
  (the item's norm when the store ranks by the raw inner product of vectors the correction
  normalises; 1 otherwise): the store's candidates are re-scored as ``score / scale``, the same
  similarity the biases, the reserve and exact search use;
* ``statistics.npz``: the gallery-wide part of the bank statistics (bank sizes and means, the
  collection's mean, DIS/DualDIS activation sets as rows of ``ids.npy``), what the correction's
  query side reads;
* ``attach.json``: format version, the spec, the source (with its version mark when the store
  keeps one, :meth:`~hubless.attached.sources.base.Source.version`), the fingerprint of what was
  read (count, id range), the default beam measured on an ANN store (``beam``), the banks'
  fingerprints (sha256 of their float32 rows), ``b_min`` (each bias column's smallest value, the
  certificate's bound) and the running sum of the collection's vectors; and the sha256 of each
  file above (``files_sha256``) and of its own content (``info_sha256``), checked when the
  sidecar is read (:class:`~hubless.errors.Corrupt` names the damaged file; hashing reads the
  sidecar once, about a second per GB).

A sidecar written before digests (no ``digests.npy``) is read as it is: its answers are never
claimed ``exact``, and its update attaches again (every vector read once) to record them.

A new version is written completely, then ``CURRENT`` is replaced atomically (a reader sees the
old or the new sidecar, never a mix; a killed attach leaves the old one serving); older versions
are removed after the switch.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tokenize
import uuid
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hubless._atomic import current_dir
from hubless.engine import BankStatistics
from hubless.errors import Corrupt, MissingFile
from hubless.storage.arrays import check_npy

__all__ = [
    "FORMAT_VERSION",
    "Sidecar",
    "array_fingerprint",
    "is_sidecar",
    "read_sidecar",
    "same_collection",
    "source_address",
    "source_location",
    "write_sidecar",
]

FORMAT_VERSION = 1


def array_fingerprint(x: np.ndarray | None) -> str | None:
    """sha256 of a bank's validated float32 rows (with its shape)."""
    if x is None:
        return None
    x = np.ascontiguousarray(x, "<f4")
    h = hashlib.sha256(repr(x.shape).encode())
    h.update(x.tobytes())
    return h.hexdigest()


@dataclass
class Sidecar:
    """What ``attach`` saved: the ids, bias columns, gallery-wide statistics and ``info``."""

    ids: np.ndarray
    bias: np.ndarray
    statistics: BankStatistics
    info: dict
    path: Path | None = None
    #: the reserve: the lowest-bias items' ids (ascending) and vectors, scored exactly on every search
    reserve_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    reserve_vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    #: each item's content digest, row for row with ``ids`` (None: a sidecar written before them)
    digests: np.ndarray | None = None
    #: each item's store score over the correction's similarity, row for row with ``ids`` (None: all 1)
    scale: np.ndarray | None = None

    @property
    def spec(self) -> str:
        return str(self.info["spec"])

    @property
    def fingerprint(self) -> dict:
        return dict(self.info["fingerprint"])


def write_sidecar(folder, sidecar: Sidecar) -> Path:
    """Write ``sidecar`` as a new version of ``folder`` and switch to it atomically."""
    from hubless._atomic import file_sha256, save_npy, write_json, write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if folder.is_file():
        raise Corrupt(f"{folder} is a file, not a sidecar directory")
    version = folder / f"v-{uuid.uuid4().hex[:12]}"
    version.mkdir()
    try:
        save_npy(version / "ids.npy", np.ascontiguousarray(sidecar.ids, np.int64))
        save_npy(version / "bias.npy", np.ascontiguousarray(sidecar.bias, np.float32))
        save_npy(version / "reserve_ids.npy", np.ascontiguousarray(sidecar.reserve_ids, np.int64))
        save_npy(version / "reserve.npy", np.ascontiguousarray(sidecar.reserve_vectors, np.float32))
        if sidecar.digests is None or sidecar.scale is None:
            raise ValueError("a sidecar is written with its digests and scales")
        save_npy(version / "digests.npy", np.ascontiguousarray(sidecar.digests, np.uint64))
        save_npy(version / "scale.npy", np.ascontiguousarray(sidecar.scale, np.float32))
        with open(version / "statistics.npz", "wb") as fh:
            arrays: dict = sidecar.statistics.to_arrays()
            np.savez(fh, **arrays)
        info = {k: v for k, v in sidecar.info.items() if k not in ("files_sha256", "info_sha256")}
        info = {"format_version": FORMAT_VERSION, **info, "files_sha256": {name: file_sha256(version / name) for name in ARRAY_FILES}}
        write_json(version / "attach.json", {**info, "info_sha256": _info_sha256(info)})
        write_text(folder / "CURRENT", version.name)
    except BaseException:
        shutil.rmtree(version, ignore_errors=True)
        raise
    for old in folder.glob("v-*"):
        if old != version:
            shutil.rmtree(old, ignore_errors=True)
    sidecar.path = folder
    return folder


def is_sidecar(folder) -> bool:
    """Whether ``folder`` holds an attached sidecar (its ``CURRENT`` names a version with an
    ``attach.json``), not a saved index."""
    folder = Path(folder)
    if not (folder / "CURRENT").is_file():
        return False
    try:
        version = current_dir(folder)
    except (OSError, ValueError):
        return False
    return version is not None and (version / "attach.json").is_file()


def read_sidecar(folder) -> Sidecar:
    """The current version of the sidecar in ``folder`` (MissingFile when there is none)."""
    folder = Path(folder)
    for attempt in range(3):  # an update may switch versions (and remove this one) while it is read
        version = current_dir(folder)
        if version is None:
            raise MissingFile(f"no attached sidecar in {folder} (run hubless attach ... --out {folder})")
        try:
            return _read_version(folder, version)
        except Corrupt:
            if attempt == 2 or current_dir(folder) == version:
                raise
    raise AssertionError("unreachable")


#: The array files of a version, each recorded with its sha256 in attach.json.
ARRAY_FILES = ("ids.npy", "bias.npy", "reserve_ids.npy", "reserve.npy", "digests.npy", "scale.npy", "statistics.npz")


def _info_sha256(info: dict) -> str:
    """sha256 of attach.json's content (all but this checksum), in a canonical JSON form."""
    return hashlib.sha256(json.dumps(info, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _recorded_digests(folder: Path, info: dict) -> dict:
    """The sha256 of each array file attach.json records, after attach.json's own checksum is
    checked (Corrupt when either is off; empty for a sidecar written before they were recorded,
    read as it is)."""
    if "info_sha256" in info and _info_sha256({k: v for k, v in info.items() if k != "info_sha256"}) != info["info_sha256"]:
        raise Corrupt(f"sidecar {folder}: attach.json is corrupt or was altered (checksum mismatch); attach again")
    digests = info.get("files_sha256") or {}
    unknown = next((name for name in digests if name not in ARRAY_FILES), None)
    if unknown is not None:
        raise Corrupt(f"sidecar {folder}: {unknown} is corrupt or was altered (checksum mismatch); attach again")
    return digests


def _verified_bytes(folder: Path, version: Path, name: str, digests: dict) -> bytes:
    """A version file's bytes, read once and checked against its recorded sha256 (a damaged byte
    in an array would otherwise be read as another id or bias)."""
    raw = (version / name).read_bytes()
    if name in digests and hashlib.sha256(raw).hexdigest() != digests[name]:
        raise Corrupt(f"sidecar {folder}: {name} is corrupt or was altered (checksum mismatch); attach again")
    return raw


def _read_version(folder: Path, version: Path) -> Sidecar:
    def npy(name: str) -> np.ndarray:
        raw = _verified_bytes(folder, version, name, digests)  # read once: checked, then parsed from these bytes
        check_npy(version / name)  # a damaged header is refused before numpy parses it
        return np.load(io.BytesIO(raw), allow_pickle=False)

    try:
        info = json.loads((version / "attach.json").read_text())
        if not isinstance(info, dict):
            raise ValueError("attach.json is not a JSON object")
        digests = _recorded_digests(folder, info)
        ids, bias, reserve_ids, reserve_vectors = (npy(f"{name}.npy") for name in ("ids", "bias", "reserve_ids", "reserve"))
        newer = (version / "digests.npy").exists() or "digests.npy" in digests  # a sidecar written before digests has neither
        digests_, scale = (npy("digests.npy"), npy("scale.npy")) if newer else (None, None)
        with np.load(io.BytesIO(_verified_bytes(folder, version, "statistics.npz", digests)), allow_pickle=False) as data:
            stats = BankStatistics.from_arrays({k: data[k] for k in data.files})
    except Corrupt:
        raise
    except (OSError, EOFError, ValueError, KeyError, SyntaxError, tokenize.TokenError, zipfile.BadZipFile) as exc:  # a cut or damaged file
        raise Corrupt(f"sidecar {folder} cannot be read: {exc or type(exc).__name__}") from None
    if info.get("format_version") != FORMAT_VERSION:
        raise Corrupt(f"sidecar {folder} has format version {info.get('format_version')}; this hubless reads {FORMAT_VERSION}")
    if ids.shape[0] != bias.shape[0] or bias.ndim != 2:
        raise Corrupt(f"sidecar {folder}: {ids.shape[0]} ids but bias rows of shape {bias.shape}")
    if scale is not None and digests_ is not None and (scale.shape != ids.shape or digests_.shape != ids.shape):
        raise Corrupt(f"sidecar {folder}: {ids.shape[0]} ids but digests of shape {digests_.shape} and scales of shape {scale.shape}")
    return Sidecar(ids, bias, stats, info, folder, reserve_ids, reserve_vectors, digests_, scale)


def source_location(sidecar: Sidecar) -> Path | None:
    """Where the local collection (a file or folder) ``sidecar`` is attached to is now: first at
    its path relative to the sidecar folder (recorded at attach: a sidecar moved together with
    its collection finds it), then at the absolute path recorded; None when neither exists (or
    the collection is a server's)."""
    source = sidecar.info["source"]
    candidates = []
    if sidecar.path is not None and source.get("location_from_sidecar"):
        candidates.append(Path(os.path.normpath(Path(sidecar.path).absolute() / source["location_from_sidecar"])))
    if source.get("location"):
        candidates.append(Path(source["location"]))
    return next((location for location in candidates if location.exists()), None)


def source_address(sidecar: Sidecar) -> str:
    """The address of the collection ``sidecar`` is attached to, as this process can open it: a
    local collection where :func:`source_location` finds it, else the address given to
    ``attach`` (a sidecar written before hubless recorded the location: a relative path then
    reads from the working folder)."""
    from hubless.attached.sources.base import relocate

    uri = str(sidecar.info["source"]["uri"])
    location = source_location(sidecar)
    return uri if location is None else relocate(uri, location)


def same_collection(src, sidecar: Sidecar) -> bool:
    """Whether the open source ``src`` is the collection ``sidecar`` records: the same address,
    or the same local file or folder (given by an address relative to another working folder)."""
    from hubless.export.base import without_password

    recorded = sidecar.info["source"]
    if src.uri == without_password(recorded["uri"]):  # a sidecar of an earlier hubless may hold one
        return True
    if src.local is None:
        return False
    here = Path(src.local).resolve()
    found = source_location(sidecar)
    return str(here) == recorded.get("location") or (found is not None and found.resolve() == here)
