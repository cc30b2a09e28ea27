"""Where the engine's similarity blocks (its GEMMs and their reductions) run: numpy on the CPU,
or torch on a device.

    HUBLESS_DEVICE=cuda hubless eval ...                # the bank statistics and searches on the GPU
    nnn.fit(gallery, bank, device="cuda"); nnn.search(q, device="cuda")
    with hubless.engine.use_device("cuda", dtype="bfloat16"): ...

The default (``device=None`` and no ``HUBLESS_DEVICE``, or ``"numpy"``) never imports torch. A
torch device (``cpu``, ``cuda``, ``cuda:1``, ``mps``; several as ``"cuda:0,cuda:1"`` or a list,
which split the rows between them; one torch cannot run here is an InvalidInput naming those
available) runs the bank statistics (every
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
(``HUBLESS_TF32``): 1 lets CUDA run float32 products as TF32 (10 bits of mantissa, about 1e-3
relative error per product), 0 keeps them full float32; not set, torch's own setting holds
(see :func:`tf32_products`: torch's flag is process-wide). ``compiled`` (``HUBLESS_COMPILE=1``):
the ranking pass of ``evaluate`` / ``tune`` runs each block's per-ranking work as kernels
compiled by ``torch.compile`` (:mod:`hubless.engine.torch_fused`; off by default: compiling
takes seconds).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Iterator

import numpy as np

from hubless.errors import InvalidInput, MissingDependency, optional_import

__all__ = [
    "DTYPES",
    "DeviceName",
    "block_product",
    "checked_on_device",
    "compiled_enabled",
    "device_text",
    "resolve",
    "tf32_choice",
    "tf32_enabled",
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


#: What names a device: a string ("cuda", "cuda:0,cuda:1"), or a list of strings (several).
DeviceName = str | list[str] | tuple[str, ...] | None


def device_text(device: DeviceName) -> str | None:
    """``device`` as one string: several devices given as a list or tuple joined by commas
    (``["cuda:0", "cuda:1"]`` is ``"cuda:0,cuda:1"``); None stays None."""
    if isinstance(device, (list, tuple)):
        return ",".join(str(part) for part in device)
    return None if device is None else str(device)


@contextlib.contextmanager
def use_device(device: DeviceName, dtype: str | None = None, *, tf32: bool | None = None, compiled: bool | None = None) -> Iterator[None]:
    """Run the engine's blocks on ``device`` (one name, several joined by commas, or a list of
    names; and ``dtype``; ``tf32``: allow TF32 float32 products on CUDA, see
    :func:`tf32_products`; ``compiled``: the ranking pass's per-block work as kernels compiled
    by ``torch.compile``, see :mod:`hubless.engine.torch_fused`) inside the block; None keeps
    the surrounding setting (the environment's by default). The device is checked when the
    engine uses it (:func:`resolve`)."""
    device = device_text(device)
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


def resolve(device: DeviceName = None, dtype: str | None = None) -> tuple[str, str]:
    """(device, dtype) in effect: the arguments, else :func:`use_device`'s, else
    ``HUBLESS_DEVICE`` / ``HUBLESS_DTYPE`` (set and not empty), else ("numpy", "float32").
    Checks both: a device torch cannot run here, or an empty name, is an
    :class:`~hubless.errors.InvalidInput` naming the devices available
    (:func:`hubless._torch.resolve_device`)."""
    ctx_device, ctx_dtype = _CURRENT.get()
    device = device_text(device)
    if device is None:
        device = ctx_device if ctx_device is not None else os.environ.get("HUBLESS_DEVICE") or "numpy"
    dtype = dtype or ctx_dtype or os.environ.get("HUBLESS_DTYPE") or "float32"
    if dtype not in DTYPES:
        raise InvalidInput(f"unknown dtype {dtype!r} for the engine's products; use one of {', '.join(DTYPES)}")
    parts = [part.strip() for part in device.split(",")]
    if parts == ["numpy"]:
        if dtype != "float32":
            raise InvalidInput(f"dtype {dtype} needs a torch device (HUBLESS_DEVICE=cpu or cuda); numpy computes in float32")
        return "numpy", dtype
    if not all(parts):
        what = "names no device" if not device.strip() else "has an empty name between its commas"
        raise InvalidInput(f"device {device!r} {what}; use numpy (the default) or a torch device ({_torch_devices()})")
    if "numpy" in parts:
        raise InvalidInput(f"device {device!r}: numpy cannot be one of several devices; name torch devices only (cuda:0,cuda:1)")
    from hubless._torch import resolve_device

    optional_import("torch", f"the torch engine (device={device!r})", "models")
    # several devices ("cuda:0,cuda:1"): the torch engine splits its rows between them
    return ",".join(resolve_device(part) for part in parts), dtype


def _torch_devices() -> str:
    """The torch devices available here, for a message (without importing a missing torch)."""
    from hubless._torch import available_devices

    try:
        return "available here: " + ", ".join(available_devices())
    except MissingDependency:
        return "torch is not installed: pip install 'hubless[models]'"


def torch_device(device: DeviceName = None, dtype: str | None = None) -> tuple[str, str] | None:
    """(device, dtype) of the torch engine when a torch device is in effect, else None."""
    device, dtype = resolve(device, dtype)
    return None if device == "numpy" else (device, dtype)


@contextlib.contextmanager
def checked_on_device(device: DeviceName = None, *, when: bool = True) -> Iterator[None]:
    """Inside the block, when a single torch device is in effect with float32 products (and
    ``when``), :func:`hubless._validation.as_embeddings` computes its row norms on the device
    (:func:`hubless.engine.torch_arrays.row_norms`: finiteness, scale and normalisation follow
    from them, with the same errors and messages) instead of a host pass over every entry, and
    the uploads it makes serve the passes that follow in the block (one
    :func:`~hubless.engine.torch_arrays.resident` block; rows it normalises are normalised in
    that upload too: one upload per input). Elsewhere nothing changes."""
    on_device = torch_device(device) if when else None
    if on_device is None or "," in on_device[0] or on_device[1] != "float32":
        yield
        return
    from hubless._validation import NORMALISED, ROW_NORMS
    from hubless.engine import torch_arrays

    name = on_device[0]
    with torch_arrays.resident():
        token = ROW_NORMS.set(lambda array: torch_arrays.row_norms(array, name))
        told = NORMALISED.set(lambda measured, result, norms, off: torch_arrays.normalised(measured, result, norms, off, name))
        try:
            yield
        finally:
            NORMALISED.reset(told)
            ROW_NORMS.reset(token)


def tf32_choice() -> bool | None:
    """TF32 as the caller asked for it: :func:`use_device`'s ``tf32``, else ``HUBLESS_TF32``
    (1/true/yes/on: True; 0/false/no/off: False), else None (not asked: torch's own setting)."""
    value = _TF32.get()
    if value is not None:
        return value
    text = os.environ.get("HUBLESS_TF32", "").strip().lower()
    return True if text in _ON else False if text in _OFF else None


def tf32_enabled() -> bool:
    """Whether hubless's float32 products on CUDA are TF32: :func:`tf32_choice` when asked,
    else torch's own flag (False when torch is not loaded: torch's default)."""
    choice = tf32_choice()
    if choice is not None:
        return choice
    torch = sys.modules.get("torch")
    return False if torch is None else _read_tf32(torch)


def compiled_enabled() -> bool:
    """Whether the ranking pass compiles its per-block work (:mod:`hubless.engine.torch_fused`):
    :func:`use_device`'s ``compiled``, else ``HUBLESS_COMPILE`` (1/true/yes/on), else False."""
    return _switch(_COMPILED, "HUBLESS_COMPILE")


def _switch(chosen: contextvars.ContextVar[bool | None], variable: str) -> bool:
    """A switch of :func:`use_device` if set there, else the environment's ``variable``."""
    value = chosen.get()
    if value is not None:
        return value
    return os.environ.get(variable, "").strip().lower() in _ON


_ON, _OFF = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


class _Tf32Gate:
    """Who holds torch's TF32 flag: the passes inside :func:`tf32_products` (``holders``), the
    value they run with, the program's own value when the first entered (``own``) and what
    puts it back; ``depth``: this thread's nested passes."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.holders = 0
        self.value = self.own = False
        self.restore: Callable[[], None] | None = None
        self.local = threading.local()

    def admits(self, wanted: bool | None) -> bool:
        """Whether a pass wanting ``wanted`` (None: the program's own setting) may run now."""
        if not self.holders:
            return True
        return self.value == (self.own if wanted is None else wanted)


_TF32_GATE = _Tf32Gate()


@contextlib.contextmanager
def tf32_products(device: str) -> Iterator[None]:
    """Inside the block, float32 products on a CUDA ``device`` are TF32 as
    :func:`tf32_choice` asks, or, not asked, as the program set torch (torch's default: full
    float32); elsewhere nothing changes.

    torch's TF32 flag is process-wide (no thread or call of its own), so this is what holds:

    * not asked (the default): torch's flag is never changed; the products follow the
      program's own setting, whatever it is;
    * asked (``use_device(..., tf32=True/False)``, ``HUBLESS_TF32``) and different from the
      program's setting: torch's flag is set while hubless's passes run and put back when the
      last of them leaves. Products that other threads of the program run meanwhile see it too
      (torch offers nothing narrower), which is why it is set only when asked;
    * hubless's own passes never see another's setting: a pass waits until the passes running
      with a different setting have left (passes with the same setting, such as the threads
      of several devices, run together); a pass nested in another of its thread runs with the
      outer one's.

    torch has two APIs for the flag: the legacy ``torch.backends.cuda.matmul.allow_tf32`` and,
    from torch 2.9, ``torch.backends.cuda.matmul.fp32_precision``; once a program has used the
    new one, reading the legacy flag raises, so the new one is used then (and the legacy one
    otherwise, which leaves a program that never touched either able to read it)."""
    if not str(device).startswith("cuda"):
        yield
        return
    import torch

    gate = _TF32_GATE
    if getattr(gate.local, "depth", 0):  # nested in a pass of this thread: its setting holds
        gate.local.depth += 1
        try:
            yield
        finally:
            gate.local.depth -= 1
        return
    wanted = tf32_choice()
    with gate.changed:
        gate.changed.wait_for(lambda: gate.admits(wanted))
        if not gate.holders:
            gate.own = _read_tf32(torch)
            gate.value = gate.own if wanted is None else wanted
            if gate.value != gate.own:
                gate.restore = _set_tf32(torch.backends.cuda.matmul, gate.value)
        gate.holders += 1
    gate.local.depth = 1
    try:
        yield
    finally:
        gate.local.depth = 0
        with gate.changed:
            gate.holders -= 1
            if not gate.holders:
                restore, gate.restore = gate.restore, None
                if restore is not None:
                    restore()
                gate.changed.notify_all()


def _read_tf32(torch) -> bool:
    """Whether torch's flag makes CUDA float32 matmuls TF32 (either API)."""
    matmul = torch.backends.cuda.matmul
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:  # the program set the new API: legacy reads refuse
        precision = matmul.fp32_precision
        if precision == "none":  # follows torch's generic setting
            precision = getattr(torch.backends, "fp32_precision", "ieee")
        return precision == "tf32"


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


def block_product(cols: np.ndarray, device: DeviceName = None, dtype: str | None = None) -> Product:
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
