"""Queries given as texts or image files, encoded with the model an index was built from.

    q = encode_queries("openai/clip-vit-base-patch32", texts=["a dog on a beach"])
    q = encode_queries(index.model, images=["photo.jpg"], expected_dim=index.correction.dim_)

So a user never has to pre-embed a query: ``hubless search idx/ --text "a dog on a beach"``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hubless._validation import exactly_one
from hubless.encoders.base import Encoder, open_image
from hubless.encoders.loader import load_encoder
from hubless.errors import InvalidInput

__all__ = ["encode_queries"]


def encode_queries(
    model: str | os.PathLike | Encoder,
    *,
    texts: Sequence[str] | None = None,
    images: Sequence[str | os.PathLike] | None = None,
    device: str | None = None,
    expected_dim: int | None = None,
    batch_size: int = 32,
) -> np.ndarray:
    """(m, d) float32 unit query embeddings of ``texts`` or image files ``images``.

    ``model`` is a model name / folder (loaded with :func:`load_encoder`) or an encoder. With
    ``expected_dim`` (the index's dimension), a model of another dimension is refused before any
    search. Unreadable images fail with the file's name (a query is never silently dropped).
    """
    if model is None or (isinstance(model, str) and not model.strip()):
        raise InvalidInput(
            "no model to encode the queries with: pass a model name or folder (an index built without model=... / --model records none)"
        )
    exactly_one({"texts=": texts, "images=": images})
    chosen = texts if texts is not None else images
    assert chosen is not None  # exactly one was given
    items: list = list(chosen)
    if not items:
        raise InvalidInput("no queries given")
    if texts is not None and not all(isinstance(t, str) and t.strip() for t in items):
        raise InvalidInput("every text query must be a non-empty string")
    encoder = model if isinstance(model, Encoder) else load_encoder(model, device=device)
    if expected_dim is not None and encoder.dim != expected_dim:
        raise InvalidInput(f"{encoder.name} gives {encoder.dim}-dimensional embeddings; the index holds {expected_dim}-dimensional ones")
    if texts is not None:
        return encoder.encode_texts(items, batch_size=batch_size, progress=False)
    loaded = []
    for path in items:
        try:
            loaded.append(open_image(path))
        except Exception as exc:  # noqa: BLE001 - any unreadable file is named
            raise InvalidInput(f"cannot read query image {path}: {type(exc).__name__}: {exc}") from None
    return encoder.encode_images(loaded, batch_size=batch_size, progress=False)
