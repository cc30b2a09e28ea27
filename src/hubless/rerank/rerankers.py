"""Cross-encoders that score (query, candidate) pairs: BLIP ITM, sentence-transformers
CrossEncoder, or any Python callable. Every reranker returns one logit per pair (higher = a
better match; sigmoid(logit) is the match probability for the two model-based ones)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np

from hubless._registry import Registry
from hubless._torch import ensure_model_available, quiet_loading, require, resolve_device
from hubless.encoders.base import open_image
from hubless.errors import Corrupt, InvalidInput

__all__ = ["RERANKERS", "BlipITMReranker", "CallableReranker", "CrossEncoderReranker", "Reranker"]


class Reranker:
    """Interface: ``score_pairs(queries, candidates) -> (n_pairs,) float32 logits``."""

    #: What the queries and candidates are: "text->image", "image->text" or "text->text".
    direction = "text->text"
    #: The ``kind`` names a model-based reranker registers under (``load_reranker(name, kind=...)``).
    kinds: ClassVar[tuple[str, ...]] = ()
    #: Order in which :func:`~hubless.rerank.load_reranker` asks the registered rerankers whether
    #: a model is theirs (:meth:`claims`): lower first; the catch-all comes last.
    priority: ClassVar[int] = 100

    @classmethod
    def claims(cls, name_or_path: str) -> bool:
        """Whether this reranker reads ``name_or_path`` when no kind is given (hook)."""
        return False

    @classmethod
    def from_name(cls, name_or_path: str, *, device: str | None = None, direction: str = "text->image", **kwargs) -> Reranker:
        """Load the model (hook of the registered rerankers; ``direction`` matters to cross-modal ones)."""
        raise NotImplementedError


#: Registry: kind -> reranker class. A model-based reranker registers itself with
#: ``@RERANKERS.register`` in its own module of this package (every module is imported on the
#: first lookup): a new one is added in one file, with its ``kinds``, ``priority``,
#: :meth:`Reranker.claims` and :meth:`Reranker.from_name`.
RERANKERS: Registry[type[Reranker]] = Registry(
    "reranker kind", "hubless.rerank", names_of=lambda cls: cls.__dict__.get("kinds", ()), sort_key=lambda cls: cls.priority
)


def _model_type(name_or_path: str) -> str | None:
    """The ``model_type`` of a local transformers folder (None when it has no config.json)."""
    config = Path(name_or_path) / "config.json"
    if not config.is_file():
        return None
    try:
        return json.loads(config.read_text()).get("model_type")
    except ValueError:
        raise Corrupt(f"{config} is not valid JSON") from None

    def score_pairs(self, queries: Sequence, candidates: Sequence) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError


class CallableReranker(Reranker):
    """Wrap ``fn(queries, candidates) -> scores`` (a user's own model)."""

    def __init__(self, fn: Callable[[list, list], Sequence[float]], direction: str = "text->text") -> None:
        self.fn = fn
        self.direction = direction

    def score_pairs(self, queries, candidates) -> np.ndarray:
        out = np.asarray(self.fn(list(queries), list(candidates)), dtype=np.float32).reshape(-1)
        if out.shape[0] != len(queries):
            raise InvalidInput(f"the reranker returned {out.shape[0]} scores for {len(queries)} pairs")
        return out


@RERANKERS.register
class CrossEncoderReranker(Reranker):
    """A sentence-transformers ``CrossEncoder`` (text->text), by hub name or folder."""

    kinds = ("cross-encoder",)
    priority = 1000  # the catch-all

    @classmethod
    def claims(cls, name_or_path: str) -> bool:
        return True

    @classmethod
    def from_name(cls, name_or_path, *, device=None, direction="text->image", **kwargs) -> CrossEncoderReranker:
        return cls(name_or_path, device=device, **kwargs)  # text->text whatever the direction asked

    def __init__(self, name_or_path: str, device: str | None = None, batch_size: int = 64) -> None:
        local = ensure_model_available(str(name_or_path))  # before the slow imports
        st = require("sentence_transformers")
        self.name = str(name_or_path)
        self.device = resolve_device(device)
        self.batch_size = batch_size
        with quiet_loading():
            self.model = st.CrossEncoder(self.name, device=self.device, local_files_only=local)

    def score_pairs(self, queries, candidates) -> np.ndarray:
        pairs = [(str(q), str(c)) for q, c in zip(queries, candidates)]
        scores = (
            self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False, convert_to_numpy=True, activation_fn=None)
            if pairs
            else []
        )
        return np.asarray(scores, dtype=np.float32).reshape(len(pairs), -1)[:, -1]


