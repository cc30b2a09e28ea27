"""Arrays of the torch engine on the device: uploads, block sizes, banks streamed from host
memory, and the split of rows between several devices.

The device-resident torch engine (:mod:`hubless.engine.torch_passes` for the statistics and
searches, :mod:`hubless.engine.torch_ranking` for the evaluation's ranking pass, their reducers
in :mod:`hubless.engine.torch_reducers`) runs whenever a torch device is in effect
(``device="cuda"`` / ``"cpu"`` on ``fit`` and ``search``, :func:`hubless.engine.use_device`,
``HUBLESS_DEVICE``; see :mod:`hubless.engine.device`). This module places its arrays:

* :func:`put`: a host array on the device, uploaded once per :func:`resident` block (a fit
  reads the gallery in up to four passes) or kept across calls when nobody can change it in
  place (a read-only gallery or a fitted correction's biases, at most :data:`KEPT_ARRAYS`
  arrays); :func:`to_host` copies results back;
* :func:`block_shape`: blocks of :data:`BLOCK_ELEMENTS` similarities at most (512 MiB of float32
  on a GPU, fewer when the device has less free memory), as wide as the column side allows;
* :class:`Streamed`: a bank larger than half the CUDA device's free memory (:func:`streams`) is
  not uploaded whole: its blocks are copied in one after another through two pinned staging
  buffers, each copy on a side stream overlapping the work on the previous block (events order
  the reuse of each buffer), so one GPU handles a bank of any size (the gallery must fit);
* :func:`device_parts` / :func:`on_parts`: several devices (``"cuda:0,cuda:1"``) split the rows
  between them, one thread each, with the caller's context (TF32 setting, uploads) and each
  thread's current CUDA device set to its own.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from hubless._torch import from_numpy
from hubless.errors import optional_import

__all__ = [
    "BLOCK_ELEMENTS",
    "BLOCK_SHAPE",
    "KEPT_ARRAYS",
    "MAX_COL_BLOCK",
    "STREAM_BANKS",
    "STREAM_FRACTION",
    "Streamed",
    "block_shape",
    "device_parts",
    "mean",
    "normalised",
    "on_parts",
    "put",
    "resident",
    "row_norms",
    "streams",
    "to_host",
    "torch_module",
    "torch_namespace",
    "unchangeable",
]

#: Similarities per block on a CUDA device (2^27 float32 = 512 MiB) and on any other device.
BLOCK_ELEMENTS = {"cuda": 2**27, "other": 2**22}
#: The widest column block (a block spans the whole column side up to this).
MAX_COL_BLOCK = 2**18
#: (rows, columns) of every block instead of the sizes above (tests cut uneven blocks with it).
BLOCK_SHAPE: tuple[int, int] | None = None
#: Arrays kept on the device between calls (the galleries and biases of fitted corrections).
KEPT_ARRAYS = 4
#: Stream the bank from host memory instead of uploading it whole: None decides by the CUDA
#: device's free memory (a bank above :data:`STREAM_FRACTION` of it is streamed; other devices
#: never stream), True / False force it (the tests stream on CPU torch).
STREAM_BANKS: bool | None = None
STREAM_FRACTION = 0.5
#: Float32 blocks a pass may hold at once on a CUDA device (the block, its reducers' scratch,
#: two streamed column blocks): a block is at most 1 / this of the free memory.
BLOCKS_IN_FLIGHT = 8

_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("hubless_resident", default=None)
_KEPT: collections.OrderedDict[tuple, tuple[Any, Any]] = collections.OrderedDict()
_KEPT_LOCK = threading.RLock()  # reentrant: a finalizer may run inside (a garbage collection)
_TORCH: list[Any] = []  # the torch module, once imported


def torch_module():
    """The torch module, or :class:`~hubless.errors.MissingDependency` naming the extra."""
    if not _TORCH:
        _TORCH.append(optional_import("torch", "the torch engine (a torch device)", "models"))
    return _TORCH[0]


def torch_namespace() -> types.SimpleNamespace:
    """The array namespace of :mod:`hubless.engine.formulas` on torch tensors."""
    torch = torch_module()
    return types.SimpleNamespace(
        multiply=lambda a, factor, out: torch.mul(a, factor, out=out),
        maximum=lambda a, low, out: torch.clamp(a, min=low, out=out),
        exp=lambda a, out=None: torch.exp(a, out=out),
        exp2=lambda a, out=None: torch.exp2(a, out=out),
        expm1=lambda a, out=None: torch.expm1(a, out=out),
        log=torch.log,
        row_sum=lambda a: a.sum(dim=1),
        row_sum64=lambda a: a.sum(dim=1, dtype=torch.float64),
    )


# ---------------------------------------------------------------------- arrays on the device
@contextlib.contextmanager
def resident() -> Iterator[None]:
    """Inside the block, each array is uploaded once per (device, dtype) however often it is
    used (a fit reads the gallery in up to four passes). Nested blocks share the outer one."""
    if _SCOPE.get() is not None:
        yield
        return
    scope = _Scope()
    token = _SCOPE.set(scope)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        for finalizer in scope.finalizers:  # the arrays outlive the block: they no longer hold it
            finalizer.detach()
        scope.clear()


class _Scope(dict):
    """The uploads of one :func:`resident` block: (id, device, dtype) -> (weak reference to the
    host array, device tensor), and the finalizers that drop an entry when its array goes."""

    def __init__(self) -> None:
        super().__init__()
        self.finalizers: list[weakref.finalize] = []


def put(array: np.ndarray, device: str, dtype: str, *, keep: bool = False):
    """``array`` on ``device`` as ``dtype``: uploaded, or the copy made earlier in this
    :func:`resident` block, or (``keep``) the copy kept across calls for this very array object
    (the gallery and biases of a fitted correction).

    A copy is kept across calls only for an array nobody can change in place
    (:func:`unchangeable`: it and every array it views are read-only), checked again at each
    use: a writeable array, which its owner may change between two calls, is uploaded once per
    call (per :func:`resident` block), so a device never serves a stale copy. An array made
    writeable again loses its kept copy at its next use."""
    torch = torch_module()
    key = (id(array), device, dtype)
    scope = _SCOPE.get()
    if scope is not None and key in scope and scope[key][0]() is array:
        return scope[key][1]
    keep = keep and unchangeable(array)
    with _KEPT_LOCK:
        kept = _KEPT.get(key)
        if kept is not None and kept[0]() is array:
            if keep:
                _KEPT.move_to_end(key)
                return kept[1]
            del _KEPT[key]  # made writeable since: its copy may be stale
    tensor = from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=getattr(torch, dtype))
    ref = weakref.ref(array)
    if scope is not None:
        _remember(scope, key, ref, tensor)
    if keep:
        with _KEPT_LOCK:
            _KEPT[key] = (ref, tensor)
            while len(_KEPT) > KEPT_ARRAYS:
                _KEPT.popitem(last=False)
        weakref.finalize(array, _forget, key, ref)
    return tensor


def unchangeable(array: np.ndarray) -> bool:
    """Whether numpy refuses every write to ``array``'s memory through it and the arrays it
    views: it and each base are read-only (a read-only memory map, a loaded index's arrays, a
    fitted correction's own arrays). Only a deliberate ``flags.writeable = True`` on the array
    that owns the memory could change it then, which the next :func:`put` sees."""
    seen: object = array
    while isinstance(seen, np.ndarray):
        if seen.flags.writeable:
            return False
        seen = seen.base
    if seen is None:
        return True
    try:  # the memory's owner is not an array (a memory map, bytes): read-only if its buffer is
        return memoryview(seen).readonly  # type: ignore[arg-type]
    except TypeError:
        return False


def _remember(scope: _Scope, key: tuple, ref, tensor) -> None:
    """``tensor`` as the upload of the array ``ref`` names in a :func:`resident` block."""
    scope[key] = (ref, tensor)
    array = ref()
    # a view made for one call (a device's share of the rows) frees its copy when it goes
    scope.finalizers.append(weakref.finalize(array, _forget, key, ref, scope))


def normalised(raw: np.ndarray, result: np.ndarray, norms: np.ndarray, off: np.ndarray, device: str) -> None:
    """After :func:`hubless._validation.as_embeddings` has divided the rows ``off`` of ``raw``
    by their ``norms`` into ``result`` (a copy, or ``raw`` itself), the upload of ``raw`` made
    for the check (:func:`row_norms`) becomes the upload of ``result``: one upload per input,
    never a raw copy and a normalised one both resident.

    A real device copy is divided on the device as the host divided (float64 division of the
    float32 entries, rounded to float32: bitwise the host's rows), by row blocks of one block
    budget; a tensor that is the host memory itself (CPU torch) already holds what the host
    wrote, or, for a copy, is replaced by a view of ``result``."""
    scope = _SCOPE.get()
    key = (id(raw), device, "float32")
    if scope is None or key not in scope or scope[key][0]() is not raw:
        return
    torch = torch_module()
    tensor = scope.pop(key)[1]
    if tensor.device.type == "cpu" and tensor.data_ptr() == raw.__array_interface__["data"][0]:
        tensor = from_numpy(result)  # the host memory itself: no copy to correct
    else:
        rows = np.flatnonzero(off)
        step = max(1, block_budget(device) // max(1, raw.shape[1]))
        for r0 in range(0, len(rows), step):
            at = from_numpy(rows[r0 : r0 + step]).to(tensor.device)
            scale = from_numpy(np.ascontiguousarray(norms[rows[r0 : r0 + step]], dtype=np.float64)).to(tensor.device)
            tensor[at] = (tensor[at].double() / scale[:, None]).to(torch.float32)
    _remember(scope, (id(result), device, "float32"), weakref.ref(result), tensor)


def _forget(key: tuple, ref, cache: dict | None = None) -> None:
    with _KEPT_LOCK:
        cache = _KEPT if cache is None else cache
        if key in cache and cache[key][0] is ref:
            del cache[key]


def to_host(tensor) -> np.ndarray:
    """A host copy (never a view of a device or reused buffer; waits for the device)."""
    return tensor.detach().to("cpu", copy=True).numpy()


def mean(array: np.ndarray, device: str, dtype: str) -> np.ndarray:
    """The float64 mean of the rows, on the device (the uploaded float32 copy, summed in float64
    by row blocks of one block budget: no float64 copy of the whole array) or, for half
    precision products, on the host (the half copy would lose digits)."""
    device = device.split(",")[0]
    if dtype != "float32" or not len(array) or streams(array, device, dtype):
        return array.mean(axis=0, dtype=np.float64) if len(array) else np.zeros(array.shape[1])
    torch = torch_module()
    on_device = put(array, device, dtype)
    rows = max(1, block_budget(device) // max(1, array.shape[1]))
    total = torch.zeros(array.shape[1], dtype=torch.float64, device=on_device.device)
    for r0 in range(0, len(array), rows):
        total += on_device[r0 : r0 + rows].sum(dim=0, dtype=torch.float64)
    return to_host(total / len(array))


def row_norms(array: np.ndarray, device: str) -> np.ndarray:
    """The float64 norm of every row of a float32 ``array``, computed on ``device`` from its
    upload (kept in the :func:`resident` block for the passes that follow), in row blocks of one
    block budget; one sync brings the n norms back. A norm is finite exactly when its row is:
    :func:`hubless._validation.as_embeddings` checks the input with these norms. A bank that
    would be streamed (:func:`streams`: larger than the device) is measured on the host."""
    if streams(array, device, "float32"):
        return np.sqrt(np.einsum("ij,ij->i", array, array, dtype=np.float64))
    torch = torch_module()
    on_device = put(array, device, "float32")
    rows = max(1, block_budget(device) // max(1, array.shape[1]))
    squares = torch.empty(len(array), dtype=torch.float64, device=on_device.device)
    for r0 in range(0, len(array), rows):
        part = on_device[r0 : r0 + rows].double()
        squares[r0 : r0 + rows] = (part * part).sum(dim=1)
    return np.sqrt(to_host(squares))


# ---------------------------------------------------------------------- blocks
def _free_bytes(device: str) -> int | None:
    """Memory of a CUDA device this process can still use (bytes): the driver's free memory
    plus what torch's caching allocator holds with no tensor in it (after a few passes the
    cache holds their blocks, which the driver counts as used); None on other devices."""
    if not device.startswith("cuda"):
        return None
    torch = torch_module()
    dev = torch.device(device)
    cached = int(torch.cuda.memory_reserved(dev)) - int(torch.cuda.memory_allocated(dev))
    return int(torch.cuda.mem_get_info(dev)[0]) + max(0, cached)


def block_shape(n_rows: int, n_cols: int, device: str) -> tuple[int, int]:
    """(rows, columns) of one block: as wide as the columns allow, within the device's budget
    (:data:`BLOCK_ELEMENTS`, and on CUDA at most 1 / :data:`BLOCKS_IN_FLIGHT` of the free memory)."""
    if BLOCK_SHAPE is not None:
        return BLOCK_SHAPE
    budget = block_budget(device)
    cols = max(1, min(n_cols, MAX_COL_BLOCK, budget // 64))
    return max(1, min(n_rows, budget // cols)), cols


def block_budget(device: str) -> int:
    """Similarities per block on ``device``."""
    if not device.startswith("cuda"):
        return BLOCK_ELEMENTS["other"]
    free = _free_bytes(device) or 0
    return max(2**16, min(BLOCK_ELEMENTS["cuda"], free // (4 * BLOCKS_IN_FLIGHT)))


# ---------------------------------------------------------------------- banks larger than the device
def streams(array: np.ndarray, device: str, dtype: str) -> bool:
    """Whether ``array`` (a bank) is streamed from host memory rather than uploaded whole: see
    :data:`STREAM_BANKS`."""
    if STREAM_BANKS is not None:
        return STREAM_BANKS
    free = _free_bytes(device)
    if free is None:
        return False
    torch = torch_module()
    return array.nbytes * getattr(torch, dtype).itemsize / 4 > STREAM_FRACTION * free


class Streamed:
    """Blocks of rows of a host array copied to the device one after another: each block goes
    through one of two staging buffers (pinned host memory on CUDA), and on CUDA its copy runs
    on a side stream while the device computes on the previous block. Memory on the device: two
    blocks, whatever the array's size.

    The order on CUDA, for staging slot s (blocks i and i + 2 share it): the host writes the
    pinned buffer only after the event ``copied[s]`` of block i's copy has completed (the copy
    read it); block i + 2's copy waits on the side stream for ``used[s]``, recorded on the
    consumer's stream once block i's work has been queued (the kernels read the device buffer);
    the consumer's stream waits for ``copied[s]`` before block i + 2's work. A generator left
    early makes the consumer's stream wait for the copies in flight, so no copy writes into
    memory the allocator has handed out again."""

    def __init__(self, array: np.ndarray, device: str, dtype: str, block: int) -> None:
        torch = torch_module()
        # a staging block holds at most one block budget of floats, whatever the dimension
        block = min(block, max(1, block_budget(device) // max(1, array.shape[1])))
        self.array, self.kind, self.block = array, getattr(torch, dtype), max(1, min(block, len(array)))
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        shape = (self.block, array.shape[1])
        self.host = [torch.empty(shape, dtype=torch.float32, pin_memory=self.cuda) for _ in range(2)]
        self.dev = [torch.empty(shape, dtype=torch.float32, device=self.device) for _ in range(2)]
        if self.cuda:
            self.stream = torch.cuda.Stream(self.device)
            self.copied = [torch.cuda.Event() for _ in range(2)]
            self.used = [torch.cuda.Event() for _ in range(2)]

    def __len__(self) -> int:
        return len(self.array)

    def _issue(self, i: int, c0: int, c1: int) -> None:
        torch = torch_module()
        slot, width = i % 2, c1 - c0
        if self.cuda:
            self.copied[slot].synchronize()  # the last copy out of this staging buffer is done
        self.host[slot][:width].copy_(from_numpy(np.ascontiguousarray(self.array[c0:c1], dtype=np.float32)))
        if self.cuda:
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(self.used[slot])  # the device is done with this buffer
                self.dev[slot][:width].copy_(self.host[slot][:width], non_blocking=True)
                self.copied[slot].record(self.stream)
        else:
            self.dev[slot][:width].copy_(self.host[slot][:width])

    def blocks(self) -> Iterator[tuple[int, int, Any]]:
        """(start, stop, the rows start:stop on the device), the next block's copy in flight.
        The consumer queues its work on the device's current stream before asking for the
        next block."""
        torch = torch_module()
        bounds = [(c0, min(len(self.array), c0 + self.block)) for c0 in range(0, len(self.array), self.block)]
        consumer = torch.cuda.current_stream(self.device) if self.cuda else None
        try:
            if bounds:
                self._issue(0, *bounds[0])
            for i, (c0, c1) in enumerate(bounds):
                if i + 1 < len(bounds):
                    self._issue(i + 1, *bounds[i + 1])
                slot = i % 2
                if consumer is not None:
                    consumer.wait_event(self.copied[slot])
                on_device = self.dev[slot][: c1 - c0]
                yield c0, c1, on_device if self.kind == torch.float32 else on_device.to(self.kind)
                if consumer is not None:
                    self.used[slot].record(consumer)
        finally:
            if consumer is not None:
                consumer.wait_stream(self.stream)  # no copy outlives the buffers it writes


# ---------------------------------------------------------------------- several devices
def device_parts(device: str, n: int) -> list[tuple[str, int, int]] | None:
    """(device, start, stop) of each device's contiguous share of ``n`` rows when ``device``
    names several ("cuda:0,cuda:1"), else None."""
    devices = device.split(",")
    if len(devices) == 1:
        return None
    bounds = np.linspace(0, n, len(devices) + 1).astype(np.int64)
    return [(d, int(a), int(b)) for d, a, b in zip(devices, bounds[:-1], bounds[1:])]


def on_parts(parts: list[tuple[str, int, int]], work: Callable[[str, int, int], Any]) -> list[Any]:
    """``work(device, start, stop)`` for every part, each device in its own thread (with this
    thread's context: the TF32 setting, the uploads of a :func:`resident` block), the thread's
    current CUDA device set to its part's (streams and events that name no device use it)."""
    from concurrent.futures import ThreadPoolExecutor

    def run(dev: str, a: int, b: int):
        if dev.startswith("cuda"):
            torch = torch_module()
            with torch.cuda.device(torch.device(dev)):
                return work(dev, a, b)
        return work(dev, a, b)

    with ThreadPoolExecutor(len(parts)) as pool:
        futures = [pool.submit(contextvars.copy_context().run, run, d, a, b) for d, a, b in parts]
        return [f.result() for f in futures]
