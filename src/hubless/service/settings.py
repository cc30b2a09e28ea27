"""The service's settings: limits on a request, each named in the error when exceeded.

One frozen object per application (``create_app(..., limits=Limits(...))``); ``hubless serve``
fills it from its options.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    """Caps on a request, each reported by name when exceeded."""

    max_body_bytes: int = 8 * 2**20
    max_batch: int = 256
    max_top_k: int = 1000
