"""Lazy access to torch and friends, with a message that names the extra to install."""

from __future__ import annotations

import importlib

EXTRA_HINT = "pip install 'hubless[models]'"


def require(module: str):
    """Import ``module`` or raise ImportError saying which extra provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{module} is needed for encoders and rerankers: {EXTRA_HINT}") from exc


def resolve_device(device: str | None) -> str:
    """'cuda' when available and not specified, else 'cpu'; an explicit device is checked."""
    torch = require("torch")
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use device='cpu'")
    return str(device)
