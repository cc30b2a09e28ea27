"""The encoder interface: batched, no gradients, float32 unit vectors out."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from hubless._registry import Registry
from hubless.errors import InvalidInput, InvalidType
from hubless.progress import progress_bar

__all__ = ["ENCODERS", "Encoder", "open_image"]


def open_image(item):
    """A PIL RGB image from a path or a PIL image (raises on unreadable files)."""
    from PIL import Image

    if isinstance(item, (str, os.PathLike)):
        with Image.open(item) as img:
            return img.convert("RGB")
    return item.convert("RGB")


class Encoder:
    """Base class. Subclasses implement ``_texts`` and/or ``_images`` on one batch (returning a
    torch tensor of features); this class batches, normalises and converts."""

    #: Which inputs the model encodes: a subset of {"text", "image"}.
    modalities: frozenset[str] = frozenset()
    #: The ``kind`` names this adapter registers under (``load_encoder(name, kind=...)``).
    kinds: ClassVar[tuple[str, ...]] = ()
    #: Order in which :func:`~hubless.encoders.load_encoder` asks the adapters whether a model
    #: is theirs (:meth:`claims`): lower first; the catch-all adapter comes last.
    priority: ClassVar[int] = 100

    @classmethod
    def claims(cls, name_or_path: str) -> bool:
        """Whether this adapter reads ``name_or_path`` when no kind is given (hook)."""
        return False

    @classmethod
    def from_name(cls, name_or_path: str, *, kind: str | None = None, device: str | None = None) -> Encoder:
        """Load the model (hook of the registered adapters; ``kind`` one of their ``kinds``)."""
        raise NotImplementedError

    def _texts(self, texts: list[str]):  # pragma: no cover - hook
        """Hook: the features of one batch of texts (a torch tensor)."""
        raise InvalidInput(f"{self.name} does not encode texts")

    def _images(self, images: list):  # pragma: no cover - hook
        """Hook: the features of one batch of PIL images (a torch tensor)."""
        raise InvalidInput(f"{self.name} does not encode images")

    def __init__(self, name: str, device: str) -> None:
        self.name = name
        self.device = device

    @property
    def dim(self) -> int:  # pragma: no cover - set by subclasses
        raise NotImplementedError

    def encode_texts(self, texts: Sequence[str], *, batch_size: int = 64, progress: bool | None = None) -> np.ndarray:
        """(len(texts), dim) float32 unit vectors."""
        self._require("text")
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise InvalidType("encode_texts takes a sequence of strings")
        return self._batched(texts, self._texts, batch_size, progress, "encode texts")

    def encode_images(self, images: Sequence, *, batch_size: int = 32, progress: bool | None = None) -> np.ndarray:
        """(len(images), dim) float32 unit vectors from image paths or PIL images."""
        self._require("image")
        return self._batched(
            list(images), lambda batch: self._images([open_image(i) for i in batch]), batch_size, progress, "encode images"
        )

    def _require(self, modality: str) -> None:
        if modality not in self.modalities:
            raise InvalidInput(f"{self.name} does not encode {modality}s (it encodes: {', '.join(sorted(self.modalities))})")

    def _batched(self, items: list, fn, batch_size: int, progress, desc: str) -> np.ndarray:
        import torch

        if batch_size < 1:
            raise InvalidInput(f"batch_size must be >= 1; got {batch_size}")
        out = np.empty((len(items), self.dim), dtype=np.float32)
        starts = progress_bar(range(0, len(items), batch_size), progress, desc=desc, unit="batch")
        with torch.inference_mode():
            for start in starts:
                feats = fn(items[start : start + batch_size]).float()
                feats = torch.nn.functional.normalize(feats, dim=-1)
                out[start : start + feats.shape[0]] = feats.cpu().numpy()
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, dim={self.dim}, device={self.device!r})"


#: Registry: kind -> encoder class. An adapter registers itself with ``@ENCODERS.register`` in its
#: own module of this package (every module is imported on the first lookup): a new model family
#: is added in one file, with its ``kinds``, ``priority`` and :meth:`Encoder.claims`.
ENCODERS: Registry[type[Encoder]] = Registry(
    "encoder kind", "hubless.encoders", names_of=lambda cls: cls.__dict__.get("kinds", ()), sort_key=lambda cls: cls.priority
)
