"""Reading embedding files (.npy, .npz) with clear errors; shared by every command.

``load_array`` returns the stored array (memory-mapped for .npy when possible); ``load_embeddings``
also validates it as (n, d) float embeddings (see :func:`hubless._validation.as_embeddings`).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

from hubless._validation import as_embeddings

__all__ = ["load_array", "load_embeddings"]


def _split_key(path: str | os.PathLike) -> tuple[Path, str | None]:
    """``"file.npz:key"`` -> (file.npz, "key"); other paths pass through."""
    text = os.fspath(path)
    head, sep, key = text.rpartition(":")
    if sep and head.endswith(".npz") and key and os.sep not in key:
        return Path(head), key
    return Path(text), None


def load_array(path: str | os.PathLike, key: str | None = None, *, mmap: bool = True) -> np.ndarray:
    """Load one array from ``.npy`` or ``.npz`` (``key`` or ``"file.npz:key"`` picks an entry; an
    archive holding a single array needs none). Object arrays (pickles) are refused."""
    file, inline_key = _split_key(path)
    key = key or inline_key
    if not file.is_file():
        raise FileNotFoundError(f"no such file: {file}")
    suffix = file.suffix.lower()
    if suffix not in {".npy", ".npz"}:
        raise ValueError(f"{file}: unsupported file type {suffix!r}; expected .npy or .npz")
    if suffix == ".npy" and key is not None:
        raise ValueError(f"{file} is a .npy file; a key ({key!r}) only applies to .npz archives")
    try:
        if suffix == ".npy":
            return np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
        with np.load(file, allow_pickle=False) as archive:
            names = list(archive.files)
            if key is None and len(names) == 1:
                key = names[0]
            if key in names:
                return archive[key]
    except (OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        if "Object arrays" in str(exc) or "Python objects" in str(exc):
            raise ValueError(f"{file} holds Python objects; only numeric arrays are read (no pickles)") from exc
        raise ValueError(f"cannot read {file}: the file is truncated or corrupt ({exc})") from exc
    if key is None:
        raise ValueError(f"{file} holds {len(names)} arrays ({', '.join(names) or 'none'}); name one as {file}:KEY")
    raise KeyError(f"{file} has no array {key!r}; it holds: {', '.join(names)}")


def load_embeddings(
    path: str | os.PathLike,
    name: str = "embeddings",
    *,
    key: str | None = None,
    normalize: bool = True,
    dim: int | None = None,
    dim_of: str = "the gallery",
) -> np.ndarray:
    """Load and validate (n, d) embeddings as float32, L2-normalised when ``normalize``."""
    array = load_array(path, key)
    return as_embeddings(array, f"{name} ({os.fspath(path)})", normalize=normalize, dim=dim, dim_of=dim_of)
