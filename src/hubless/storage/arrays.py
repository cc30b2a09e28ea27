"""Array files: ``file.npz:key`` and ``folder:text`` names, clip-retrieval output folders, and the
header check of a ``.npy`` file before it is mapped."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from hubless.errors import InvalidInput

__all__ = ["CLIP_RETRIEVAL", "check_npy", "is_clip_retrieval", "split_key"]

#: clip-retrieval's output layout: modality -> (embeddings folder, file prefix).
CLIP_RETRIEVAL = {"img": ("img_emb", "img_emb_"), "text": ("text_emb", "text_emb_")}


def split_key(path: str | os.PathLike) -> tuple[Path, str | None]:
    """``"file.npz:key"`` / ``"folder:text"`` -> (path, "key"); other paths pass through."""
    text = os.fspath(path)
    head, sep, key = text.rpartition(":")
    if sep and key and os.sep not in key and (head.endswith(".npz") or Path(head).is_dir()):
        return Path(head), key
    return Path(text), None


def is_clip_retrieval(folder: Path) -> bool:
    """Whether a folder is clip-retrieval output (it has ``img_emb/`` or ``text_emb/``)."""
    return (folder / "img_emb").is_dir() or (folder / "text_emb").is_dir()


def check_npy(file: Path) -> None:
    """Refuse a ``.npy`` whose header is damaged or disagrees with the file's size, before
    numpy reads it (a flipped bit in the header can otherwise raise a tokenizer error, or load
    silently with another shape)."""
    fmt = np.lib.format
    try:
        with open(file, "rb") as fh:
            version = fmt.read_magic(fh)
            if version not in ((1, 0), (2, 0), (3, 0)):
                raise InvalidInput(f"unknown .npy version {version}")
            read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
            shape, fortran, dtype = read(fh) if read else fmt._read_array_header(fh, version)  # type: ignore[attr-defined]  # noqa: SLF001 - v3 has no public reader
            offset = fh.tell()
    except Exception as exc:  # numpy raises ValueError, SyntaxError, TokenError... for damaged headers
        raise InvalidInput(
            f"cannot read {file}: its .npy header is damaged ({type(exc).__name__}: {' '.join(str(exc).split())[:120]})"
        ) from None
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape) or not isinstance(fortran, bool):
        raise InvalidInput(f"cannot read {file}: its .npy header holds an invalid shape {shape!r}")
    if dtype.hasobject:
        raise InvalidInput(f"{file} holds Python objects; only numeric arrays are read (no pickles)")
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and np.little_endian is False):
        raise InvalidInput(
            f"{file} is big-endian ({dtype.str}); hubless reads little-endian arrays: convert it with "
            "np.save(path, np.load(path).astype(np.float32)) (a damaged header can also look like this)"
        )
    expected = offset + int(np.prod(shape, dtype=object)) * dtype.itemsize
    size = file.stat().st_size
    if size != expected:
        raise InvalidInput(
            f"cannot read {file}: the header says {shape} {dtype} ({expected:,} bytes) but the file has {size:,} bytes (truncated or corrupt)"
        )
