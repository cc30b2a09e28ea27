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

__all__ = ["load_array", "load_clip_retrieval", "load_embeddings"]

#: clip-retrieval's output layout: modality -> (embeddings folder, file prefix).
CLIP_RETRIEVAL = {"img": ("img_emb", "img_emb_"), "text": ("text_emb", "text_emb_")}


def _split_key(path: str | os.PathLike) -> tuple[Path, str | None]:
    """``"file.npz:key"`` / ``"folder:text"`` -> (path, "key"); other paths pass through."""
    text = os.fspath(path)
    head, sep, key = text.rpartition(":")
    if sep and key and os.sep not in key and (head.endswith(".npz") or Path(head).is_dir()):
        return Path(head), key
    return Path(text), None


def _numbered(folder: Path, prefix: str, suffix: str) -> list[Path]:
    files = [f for f in folder.glob(f"{prefix}*{suffix}") if f.stem[len(prefix) :].isdigit()]
    return sorted(files, key=lambda f: int(f.stem[len(prefix) :]))


def load_clip_retrieval(folder: str | os.PathLike, modality: str = "img", *, with_metadata: bool = False):
    """Embeddings written by clip-retrieval (``clip-retrieval inference``): the numbered
    ``img_emb/img_emb_{i}.npy`` (or ``text_emb/``) files concatenated in order, and with
    ``with_metadata`` the matching rows of ``metadata/metadata_{i}.parquet`` (needs pyarrow)."""
    folder = Path(folder)
    if modality not in CLIP_RETRIEVAL:
        raise ValueError(f"clip-retrieval modality must be 'img' or 'text'; got {modality!r}")
    sub, prefix = CLIP_RETRIEVAL[modality]
    files = _numbered(folder / sub, prefix, ".npy")
    if not files:
        raise FileNotFoundError(f"{folder} has no {sub}/{prefix}N.npy files (clip-retrieval layout)")
    parts = [load_array(f, mmap=False) for f in files]
    if len({p.shape[1:] for p in parts}) != 1:
        raise ValueError(f"{folder}/{sub}: files have different dimensions")
    embeddings = np.concatenate(parts)
    if not with_metadata:
        return embeddings
    meta_files = _numbered(folder / "metadata", "metadata_", ".parquet")
    if len(meta_files) != len(files):
        raise ValueError(f"{folder}: {len(files)} embedding files but {len(meta_files)} metadata files")
    import pyarrow.parquet as pq

    records = [r for f in meta_files for r in pq.read_table(f).to_pylist()]
    if len(records) != embeddings.shape[0]:
        raise ValueError(f"{folder}: {embeddings.shape[0]} embeddings but {len(records)} metadata rows")
    return embeddings, records


def load_array(path: str | os.PathLike, key: str | None = None, *, mmap: bool = True) -> np.ndarray:
    """Load one array from ``.npy`` or ``.npz`` (``key`` or ``"file.npz:key"`` picks an entry; an
    archive holding a single array needs none), or from a clip-retrieval output folder
    (``"folder"`` for its image embeddings, ``"folder:text"`` for its text embeddings).
    Object arrays (pickles) are refused."""
    file, inline_key = _split_key(path)
    key = key or inline_key
    if file.is_dir() and ((file / "img_emb").is_dir() or (file / "text_emb").is_dir()):
        return load_clip_retrieval(file, key or "img")
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
