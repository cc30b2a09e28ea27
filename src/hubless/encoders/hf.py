"""Hugging Face transformers image-text models: CLIP, SigLIP, BLIP (retrieval projections).

* CLIP (Radford 2021) and SigLIP (Zhai 2023): ``get_text_features`` / ``get_image_features``,
  the projected embeddings their contrastive losses compare.
* BLIP (Li 2022), ``BlipForImageTextRetrieval``: the image-text contrastive embeddings, i.e.
  ``vision_proj`` of the vision [CLS] state and ``text_proj`` of the text encoder's [CLS] state
  (the ITM head is a cross-encoder: see :mod:`hubless.rerank`).

Tokenizer and image processor are loaded with ``AutoTokenizer`` / ``AutoImageProcessor`` from
the same name or folder. SigLIP was trained with texts padded to 64 tokens, so its texts are
padded to ``max_length`` as its model card prescribes.
"""

from __future__ import annotations

import json
from pathlib import Path

from hubless._torch import ensure_model_available, quiet_loading, require, resolve_device
from hubless.encoders.base import ENCODERS, Encoder
from hubless.errors import Corrupt, InvalidInput, MissingFile

__all__ = ["HFEncoder", "KINDS"]

#: transformers ``model_type`` -> how to load it.
KINDS = ("clip", "siglip", "blip")


def _features(out):
    """transformers 4.x returns a tensor from get_*_features, 5.x an output with pooler_output."""
    return out if hasattr(out, "dim") else out.pooler_output


@ENCODERS.register
class HFEncoder(Encoder):
    """A CLIP / SigLIP / BLIP checkpoint (hub name or local folder) as an :class:`Encoder`."""

    modalities = frozenset({"text", "image"})
    kinds = KINDS
    priority = 1000  # the catch-all: read by its transformers config

    @classmethod
    def claims(cls, name_or_path: str) -> bool:
        return True

    @classmethod
    def from_name(cls, name_or_path: str, *, kind: str | None = None, device: str | None = None) -> HFEncoder:
        return cls(name_or_path, kind=kind, device=device)

    def __init__(self, name_or_path: str, kind: str | None = None, device: str | None = None) -> None:
        path = Path(name_or_path)
        if path.exists() and not (path / "config.json").is_file():
            raise MissingFile(f"{path} has no config.json: not a transformers model folder")
        if path.is_dir():
            try:
                json.loads((path / "config.json").read_text())  # fail early on a corrupt config
            except ValueError:
                raise Corrupt(f"{path / 'config.json'} is not valid JSON") from None
        local = ensure_model_available(str(name_or_path))  # before the slow imports
        transformers = require("transformers")
        require("torch")
        config = transformers.AutoConfig.from_pretrained(name_or_path, local_files_only=local)
        kind = kind or config.model_type
        if kind not in KINDS:
            raise InvalidInput(f"{name_or_path}: model type {config.model_type!r} is not supported; expected one of {', '.join(KINDS)}")
        super().__init__(str(name_or_path), resolve_device(device))
        self.kind = kind
        cls = {"clip": transformers.CLIPModel, "siglip": transformers.SiglipModel, "blip": transformers.BlipForImageTextRetrieval}[kind]
        with quiet_loading():
            self.model = cls.from_pretrained(name_or_path, local_files_only=local).to(self.device).eval()
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(name_or_path, local_files_only=local)
            self.image_processor = transformers.AutoImageProcessor.from_pretrained(name_or_path, local_files_only=local)
        if kind == "blip":
            self._dim = self.model.config.image_text_hidden_size
        elif kind == "clip":
            self._dim = self.model.config.projection_dim
        else:
            self._dim = self.model.config.text_config.hidden_size

    @property
    def dim(self) -> int:
        return int(self._dim)

    def _tokens(self, texts):
        if self.kind == "siglip":
            max_len = self.model.config.text_config.max_position_embeddings
            batch = self.tokenizer(texts, padding="max_length", truncation=True, max_length=max_len, return_tensors="pt")
        else:
            max_len = min(self.tokenizer.model_max_length, self.model.config.text_config.max_position_embeddings)
            batch = self.tokenizer(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
        return {k: v.to(self.device) for k, v in batch.items() if k in ("input_ids", "attention_mask")}

    def _texts(self, texts):
        tokens = self._tokens(texts)
        if self.kind == "blip":
            hidden = self.model.text_encoder(**tokens, return_dict=True).last_hidden_state
            return self.model.text_proj(hidden[:, 0])
        if self.kind == "siglip":
            tokens.pop("attention_mask", None)  # SigLIP was trained without one
        return _features(self.model.get_text_features(**tokens))

    def _images(self, images):
        pixels = self.image_processor(images=images, return_tensors="pt")["pixel_values"].to(self.device)
        if self.kind == "blip":
            hidden = self.model.vision_model(pixel_values=pixels, return_dict=True).last_hidden_state
            return self.model.vision_proj(hidden[:, 0])
        return _features(self.model.get_image_features(pixel_values=pixels))
