"""``load_reranker``: a cross-encoder by hub name or local folder (see :data:`RERANKERS`)."""

from __future__ import annotations

import os

from hubless.rerank.rerankers import RERANKERS, Reranker

__all__ = ["load_reranker"]


def load_reranker(
    name_or_path: str | os.PathLike, kind: str | None = None, device: str | None = None, direction: str = "text->image", **kwargs
) -> Reranker:
    """``kind``: one of the registered kinds, "blip" (BLIP ITM; ``direction`` "text->image" or
    "image->text") or "cross-encoder" (sentence-transformers, text->text). By default the first
    reranker that claims the model reads it: a folder whose transformers config says ``blip``
    (or, without a config, a name containing "blip") is BLIP, anything else a CrossEncoder."""
    name = os.fspath(name_or_path)
    if kind is not None:
        return RERANKERS.get_class(kind).from_name(name, device=device, direction=direction, **kwargs)
    for cls in dict.fromkeys(RERANKERS.values()):  # each reranker once, by priority
        if cls.claims(name):
            return cls.from_name(name, device=device, direction=direction, **kwargs)
    raise AssertionError("the cross-encoder claims every model")  # pragma: no cover
