"""File helpers: atomic writes (a temporary file in the same directory, then a rename) and checksums.

A crash or an exception mid-write leaves the previous file (if any) untouched and no partial
file behind. Use these for every file hubless writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = [
    "atomic_open",
    "file_sha256",
    "to_json",
    "write_text",
    "write_json",
    "save_npy",
    "umask_mode",
    "open_marked_npy",
    "mark_npz",
    "array_written_by_hubless",
]

#: The mark an array file hubless writes carries, so that a re-run may replace it (the JSON
#: results and HTML reports carry theirs in their text): in a .npy, a comment after the header's
#: dict (numpy reads the header as a Python literal, which ignores it); in a .npz, the zip
#: archive's comment (not a member: ``np.load(...).files`` is unchanged).
ARRAY_MARK = b"generator: hubless"


def umask_mode(base: int = 0o666) -> int:
    """The permissions an ordinary ``open``/``mkdir`` would give (``base`` minus the umask).

    ``tempfile`` creates private (0600/0700) files; a finished output should not stay private.
    """
    mask = os.umask(0)
    os.umask(mask)
    return base & ~mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary sibling of ``path`` for writing; rename it over ``path`` on success."""
    if "b" in mode:
        encoding = None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=encoding) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> Path:
    with atomic_open(path, "w") as fh:
        fh.write(text)
    return Path(path)


def write_json(path: str | os.PathLike, obj: Any, *, indent: int = 2) -> Path:
    """Write ``obj`` as strict JSON, atomically: NaN and infinities become null (Python's
    ``json`` would write ``NaN``/``Infinity``, which other JSON readers reject)."""
    text = to_json(obj, indent=indent)
    with atomic_open(path, "w") as fh:
        fh.write(text + "\n")
    return Path(path)


def to_json(obj: Any, *, indent: int | None = None) -> str:
    """Strict JSON text of ``obj``: non-finite floats become null."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError:
        return json.dumps(_finite(obj), indent=indent, allow_nan=False)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def save_npy(path: str | os.PathLike, array: np.ndarray) -> Path:
    with atomic_open(path, "wb") as fh:
        np.save(fh, array, allow_pickle=False)
    return Path(path)


def open_marked_npy(path: str | os.PathLike, shape: tuple[int, ...], dtype: Any = np.float32) -> np.memmap:
    """A new .npy file at ``path`` (C order) memory-mapped for writing, its header marked with
    :data:`ARRAY_MARK`; the NPY format 1.0: magic, version, header length, the header dict
    padded with spaces to a multiple of 64 bytes, a newline, then the data."""
    import struct

    dtype = np.dtype(dtype)
    dims = tuple(int(n) for n in shape)
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": dims}
    body = f"{header!r} # ".encode("latin1") + ARRAY_MARK
    magic = b"\x93NUMPY\x01\x00"
    pad = -(len(magic) + 2 + len(body) + 1) % 64
    head = magic + struct.pack("<H", len(body) + pad + 1) + body + b" " * pad + b"\n"
    size = math.prod(dims)
    with open(path, "wb") as fh:
        fh.write(head)
        fh.truncate(len(head) + dtype.itemsize * size)
    if size == 0:  # mmap cannot map nothing
        return np.zeros(dims, dtype).view(np.memmap)
    return np.memmap(path, dtype=dtype, mode="r+", offset=len(head), shape=dims)


def mark_npz(path: str | os.PathLike) -> None:
    """Mark a .npz hubless wrote with :data:`ARRAY_MARK` (the zip archive's comment)."""
    import zipfile

    with zipfile.ZipFile(path, "a") as archive:
        archive.comment = ARRAY_MARK


def array_written_by_hubless(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a .npy or .npz file that hubless marked (see :data:`ARRAY_MARK`)."""
    import zipfile

    with open(path, "rb") as fh:
        head = fh.read(4096)
    if head.startswith(b"\x93NUMPY"):
        end = head.find(b"\n")
        return end > 0 and ARRAY_MARK in head[:end]
    if not zipfile.is_zipfile(path):
        return False
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.comment == ARRAY_MARK
    except (zipfile.BadZipFile, OSError):
        return False


def current_dir(folder: str | os.PathLike) -> Path | None:
    """The version folder a ``CURRENT`` pointer file in ``folder`` names (a folder switched to
    atomically by rewriting the pointer), or None when there is no pointer or its folder is gone.
    A pointer that is not one folder name of ``folder`` (damaged bytes, a path leading
    elsewhere) is :class:`~hubless.errors.Corrupt`."""
    folder = Path(folder)
    try:
        raw = (folder / "CURRENT").read_bytes()
    except OSError:
        return None
    name = pointer_name(raw)
    if name is None:
        from hubless.errors import Corrupt

        raise Corrupt(f"{folder / 'CURRENT'} is damaged: it must name one version folder beside it; got {raw[:60]!r}")
    return folder / name if (folder / name).is_dir() else None


def pointer_name(raw: bytes) -> str | None:
    """The folder name a ``CURRENT`` pointer's bytes hold (UTF-8 text, one plain name beside the
    pointer: no separator, no ``..``), or None when they hold anything else."""
    try:
        name = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return None
    if not name or name in (".", "..") or any(c in name for c in "/\\\0") or not name.isprintable():
        return None
    return name


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes (streamed in 1 MiB chunks), as hex. For a directory (e.g. a
    clip-retrieval output folder): the sha256 of every file's relative path and sha256, in
    sorted order, so any change to any file changes it."""
    path = Path(path)
    h = hashlib.sha256()
    if path.is_dir():
        for f in sorted(p for p in path.rglob("*") if p.is_file()):
            h.update(f"{f.relative_to(path).as_posix()}\0{file_sha256(f)}\n".encode())
        return h.hexdigest()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
