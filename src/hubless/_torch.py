"""Lazy access to torch and friends (encoders and rerankers), with a message that names the
extra to install."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from hubless.errors import InvalidInput, optional_import

#: Seconds to wait for the Hugging Face hub before saying a model cannot be fetched.
HUB_PROBE_SECONDS = 3.0


def require(module: str):
    """Import ``module`` or raise :class:`~hubless.errors.MissingDependency` naming the
    ``models`` extra that provides it (:func:`hubless.errors.optional_import`)."""
    return optional_import(module, "encoders and rerankers", "models")


def from_numpy(array):
    """``torch.from_numpy`` without torch's warning about read-only arrays (memory maps, the
    arrays of a loaded index): hubless never writes into the tensors it makes from them."""
    import warnings

    import torch

    if array.flags.writeable:
        return torch.from_numpy(array)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def resolve_device(device: str | None) -> str:
    """'cuda' when available and not specified, else 'cpu'; an explicit device is checked: a
    device torch cannot run here (a kind this build or machine lacks, "meta", "cuda:7" on a
    machine with fewer devices, an empty or unparsable name) is an
    :class:`~hubless.errors.InvalidInput` naming the devices that are available."""
    torch = require("torch")
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    text = str(device).strip()
    here = ", ".join(available_devices())
    if not text:
        raise InvalidInput(f"device {device!r} names no device; available here: {here}")
    try:
        parsed = torch.device(text)
    except (RuntimeError, ValueError):
        raise InvalidInput(f"unknown device {device!r}; available here: {here}") from None
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInput(f"device {device!r} requested but CUDA is not available; available here: {here}")
    if not _runs_here(torch, parsed):
        raise InvalidInput(f"device {device!r} is not available here; available here: {here}")
    return text


def available_devices() -> list[str]:
    """The torch devices hubless can compute on in this process: ``cpu``, then each CUDA
    device (``cuda:0``, ...), ``mps`` and each XPU device where this torch build and machine
    have them."""
    torch = require("torch")
    found = ["cpu"]
    if torch.cuda.is_available():
        found += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        found.append("mps")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        found += [f"xpu:{i}" for i in range(xpu.device_count())]
    return found


def _runs_here(torch, device) -> bool:
    """Whether ``device`` (a parsed ``torch.device``) is one of :func:`available_devices`
    (an index beyond the machine's devices is not; ``cpu:N`` is the CPU)."""
    if device.type == "cpu":
        return True
    kinds = {name.split(":")[0] for name in available_devices()}
    if device.type not in kinds:
        return False  # meta, hpu, ipu, ... or a kind this build or machine lacks
    if device.index is None:
        return True
    if device.type == "mps":
        return device.index == 0
    return device.index < getattr(torch, device.type).device_count()


def ensure_model_available(name_or_path: str, marker: str = "config.json") -> bool:
    """Fail in one line, before any work, when a model can be neither read locally nor fetched;
    return whether it loads without the network (``local_files_only=`` for the loaders).

    A local folder is used as it is (True). A hub name is fine when its ``marker`` file is in the
    Hugging Face cache (True: the loaders then read the cache only, no network round trip);
    otherwise, with ``HF_HUB_OFFLINE=1`` or when the hub does not answer within a few seconds,
    this raises an InvalidInput saying so (instead of the hub client's retries and tracebacks).
    The process environment is never changed.
    """
    if Path(name_or_path).exists():
        return True
    hub = require("huggingface_hub")
    try:
        cached = hub.try_to_load_from_cache(str(name_or_path), marker)
    except Exception:  # not a valid repo id: let the loader say what is wrong
        return False
    if isinstance(cached, str):
        return True
    where = f"{name_or_path!r} is not a local folder and not in the Hugging Face cache"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        raise InvalidInput(f"model {where}, and HF_HUB_OFFLINE is set: download it first or pass a local folder")
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=HUB_PROBE_SECONDS).close()
    except OSError:
        raise InvalidInput(
            f"model {where}, and the hub ({host}) cannot be reached: download it where there is network, or pass a local folder"
        ) from None
    return False


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Load a checkpoint without transformers' weight-loading bars and info warnings (a CLI
    command prints its own output; real problems are still raised as errors)."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # sentence-transformers without transformers cannot happen; be safe
        yield
        return
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
