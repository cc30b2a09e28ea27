"""The versions a saved index keeps (``config.keep_versions`` = N > 0): the manifest of each of
the N latest versions as ``CURRENT`` held it, in ``versions/v000012.json`` (same header and
checksum), and every file they name kept by the commits after it (:func:`record_version`, called
by :func:`hubless.index.disk.commit`); read back, listed and loaded by number."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from hubless._atomic import umask_mode
from hubless.errors import Corrupt, MissingFile
from hubless.index.pointer import FORMAT, POINTER, VERSION, check_index_dir, names_in, parse_json, read_manifest, validate_manifest
from hubless.index.reading import Gone, Loaded, read_base, replay

__all__ = ["VERSIONS", "list_versions", "load_version", "read_version", "record_version", "version_numbers"]

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
    ``CURRENT``) or one kept in ``versions/``; checked as
    :func:`hubless.index.pointer.read_manifest` checks ``CURRENT``. A version not kept is a
    :class:`~hubless.errors.MissingFile` naming the ones kept."""
    path = check_index_dir(Path(path))
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
    header = parse_json(first, what)
    if not isinstance(header, dict) or header.get("format") != FORMAT or header.get("format_version") != VERSION:
        raise Corrupt(f"{what} is corrupt (not a hubless version record)")
    body = rest.removesuffix(b"\n")
    if hashlib.sha256(body).hexdigest() != header.get("manifest_sha256"):
        raise Corrupt(f"{what} is corrupt or was altered (its manifest does not match its checksum)")
    manifest = parse_json(body, what)
    if not isinstance(manifest, dict) or manifest.get("version") != version:
        raise Corrupt(f"{what} is corrupt (not the manifest of version {version})")
    return validate_manifest(manifest, what)


def load_version(path: str | os.PathLike, version: int, *, mmap: bool = False) -> Loaded:
    """Version ``version`` of the index at ``path`` (see :func:`read_version`), read and checked
    as :func:`hubless.index.reading.load` reads the current one."""
    path = check_index_dir(Path(path))
    manifest = read_version(path, version)
    try:
        base = read_base(path, manifest, mmap=mmap)
        snap = replay(path, base, manifest, manifest["segments"])
    except Gone:
        raise MissingFile(f"{path}: version {version} is no longer kept (its files were removed)") from None
    return Loaded(snap, manifest, (), base=base)


def list_versions(path: str | os.PathLike) -> list[dict]:
    """The versions of the index at ``path`` that can be read, oldest first: each one's number,
    items, rows, segments, base, when it was committed (UTC, ISO 8601) and whether it is the
    current one. A damaged record is listed with ``"damaged": true``."""
    import datetime

    path = check_index_dir(Path(path))
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
        out.append(
            {
                "version": number,
                "items": m["n_items"],
                "rows": m["n_rows"],
                "segments": len(m["segments"]),
                "base": m["base"]["name"],
                "committed": when,
                "current": number == current["version"],
            }
        )
    return out
