"""Work files of the resumable distributed jobs: each says what it holds and proves it.

A job that can be killed and rerun keeps its finished pieces on disk (the fit's tiles in
``work_dir/tiles/``, :func:`~hubless.distributed.write_augmented`'s parts). Before a rerun
reuses one, it checks two things the file records about itself:

* its **key**: which piece it is (the tile's gallery rows and bank items, or the part's rows)
  and which job it belongs to (a hash of the job's inputs and parameters), so another piece's
  file copied or renamed over it, or a file of another job, is not taken for it;
* a **sha256** of its content, so a truncated, emptied or altered file is not read as data.

A piece that fails either check is recomputed, with one warning line per file
(:class:`RecomputedWarning`, shown by the CLI as ``warning: ...``); a file that cannot be read
at all (a truncated zip, an empty file) counts as damaged: no ``BadZipFile`` or ``EOFError``
reaches the caller.

Formats: an ``.npz`` tile holds its arrays and one more, ``__hubless_work__``: the JSON
``{"key": ..., "sha256": ...}`` (the digest covers the key and every array's name, dtype, shape
and bytes). A ``.npy`` part stays a plain ``.npy`` for any engine to read; its record is the
sidecar ``part_NNNNN.npy.json`` (``{"key": ..., "sha256": <of the file's bytes>}``) until the
output is complete, when the digests move into ``hubless.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RecomputedWarning",
    "describe",
    "file_problem",
    "job_id",
    "load_arrays",
    "read_record",
    "recomputing",
    "save_arrays",
    "write_record",
]

#: The array of a work ``.npz`` that holds its key and checksum.
RECORD = "__hubless_work__"


class RecomputedWarning(UserWarning):
    """A kept work file did not match its record (damaged, or another piece's) and is recomputed."""


def recomputing(path: str | os.PathLike, why: str) -> None:
    """Say, in one line, that the work file ``path`` is recomputed and why."""
    warnings.warn(f"work file {path} {why}: recomputing it", RecomputedWarning, stacklevel=3)


def job_id(description) -> str:
    """A short stable id of a job from a JSON-able description of its inputs and parameters."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _digest(arrays: dict[str, np.ndarray], key) -> str:
    h = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"\0{name}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.data)
    return h.hexdigest()


def save_arrays(path: str | os.PathLike, arrays: dict[str, np.ndarray], key) -> None:
    """Write ``arrays`` and their record (``key`` and sha256) as one ``.npz``, atomically."""
    from hubless._atomic import atomic_open

    record = json.dumps({"key": key, "sha256": _digest(arrays, key)}).encode()
    with atomic_open(path, "wb") as fh:
        parts: dict[str, Any] = {**arrays, RECORD: np.frombuffer(record, dtype=np.uint8)}
        np.savez(fh, **parts)


def load_arrays(path: str | os.PathLike, key) -> tuple[dict[str, np.ndarray] | None, str | None]:
    """``(arrays, None)`` when ``path`` holds the piece ``key`` intact; ``(None, why)`` when it
    exists but must be recomputed (``why`` says what is wrong); ``(None, None)`` when it does not
    exist."""
    path = Path(path)
    if not path.exists():
        return None, None
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except Exception as exc:  # BadZipFile, EOFError, zlib.error, ValueError, OSError... from a damaged file
        return None, f"is damaged (truncated or unreadable: {type(exc).__name__})"
    raw = arrays.pop(RECORD, None)
    try:
        record: Any = json.loads(bytes(raw).decode()) if raw is not None else None
        stored_key, digest = record["key"], record["sha256"]
    except (TypeError, ValueError, KeyError, UnicodeDecodeError):
        return None, "has no record of what it holds (not a work file of this version)"
    if stored_key != json.loads(json.dumps(key)):
        return None, f"holds {describe(stored_key)}, not {describe(key)}"
    if _digest(arrays, stored_key) != digest:
        return None, "does not match its checksum (its content was altered)"
    return arrays, None


def describe(key) -> str:
    """A key in words (for messages)."""
    if isinstance(key, dict):
        return ", ".join(f"{k} {v}" for k, v in key.items())
    return str(key)


def file_digest(path: str | os.PathLike) -> str:
    from hubless._atomic import file_sha256

    return file_sha256(path)


def write_record(path: str | os.PathLike, key) -> str:
    """Record ``key`` and the sha256 of the (already written) file ``path`` in ``path.json``,
    atomically; returns the digest."""
    from hubless._atomic import write_json

    digest = file_digest(path)
    write_json(f"{path}.json", {"key": key, "sha256": digest})
    return digest


def read_record(path: str | os.PathLike) -> dict | None:
    """The record ``path.json`` beside a plain work file (None if missing or unreadable)."""
    try:
        record = json.loads(Path(f"{path}.json").read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "key" in record and "sha256" in record else None


def file_problem(path: str | os.PathLike, digest: str | None) -> str | None:
    """Why the plain work file ``path``, whose recorded sha256 is ``digest``, cannot be kept
    (None: it can; ``""``: it does not exist, so it is simply computed)."""
    path = Path(path)
    if not path.exists():
        return ""
    if digest is None:
        return "has no recorded checksum (the run stopped before recording it)"
    try:
        actual = file_digest(path)
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if actual != digest:
        return "does not match its recorded checksum (truncated or altered)"
    return None
