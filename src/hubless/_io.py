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

__all__ = ["atomic_open", "file_sha256", "to_json", "write_text", "write_json", "save_npy", "umask_mode"]


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
