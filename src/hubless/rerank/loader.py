"""``load_reranker``: a cross-encoder by hub name or local folder."""

from __future__ import annotations

import json
import os
from pathlib import Path

from hubless.errors import InvalidInput
from hubless.rerank.rerankers import BlipITMReranker, CrossEncoderReranker, Reranker

__all__ = ["load_reranker"]


def load_reranker(name_or_path: str | os.PathLike, kind: str | None = None, device: str | None = None,
                  direction: str = "text->image", **kwargs) -> Reranker:  # fmt: skip
    """``kind``: "blip" (BLIP ITM; ``direction`` "text->image" or "image->text") or
    "cross-encoder" (sentence-transformers, text->text). By default a folder or name whose
    transformers config says ``blip`` is BLIP and anything else a CrossEncoder."""
    name = os.fspath(name_or_path)
    if kind is None:
        config = Path(name) / "config.json"
        if config.is_file():
            try:
                kind = "blip" if json.loads(config.read_text()).get("model_type") == "blip" else "cross-encoder"
            except ValueError:
                raise InvalidInput(f"{config} is not valid JSON") from None
        else:
            kind = "blip" if "blip" in name.lower() else "cross-encoder"
    if kind == "blip":
        return BlipITMReranker(name, direction=direction, device=device, **kwargs)
    if kind == "cross-encoder":
        return CrossEncoderReranker(name, device=device, **kwargs)
    raise InvalidInput(f"unknown reranker kind {kind!r}; choose blip or cross-encoder")