@RERANKERS.register
class BlipITMReranker(Reranker):
    """BLIP's image-text matching head (``BlipForImageTextRetrieval``, Li et al. 2022): the text
    encoder cross-attends to the image and a linear head gives (no-match, match) logits; the
    score is their difference, so sigmoid(score) = P(match).

    ``direction``: "text->image" (queries are texts, candidates image paths / PIL images) or
    "image->text". Each image is preprocessed and run through the vision tower once and cached
    (``cache_size`` images), since the same candidates recur across queries.
    """

    kinds = ("blip",)
    priority = 10

    @classmethod
    def claims(cls, name_or_path: str) -> bool:
        """A folder whose config says ``blip``, or (no config) a name containing "blip"."""
        if (Path(name_or_path) / "config.json").is_file():
            return _model_type(str(name_or_path)) == "blip"
        return "blip" in str(name_or_path).lower()

    @classmethod
    def from_name(cls, name_or_path, *, device=None, direction="text->image", **kwargs) -> BlipITMReranker:
        return cls(name_or_path, direction=direction, device=device, **kwargs)

    def __init__(
        self, name_or_path: str, direction: str = "text->image", device: str | None = None, batch_size: int = 32, cache_size: int = 4096
    ) -> None:
        if direction not in ("text->image", "image->text"):
            raise InvalidInput("BLIP ITM reranks text->image or image->text")
        local = ensure_model_available(str(name_or_path))  # before the slow imports
        transformers = require("transformers")
        self.torch = require("torch")
        self.name, self.direction = str(name_or_path), direction
        self.device = resolve_device(device)
        self.batch_size, self.cache_size = batch_size, cache_size
        with quiet_loading():
            self.model = transformers.BlipForImageTextRetrieval.from_pretrained(self.name, local_files_only=local).to(self.device).eval()
            self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.name, local_files_only=local)
            self.image_processor = transformers.AutoImageProcessor.from_pretrained(self.name, local_files_only=local)
        self._cache: OrderedDict = OrderedDict()

    def _image_states(self, images: list):
        torch = self.torch
        keys = [i if isinstance(i, str) else id(i) for i in images]
        missing = [i for i, k in enumerate(keys) if k not in self._cache]
        if missing:
            pixels = self.image_processor(images=[open_image(images[i]) for i in missing], return_tensors="pt")["pixel_values"].to(
                self.device
            )
            states = self.model.vision_model(pixel_values=pixels, return_dict=True).last_hidden_state
            for row, i in enumerate(missing):
                self._cache[keys[i]] = states[row]
        for k in keys:
            self._cache.move_to_end(k)
        out = torch.stack([self._cache[k] for k in keys])
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return out

    def score_pairs(self, queries, candidates) -> np.ndarray:
        torch = self.torch
        texts, images = (queries, candidates) if self.direction == "text->image" else (candidates, queries)
        texts, images = [str(t) for t in texts], list(images)
        out = np.empty(len(texts), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                t = texts[start : start + self.batch_size]
                states = self._image_states(images[start : start + self.batch_size])
                tokens = self.tokenizer(
                    t, padding=True, truncation=True, max_length=self.model.config.text_config.max_position_embeddings, return_tensors="pt"
                ).to(self.device)
                hidden = self.model.text_encoder(
                    input_ids=tokens["input_ids"],
                    attention_mask=tokens["attention_mask"],
                    encoder_hidden_states=states,
                    encoder_attention_mask=torch.ones(states.shape[:-1], dtype=torch.long, device=self.device),
                    return_dict=True,
                ).last_hidden_state
                logits = self.model.itm_head(hidden[:, 0, :])
                out[start : start + len(t)] = (logits[:, 1] - logits[:, 0]).float().cpu().numpy()
        return out
