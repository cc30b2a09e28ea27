"""Where the engine's similarity blocks (its GEMMs and their reductions) run: numpy on the CPU,
or torch on a device.

    HUBLESS_DEVICE=cuda hubless eval ...                # the bank statistics and searches on the GPU
    nnn.fit(gallery, bank, device="cuda"); nnn.search(q, device="cuda")
    with hubless.engine.use_device("cuda", dtype="bfloat16"): ...

The default (``device=None`` and no ``HUBLESS_DEVICE``, or ``"numpy"``) never imports torch. A
torch device (``cpu``, ``cuda``, ``cuda:1``, ``mps``; several as ``"cuda:0,cuda:1"``, which
split the rows between them) runs the bank statistics (every
:func:`hubless.engine.compute_statistics` pass) and exact searches (raw, or ranked by an
additive correction's bias), and the evaluation's ranks, in the device-resident engine
(:mod:`hubless.engine.torch_passes`, :mod:`hubless.engine.torch_ranking`): each block's product
and its reduction run on the device and only per-row results come back. Other streamed work (a
non-additive correction's search, dense scores) runs its block products on the device and
reduces the blocks on the host (:func:`block_product`). The gallery stays on the device for the
whole pass; a bank larger than half a CUDA device's free memory streams in from pinned host
memory (:mod:`hubless.engine.torch_arrays`). ``dtype`` (``HUBLESS_DTYPE``): ``float32`` (default), or
``float16`` / ``bfloat16`` products returned as float32 (their error against float32 is
measured in ``benchmarks/gpu_engine.py`` and bounded in the tests). ``tf32``
(``HUBLESS_TF32=1``): let CUDA run float32 products as TF32 (off by default: TF32 keeps 10
bits of mantissa, about 1e-3 relative error per product). ``compiled`` (``HUBLESS_COMPILE=1``):
the ranking pass of ``evaluate`` / ``tune`` runs each block's per-ranking work as kernels
compiled by ``torch.compile`` (:mod:`hubless.engine.torch_fused`; off by default: compiling
takes seconds).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import threading
from collections.abc import Callable, Iterator

import numpy as np

from hubless.errors import InvalidInput, optional_import

__all__ = [
    "DTYPES",
    "block_product",
    "checked_on_device",
    "compiled_enabled",
    "resolve",
    "tf32_products",
    "torch_device",
    "use_device",
]

DTYPES = ("float32", "float16", "bfloat16")
_CURRENT: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar("hubless_device", default=(None, None))
_TF32: contextvars.ContextVar[bool | None] = contextvars.ContextVar("hubless_tf32", default=None)
_COMPILED: contextvars.ContextVar[bool | None] = contextvars.ContextVar("hubless_compiled", default=None)

#: ``product(rows, c0, c1, out)`` writes ``rows @ cols[c0:c1].T`` into ``out`` (float32).
Product = Callable[[np.ndarray, int, int, np.ndarray], None]


@contextlib.contextmanager
def use_device(device: str | None, dtype: str | None = None, *, tf32: bool | None = None, compiled: bool | None = None) -> Iterator[None]:
    """Run the engine's blocks on ``device`` (and ``dtype``; ``tf32``: allow TF32 float32
    products on CUDA; ``compiled``: the ranking pass's per-block work as kernels compiled by
    ``torch.compile``, see :mod:`hubless.engine.torch_fused`) inside the block; None keeps the
    surrounding setting (the environment's by default)."""
    token = _CURRENT.set((device, dtype)) if device is not None or dtype is not None else None
    tf32_token = _TF32.set(tf32) if tf32 is not None else None
    compiled_token = _COMPILED.set(compiled) if compiled is not None else None
    try:
        yield
    finally:
        if token is not None:
            _CURRENT.reset(token)
        if tf32_token is not None:
            _TF32.reset(tf32_token)
        if compiled_token is not None:
            _COMPILED.reset(compiled_token)


def resolve(device: str | None = None, dtype: str | None = None) -> tuple[str, str]:
    """(device, dtype) in effect: the arguments, else :func:`use_device`'s, else
    ``HUBLESS_DEVICE`` / ``HUBLESS_DTYPE``, else ("numpy", "float32"). Checks both."""
    ctx_device, ctx_dtype = _CURRENT.get()
    if isinstance(device, (list, tuple)):  # several devices: "cuda:0,cuda:1"
        device = ",".join(device)
    device = device or ctx_device or os.environ.get("HUBLESS_DEVICE") or "numpy"
    dtype = dtype or ctx_dtype or os.environ.get("HUBLESS_DTYPE") or "float32"
    if dtype not in DTYPES:
        raise InvalidInput(f"unknown dtype {dtype!r} for the engine's products; use one of {', '.join(DTYPES)}")
    if device == "numpy":
        if dtype != "float32":
            raise InvalidInput(f"dtype {dtype} needs a torch device (HUBLESS_DEVICE=cpu or cuda); numpy computes in float32")
        return device, dtype
    from hubless._torch import resolve_device

    optional_import("torch", f"the torch engine (device={device!r})", "models")
    # several devices ("cuda:0,cuda:1"): the torch engine splits its rows between them
    return ",".join(resolve_device(part.strip()) for part in str(device).split(",")), dtype


def torch_device(device: str | None = None, dtype: str | None = None) -> tuple[str, str] | None:
    """(device, dtype) of the torch engine when a torch device is in effect, else None."""
    device, dtype = resolve(device, dtype)
    return None if device == "numpy" else (device, dtype)


@contextlib.contextmanager
def checked_on_device(device: str | None = None, *, when: bool = True) -> Iterator[None]:
    """Inside the block, when a single torch device is in effect with float32 products (and
    ``when``), :func:`hubless._validation.as_embeddings` computes its row norms on the device
    (:func:`hubless.engine.torch_arrays.row_norms`: finiteness, scale and normalisation follow
    from them, with the same errors and messages) instead of a host pass over every entry, and
    the uploads it makes serve the passes that follow in the block (one
    :func:`~hubless.engine.torch_arrays.resident` block). Elsewhere nothing changes."""
    on_device = torch_device(device) if when else None
    if on_device is None or "," in on_device[0] or on_device[1] != "float32":
        yield
        return
    from hubless._validation import ROW_NORMS
    from hubless.engine import torch_arrays

    name = on_device[0]
    with torch_arrays.resident():
        token = ROW_NORMS.set(lambda array: torch_arrays.row_norms(array, name))
        try:
            yield
        finally:
            ROW_NORMS.reset(token)


def tf32_enabled() -> bool:
    """Whether TF32 float32 products are allowed: :func:`use_device`'s ``tf32``, else
    ``HUBLESS_TF32`` (1/true/yes/on), else False."""
    return _switch(_TF32, "HUBLESS_TF32")


def compiled_enabled() -> bool:
    """Whether the ranking pass compiles its per-block work (:mod:`hubless.engine.torch_fused`):
    :func:`use_device`'s ``compiled``, else ``HUBLESS_COMPILE`` (1/true/yes/on), else False."""
    return _switch(_COMPILED, "HUBLESS_COMPILE")


def _switch(chosen: contextvars.ContextVar[bool | None], variable: str) -> bool:
    """A switch of :func:`use_device` if set there, else the environment's ``variable``."""
    value = chosen.get()
    if value is not None:
        return value
    return os.environ.get(variable, "").strip().lower() in {"1", "true", "yes", "on"}


_TF32_LOCK = threading.Lock()


class _Tf32State:
    """How many passes are inside :func:`tf32_products`, and what puts torch's flag back."""

    depth = 0
    restore: Callable[[], None] | None = None


_TF32_STATE = _Tf32State()


@contextlib.contextmanager
def tf32_products(device: str) -> Iterator[None]:
    """Inside the block, CUDA float32 products are TF32 exactly when :func:`tf32_enabled`;
    torch's flag is restored after; nothing changes elsewhere.

    The flag is process-wide: the first pass to enter sets it and the last to leave restores
    it (several devices run their passes in threads at once). torch has two APIs for it: the
    legacy ``torch.backends.cuda.matmul.allow_tf32`` and, from torch 2.9,
    ``torch.backends.cuda.matmul.fp32_precision``; once a program has used the new one, reading
    the legacy flag raises, so the new one is used then (and the legacy one otherwise, which
    leaves a program that never touched either able to read it)."""
    if not str(device).startswith("cuda"):
        yield
        return
    import torch

    with _TF32_LOCK:
        if _TF32_STATE.depth == 0:
            _TF32_STATE.restore = _set_tf32(torch.backends.cuda.matmul, tf32_enabled())
        _TF32_STATE.depth += 1
    try:
        yield
    finally:
        with _TF32_LOCK:
            _TF32_STATE.depth -= 1
            if _TF32_STATE.depth == 0:
                restore, _TF32_STATE.restore = _TF32_STATE.restore, None
                if restore is not None:
                    restore()


def _set_tf32(matmul, on: bool) -> Callable[[], None]:
    """Set CUDA's TF32 flag for float32 matmuls; returns what puts it back."""
    try:
        before = matmul.allow_tf32
    except RuntimeError:  # the program set the new API: legacy reads refuse
        precision = matmul.fp32_precision
        matmul.fp32_precision = "tf32" if on else "ieee"

        def restore_precision() -> None:
            matmul.fp32_precision = precision

        return restore_precision
    matmul.allow_tf32 = on

    def restore_legacy() -> None:
        matmul.allow_tf32 = before

    return restore_legacy


def block_product(cols: np.ndarray, device: str | None = None, dtype: str | None = None) -> Product:
    """The block product against ``cols`` on the device in effect (see :func:`resolve`)."""
    device, dtype = resolve(device, dtype)
    if device == "numpy":

        def numpy_product(rows, c0, c1, out):
            np.matmul(rows, cols[c0:c1].T, out=out)

        return numpy_product
    torch = optional_import("torch", f"the torch engine (device={device!r})", "models")
    device = device.split(",")[0]  # this path uses one device (the first of several)
    kind = getattr(torch, dtype)
    from hubless._torch import from_numpy  # quiet on read-only arrays

    on_device = from_numpy(cols).to(device=device, dtype=kind)

    def torch_product(rows, c0, c1, out):
        with torch.no_grad(), tf32_products(device):
            block = from_numpy(rows).to(device=device, dtype=kind) @ on_device[c0:c1].T
            out[...] = block.to(dtype=torch.float32).cpu().numpy()

    return torch_product
