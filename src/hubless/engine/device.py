"""Where the engine's similarity blocks (its GEMMs) run: numpy on the CPU, or torch on a device.

    HUBLESS_DEVICE=cuda hubless eval ...                # every block product on the GPU
    nnn.fit(gallery, bank, device="cuda"); nnn.search(q, device="cuda")
    with hubless.engine.use_device("cuda", dtype="bfloat16"): ...

Only the products ``rows @ cols.T`` move: the reducers (top-k, log-sum-exp, ...) receive the
same float32 numpy blocks either way, so every statistic and search is computed as before. The
default (``device=None`` and no ``HUBLESS_DEVICE``, or ``"numpy"``) never imports torch. A torch
device (``cpu``, ``cuda``, ``cuda:1``, ``mps``) keeps the column side (the bank, or the gallery
for a search) on the device for the whole pass, so it must fit in the device's memory (split a
larger bank into tiles: :mod:`hubless.distributed`). ``dtype`` (``HUBLESS_DTYPE``):
``float32`` (default), or ``float16`` / ``bfloat16`` products accumulated by the device's
kernels and returned as float32 (their error against float32 is measured in
``benchmarks/torch_engine.py`` and bounded in the tests).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator

import numpy as np

from hubless.errors import InvalidInput

__all__ = ["DTYPES", "block_product", "resolve", "use_device"]

DTYPES = ("float32", "float16", "bfloat16")
_CURRENT: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar("hubless_device", default=(None, None))

#: ``product(rows, c0, c1, out)`` writes ``rows @ cols[c0:c1].T`` into ``out`` (float32).
Product = Callable[[np.ndarray, int, int, np.ndarray], None]


@contextlib.contextmanager
def use_device(device: str | None, dtype: str | None = None) -> Iterator[None]:
    """Run the engine's block products on ``device`` (and ``dtype``) inside the block; None
    keeps the surrounding setting (the environment's by default)."""
    if device is None and dtype is None:
        yield
        return
    token = _CURRENT.set((device, dtype))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def resolve(device: str | None = None, dtype: str | None = None) -> tuple[str, str]:
    """(device, dtype) in effect: the arguments, else :func:`use_device`'s, else
    ``HUBLESS_DEVICE`` / ``HUBLESS_DTYPE``, else ("numpy", "float32"). Checks both."""
    ctx_device, ctx_dtype = _CURRENT.get()
    device = device or ctx_device or os.environ.get("HUBLESS_DEVICE") or "numpy"
    dtype = dtype or ctx_dtype or os.environ.get("HUBLESS_DTYPE") or "float32"
    if dtype not in DTYPES:
        raise InvalidInput(f"unknown dtype {dtype!r} for the engine's products; use one of {', '.join(DTYPES)}")
    if device == "numpy":
        if dtype != "float32":
            raise InvalidInput(f"dtype {dtype} needs a torch device (HUBLESS_DEVICE=cpu or cuda); numpy computes in float32")
        return device, dtype
    from hubless._torch import resolve_device

    return resolve_device(device), dtype


def block_product(cols: np.ndarray, device: str | None = None, dtype: str | None = None) -> Product:
    """The block product against ``cols`` on the device in effect (see :func:`resolve`)."""
    device, dtype = resolve(device, dtype)
    if device == "numpy":

        def numpy_product(rows, c0, c1, out):
            np.matmul(rows, cols[c0:c1].T, out=out)

        return numpy_product
    from hubless._torch import require

    torch = require("torch")
    kind = getattr(torch, dtype)
    on_device = torch.from_numpy(cols).to(device=device, dtype=kind)

    def torch_product(rows, c0, c1, out):
        with torch.no_grad():
            block = torch.from_numpy(rows).to(device=device, dtype=kind) @ on_device[c0:c1].T
            out[...] = block.to(dtype=torch.float32).cpu().numpy()

    return torch_product
