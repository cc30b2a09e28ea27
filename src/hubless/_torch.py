"""Lazy access to torch and friends (encoders and rerankers), with a message that names the
extra to install."""

from __future__ import annotations

import importlib

from hubless.errors import MissingDependencyError


def require(module: str):
    """Import ``module`` or raise :class:`~hubless.errors.MissingDependencyError` naming the
    ``models`` extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError("encoders and rerankers", module, "models") from exc


def resolve_device(device: str | None) -> str:
    """'cuda' when available and not specified, else 'cpu'; an explicit device is checked."""
    torch = require("torch")
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use device='cpu'")
    return str(device)
