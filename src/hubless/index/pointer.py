"""The ``CURRENT`` pointer of a saved index and the manifest it holds: the format's name and
version, the names of its bases and segments, and the checks a manifest passes before any file it
names is opened (every field type- and range-checked, its own sha256 verified).

``CURRENT`` is a header line ``{"format", "format_version", "manifest_sha256"}`` and the manifest
(JSON); the layout it describes is in :mod:`hubless.index.disk`, which writes it. Indexes of
earlier formats (3 and 4, written before live indexes, never released) are refused with a
:class:`~hubless.errors.Corrupt` saying to rebuild them (:func:`read_manifest`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from hubless._atomic import pointer_name
from hubless.corrections import make_correction
from hubless.errors import Corrupt, InvalidInput, MissingDependency, MissingFile
from hubless.index.config import IndexConfig
from hubless.index.ids import MAX_ID
from hubless.index.metadata import Metadata

__all__ = [
    "BASE_NAME",
    "FORMAT",
    "PENDING",
    "POINTER",
    "SEGMENT_NAME",
    "STAT_FILE",
    "VERSION",
    "check_index_dir",
    "earlier_format",
    "is_index",
    "names_in",
    "parse_json",
    "pointer_stamp",
    "read_manifest",
    "validate_manifest",
]

FORMAT = "hubless-index"
VERSION = 5
POINTER = "CURRENT"
#: A base's folder name (b000003) and a segment's file name (s000012.seg).
BASE_NAME = re.compile(r"b\d{6}")
SEGMENT_NAME = re.compile(r"s\d{6}\.seg")
#: A segment written by another writer (hubless.index.segments), not yet committed.
PENDING = re.compile(r"\.pending-[0-9a-f]{32}\.seg")
#: A base's per-item bank statistics file (stat.NAME.npy).
STAT_FILE = re.compile(r"stat\.(query_topk|query_probes|(?:query|gallery)_lse@[0-9.e+-]+)\.npy")
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
_MAX_POINTER = 16 << 20


def is_index(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory holding a hubless index (of this or an earlier format:
    a save with ``overwrite=True`` may replace either; only this format loads)."""
    path = Path(path)
    return path.is_dir() and ((path / POINTER).is_file() or (path / "manifest.json").is_file())


def names_in(manifest: dict | None) -> set[str]:
    """The directory entries a manifest uses (its base and segments)."""
    if manifest is None:
        return set()
    return {manifest["base"]["name"], *(s["name"] for s in manifest["segments"])}


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
    path = check_index_dir(Path(path))
    file = path / POINTER
    if not file.exists():
        raise earlier_format(path, 3)  # format 3 kept manifest.json beside its files
    what = f"{path}: {POINTER}"
    if not file.is_file() or file.stat().st_size > _MAX_POINTER:
        raise Corrupt(f"{what} is not a hubless pointer file")
    raw = file.read_bytes()
    if _names_a_sidecar(path, raw):
        raise InvalidInput(
            f"{path} is an attached collection's sidecar (hubless attach), not an index: search it with "
            f"hubless attach SOURCE --out {path} --search QUERIES, serve it as NAME={path}, or open it with AttachedCollection.from_sidecar"
        )
    if raw.count(b"\n") != 2:  # format 4 wrote one JSON object (indented) naming a version directory
        whole = parse_json(raw, what)
        if isinstance(whole, dict) and whole.get("format") == FORMAT and "format_version" not in whole and "version" in whole:
            raise earlier_format(path, 4)
    first, _, rest = raw.partition(b"\n")
    header = parse_json(first, what)
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
    manifest = parse_json(text, what)
    if not isinstance(manifest, dict):
        raise Corrupt(f"{what} is corrupt (the manifest is not a JSON object)")
    return validate_manifest(manifest, what), header


def _names_a_sidecar(path: Path, raw: bytes) -> bool:
    """Whether a ``CURRENT`` holding ``raw`` is an attached sidecar's pointer (one short folder
    name beside it, holding attach.json) rather than an index's (a header and a manifest)."""
    named = pointer_name(raw)
    if named is None:  # an index's pointer (a header and a manifest, on lines) is never a name
        return False
    try:
        return (path / named / "attach.json").is_file()
    except OSError:  # a name too long for the file system
        return False


def earlier_format(path: Path, version: int) -> Corrupt:
    """The error for an index written in an earlier format: this hubless reads only
    :data:`VERSION` (formats 3 and 4 came before live indexes and were never released)."""
    return Corrupt(
        f"{path} is a hubless index of format {version}, written by an earlier format of hubless; this hubless reads "
        f"format {VERSION} only: rebuild the index (`hubless index build --gallery ... --out {path} --overwrite`, or "
        "`Index.build(...).save(path, overwrite=True)`)"
    )


def parse_json(raw: bytes, what: str):
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError) as exc:
        raise Corrupt(f"{what} is corrupt: {' '.join(str(exc).split())[:200]}") from None


def _no_constant(name: str):
    raise Corrupt(f"{name} is not valid JSON")


def check_index_dir(path: Path) -> Path:
    if not path.exists():
        raise MissingFile(f"no such index directory: {path}")
    if not path.is_dir():
        raise InvalidInput(f"{path} is not a directory; an index is a directory written by `hubless index build`")
    if not is_index(path):
        raise MissingFile(f"{path} is not a hubless index (no {POINTER})")
    return path


def validate_manifest(m: Any, what: str) -> dict:
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
        except MissingDependency:
            raise
        except Exception:  # noqa: BLE001 - any parse failure of a damaged schema
            raise Corrupt(f"{what}: field 'metadata_schema' cannot be read") from None
    base = m.get("base")
    if not isinstance(base, dict) or not isinstance(base.get("name"), str) or not BASE_NAME.fullmatch(base["name"]):
        raise Corrupt(f"{what}: field 'base' is missing or invalid (must name a base like b000001)")
    field_("rows", int, *count, source=base)
    files = base.get("files")
    if not isinstance(files, dict):
        raise Corrupt(f"{what}: the base's 'files' is missing or invalid")
    for name, entry in files.items():
        if name not in _FIXED_BASE_FILES and not STAT_FILE.fullmatch(name):  # never open a path the manifest makes up
            raise Corrupt(f"{what}: unexpected file name {name!r} in the base")
        _check_entry(entry, name, what)
    for name in _REQUIRED_BASE_FILES:
        if name not in files:
            raise Corrupt(f"{what}: the base's {name} is not listed")
    segments = m.get("segments")
    if not isinstance(segments, list):
        raise Corrupt(f"{what}: field 'segments' is missing or invalid")
    for entry in segments:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not SEGMENT_NAME.fullmatch(entry["name"]):
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
