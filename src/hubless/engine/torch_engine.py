"""The device-resident torch engine: every block's product AND its reduction on the device.

Used whenever a torch device is in effect (``device="cuda"`` / ``"cpu"`` on ``fit`` and
``search``, :func:`hubless.engine.use_device`, ``HUBLESS_DEVICE``; see
:mod:`hubless.engine.device`). The column side (a bank, or the gallery of a search) and the row
side are uploaded once, every similarity block ``rows @ cols.T`` is computed and reduced on the
device, and only the per-row results (n x small: top-k values, log-sum-exp sums, activation
sets, the (scores, ids) of a search) come back to host memory. The numpy engine
(:mod:`hubless.engine.stream`) stays the default and never imports this module.

The reductions are the numpy engine's, with the same semantics:

* top-k values (NNN, CSLS): the k largest similarities of each row, descending;
* top-k with ids (the activation sets of DIS / DualDIS, searches): ordered by (value descending,
  id ascending), so ties go to the lower id as in :class:`hubless.engine.stream.TopK`;
* log-sum-exp at several betas (IS, DIS, DualIS, DualDIS): the formulas of
  :mod:`hubless.engine.formulas` (the same code as the numpy engine, run on torch tensors), around
  the running row maximum (the numpy engine refreshes its shift only when a term would overflow,
  a pass saved on a CPU; on a device the maximum costs less than the host sync the check needs);
* sorted probe rows (GC), the nearest row of every column (bank coverage), the means (DN).

Blocks are :data:`BLOCK_ELEMENTS` similarities at most (512 MiB of float32 on a GPU), as wide as
the column side allows. A bank larger than half the CUDA device's free memory
(:data:`STREAM_BANKS`) is not uploaded whole: its blocks are copied in one after another through
pinned staging buffers, each copy on a side stream overlapping the work on the previous block
(:class:`_Streamed`), so one GPU handles a bank of any size (the gallery must fit). Several
devices (``"cuda:0,cuda:1"``) split the rows between them, one thread each. Products in float16
/ bfloat16 (``dtype=``) are reduced in float32. TF32 products stay off unless asked for
(:func:`hubless.engine.device.use_device` ``tf32=True`` or ``HUBLESS_TF32=1``; CUDA only).

Also here: the ranking pass of the evaluation (:func:`rank_queries`) and the score-matrix bank
pass (:func:`score_bank_pass`).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from hubless._torch import from_numpy
from hubless.engine.device import tf32_products
from hubless.engine.formulas import LseTerm, lse_add, lse_finish, lse_recentre, lse_terms
from hubless.errors import optional_import

__all__ = [
    "BLOCK_ELEMENTS",
    "exact_search",
    "from_numpy",
    "mean",
    "nearest_gallery_items",
    "rank_queries",
    "resident",
    "row_statistics",
    "score_bank_pass",
    "streams",
    "torch_namespace",
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

_SCOPE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("hubless_resident", default=None)
_KEPT: collections.OrderedDict[tuple, tuple[Any, Any]] = collections.OrderedDict()
_KEPT_LOCK = threading.RLock()  # reentrant: a finalizer may run inside (a garbage collection)


_TORCH: list[Any] = []  # the torch module, once imported


def _torch():
    if not _TORCH:
        _TORCH.append(optional_import("torch", "the torch engine (a torch device)", "models"))
    return _TORCH[0]


def torch_namespace() -> types.SimpleNamespace:
    """The array namespace of :mod:`hubless.engine.formulas` on torch tensors."""
    torch = _torch()
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
    token = _SCOPE.set({})
    try:
        yield
    finally:
        _SCOPE.reset(token)


def _put(array: np.ndarray, device: str, dtype: str, *, keep: bool = False):
    """``array`` on ``device`` as ``dtype``: uploaded, or the copy made earlier in this
    :func:`resident` block, or (``keep``) the copy kept for this very array object across calls
    (the gallery of a fitted correction: arrays it holds are never modified in place)."""
    torch = _torch()
    key = (id(array), device, dtype)
    scope = _SCOPE.get()
    for cache in (scope, _KEPT if keep else None):
        if cache is not None and key in cache and cache[key][0]() is array:
            return cache[key][1]
    tensor = from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=getattr(torch, dtype))
    ref = weakref.ref(array)
    if scope is not None:
        scope[key] = (ref, tensor)
    if keep:
        with _KEPT_LOCK:
            _KEPT[key] = (ref, tensor)
            while len(_KEPT) > KEPT_ARRAYS:
                _KEPT.popitem(last=False)
        weakref.finalize(array, _forget, key, ref)
    return tensor


def _forget(key: tuple, ref) -> None:
    with _KEPT_LOCK:
        if key in _KEPT and _KEPT[key][0] is ref:
            del _KEPT[key]


def _host(tensor) -> np.ndarray:
    """A host copy (never a view of a device or reused buffer)."""
    return tensor.detach().to("cpu", copy=True).numpy()


def mean(array: np.ndarray, device: str, dtype: str) -> np.ndarray:
    """The float64 mean of the rows, on the device (the uploaded float32 copy) or, for half
    precision products, on the host (the half copy would lose digits)."""
    device = device.split(",")[0]
    if dtype != "float32" or not len(array) or streams(array, device, dtype):
        return array.mean(axis=0, dtype=np.float64) if len(array) else np.zeros(array.shape[1])
    torch = _torch()
    return _host(_put(array, device, dtype).mean(dim=0, dtype=torch.float64))


# ---------------------------------------------------------------------- banks larger than the device
def streams(array: np.ndarray, device: str, dtype: str) -> bool:
    """Whether ``array`` (a bank) is streamed from host memory rather than uploaded whole: see
    :data:`STREAM_BANKS`."""
    if STREAM_BANKS is not None:
        return STREAM_BANKS
    if not device.startswith("cuda"):
        return False
    torch = _torch()
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return array.nbytes * getattr(torch, dtype).itemsize / 4 > STREAM_FRACTION * free


class _Streamed:
    """Blocks of rows of a host array copied to the device one after another: each block goes
    through one of two staging buffers (pinned host memory on CUDA), and on CUDA its copy runs
    on a side stream while the device computes on the previous block (events order the reuse of
    each buffer). Memory on the device: two blocks, whatever the array's size."""

    def __init__(self, array: np.ndarray, device: str, dtype: str, block: int) -> None:
        torch = _torch()
        self.array, self.kind, self.block = array, getattr(torch, dtype), max(1, min(block, len(array)))
        self.cuda = device.startswith("cuda")
        shape = (self.block, array.shape[1])
        self.host = [torch.empty(shape, dtype=torch.float32, pin_memory=self.cuda) for _ in range(2)]
        self.dev = [torch.empty(shape, dtype=torch.float32, device=device) for _ in range(2)]
        if self.cuda:
            self.stream = torch.cuda.Stream(torch.device(device))
            self.copied = [torch.cuda.Event() for _ in range(2)]
            self.used = [torch.cuda.Event() for _ in range(2)]

    def __len__(self) -> int:
        return len(self.array)

    def _issue(self, i: int, c0: int, c1: int) -> None:
        torch = _torch()
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
        """(start, stop, the rows start:stop on the device), the next block's copy in flight."""
        torch = _torch()
        bounds = [(c0, min(len(self.array), c0 + self.block)) for c0 in range(0, len(self.array), self.block)]
        if bounds:
            self._issue(0, *bounds[0])
        for i, (c0, c1) in enumerate(bounds):
            if i + 1 < len(bounds):
                self._issue(i + 1, *bounds[i + 1])
            slot = i % 2
            if self.cuda:
                torch.cuda.current_stream().wait_event(self.copied[slot])
            on_device = self.dev[slot][: c1 - c0]
            yield c0, c1, on_device if self.kind == torch.float32 else on_device.to(self.kind)
            if self.cuda:
                self.used[slot].record(torch.cuda.current_stream())


# ---------------------------------------------------------------------- blocks
def block_shape(n_rows: int, n_cols: int, device: str) -> tuple[int, int]:
    """(rows, columns) of one block: as wide as the columns allow, within the device's budget."""
    if BLOCK_SHAPE is not None:
        return BLOCK_SHAPE
    budget = BLOCK_ELEMENTS["cuda" if device.startswith("cuda") else "other"]
    cols = max(1, min(n_cols, MAX_COL_BLOCK, budget // 64))
    return max(1, min(n_rows, budget // cols)), cols


class _State:
    """One reducer over one row block (rows r0:r1) on the device."""

    def update(self, block, c0: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def _stream(rows, cols, makers: Sequence[Callable[[int, int], _State]], device: str, transform=None) -> None:
    """Feed every block of ``rows @ cols.T`` (device tensors) to new states of ``makers`` per
    row block; ``transform(block, r0, r1, c0, c1)`` may rewrite a block in place first.

    ``cols`` may be a :class:`_Streamed` host array (a bank larger than the device): then each
    column block is copied in once and meets every row block (the states of all row blocks
    live through the pass: they are n x small)."""
    torch = _torch()
    n, m = rows.shape[0], len(cols)
    rb, cb = block_shape(n, m, device)
    if isinstance(cols, _Streamed):
        with torch.no_grad(), tf32_products(device):
            row_bounds = [(r0, min(n, r0 + rb)) for r0 in range(0, n, rb)]
            per_row_block = [[make(r0, r1) for make in makers] for r0, r1 in row_bounds]
            for c0, c1, column_block in cols.blocks():
                for (r0, r1), row_states in zip(row_bounds, per_row_block):
                    block = rows[r0:r1] @ column_block.T
                    if block.dtype != torch.float32:
                        block = block.float()
                    if transform is not None:
                        transform(block, r0, r1, c0, c1)
                    for row_state in row_states:
                        row_state.update(block, c0)
            for row_states in per_row_block:
                for row_state in row_states:
                    row_state.finish()
        return
    with torch.no_grad(), tf32_products(device):
        for r0 in range(0, n, rb):
            r1 = min(n, r0 + rb)
            states = [make(r0, r1) for make in makers]
            block_rows = rows[r0:r1]
            for c0 in range(0, m, cb):
                c1 = min(m, c0 + cb)
                block = block_rows @ cols[c0:c1].T
                if block.dtype != torch.float32:
                    block = block.float()
                if transform is not None:
                    transform(block, r0, r1, c0, c1)
                for state in states:
                    state.update(block, c0)
            for state in states:
                state.finish()


# ---------------------------------------------------------------------- reducers
class _TopKValues(_State):
    """The k largest values of each row (sorted descending at the end), into ``out[r0:r1]``."""

    def __init__(self, out, r0: int, r1: int, k: int, initial=None) -> None:
        torch = _torch()
        self.out, self.r0, self.r1, self.k = out, r0, r1, k
        if initial is None:
            self.values = torch.full((r1 - r0, k), -torch.inf, dtype=torch.float32, device=out.device)
        else:
            self.values = initial[r0:r1].clone()

    def update(self, block, c0: int) -> None:
        torch = _torch()
        new = torch.topk(block, min(self.k, block.shape[1]), dim=1, sorted=False).values
        self.values = torch.topk(torch.cat([self.values, new], dim=1), self.k, dim=1, sorted=False).values

    def finish(self) -> None:
        self.out[self.r0 : self.r1] = self.values.sort(dim=1, descending=True).values


def _ordered_topk(block, k: int):
    """(values, column ids) of each row's ``k`` largest entries of ``block``, ordered by value
    descending then id ascending: ties go to the lower id, also at the k-th place (rows whose
    k-th value is tied beyond the k-th place are taken from a stable sort)."""
    torch = _torch()
    # the (k+1)-th largest equals the k-th exactly when a tie straddles the k-th place
    values, ids = torch.topk(block, min(k + 1, block.shape[1]), dim=1)
    tied = values[:, k] == values[:, k - 1] if values.shape[1] > k else torch.zeros(len(block), dtype=torch.bool, device=block.device)
    values, ids = values[:, :k], ids[:, :k]
    if bool(tied.any()):
        rows = tied.nonzero().squeeze(1)
        sorted_values, sorted_ids = torch.sort(block[rows], dim=1, descending=True, stable=True)
        values[rows], ids[rows] = sorted_values[:, :k], sorted_ids[:, :k]
    ids, order = torch.sort(ids, dim=1)
    values = values.gather(1, order)
    values, order = torch.sort(values, dim=1, descending=True, stable=True)
    return values, ids.gather(1, order)


class _TopKIds(_State):
    """The k best (value, id) of each row, by (value descending, id ascending), into
    ``values[r0:r1]`` and ``ids[r0:r1]``. Column blocks arrive in increasing id order and an
    initial top-k holds lower ids, so a stable merge keeps ties at the lower id."""

    def __init__(self, values, ids, r0: int, r1: int, k: int, offset: int, initial=None) -> None:
        torch = _torch()
        self.out_values, self.out_ids, self.r0, self.r1, self.k, self.offset = values, ids, r0, r1, k, offset
        if initial is None:
            self.values = torch.full((r1 - r0, k), -torch.inf, dtype=torch.float32, device=values.device)
            self.ids = torch.full((r1 - r0, k), np.iinfo(np.int64).max, dtype=torch.int64, device=values.device)
        else:
            self.values, self.ids = initial[0][r0:r1].clone(), initial[1][r0:r1].clone()

    def update(self, block, c0: int) -> None:
        torch = _torch()
        values, ids = _ordered_topk(block, min(self.k, block.shape[1]))
        values = torch.cat([self.values, values], dim=1)
        ids = torch.cat([self.ids, ids + (c0 + self.offset)], dim=1)
        values, order = torch.sort(values, dim=1, descending=True, stable=True)
        self.values, self.ids = values[:, : self.k], ids.gather(1, order[:, : self.k])

    def finish(self) -> None:
        self.out_values[self.r0 : self.r1] = self.values
        self.out_ids[self.r0 : self.r1] = self.ids


class _LogSumExp(_State):
    """log sum_j exp(beta s_ij) per beta (the formulas of :mod:`hubless.engine.formulas`), into
    ``out[r0:r1]`` (float64)."""

    def __init__(self, out, r0: int, r1: int, betas: list[float], terms: list[LseTerm], xp) -> None:
        torch = _torch()
        self.out, self.r0, self.r1, self.betas, self.terms, self.xp = out, r0, r1, betas, terms, xp
        self.peak = torch.full((r1 - r0,), -torch.inf, dtype=torch.float64, device=out.device)
        self.sums = torch.zeros((r1 - r0, len(betas)), dtype=torch.float64, device=out.device)
        self.count = 0

    def update(self, block, c0: int) -> None:
        torch = _torch()
        if self.terms:
            new = torch.maximum(self.peak, block.max(dim=1).values.double())
            diff = block - new.float()[:, None]  # s - m, formed before scaling
            x = torch.empty_like(diff)
            for term in self.terms:
                added = lse_add(self.xp, diff, term, x)
                col = term.column
                self.sums[:, col] = lse_recentre(self.xp, self.sums[:, col], added, term, self.peak, new, self.count)
            self.peak = new
        self.count += block.shape[1]

    def finish(self) -> None:
        by_column = {term.column: term for term in self.terms}
        for t in range(len(self.betas)):
            self.out[self.r0 : self.r1, t] = lse_finish(self.xp, by_column.get(t), self.peak, self.sums[:, t], self.count)


class _SortedRows(_State):
    """Every similarity of each row, sorted ascending, into ``out[r0:r1]`` (host)."""

    def __init__(self, out: np.ndarray, r0: int, r1: int, n_cols: int, device) -> None:
        torch = _torch()
        self.out, self.r0, self.r1 = out, r0, r1
        self.rows = torch.empty((r1 - r0, n_cols), dtype=torch.float32, device=device)

    def update(self, block, c0: int) -> None:
        self.rows[:, c0 : c0 + block.shape[1]] = block

    def finish(self) -> None:
        self.out[self.r0 : self.r1] = _host(self.rows.sort(dim=1).values)


class _ColumnNearest(_State):
    """The nearest row of every column (ties: the lower row) over all row blocks, in
    ``values`` / ``ids`` (device tensors); row blocks arrive in order, so only a strictly larger
    value replaces the best so far."""

    def __init__(self, values, ids, r0: int) -> None:
        self.values, self.ids, self.r0 = values, ids, r0

    def update(self, block, c0: int) -> None:
        best, rows = block.max(dim=0)  # the first maximal row of each column
        c1 = c0 + block.shape[1]
        better = best > self.values[c0:c1]
        self.values[c0:c1] = self.values[c0:c1].where(~better, best)
        self.ids[c0:c1] = self.ids[c0:c1].where(~better, rows + self.r0)

    def finish(self) -> None:
        pass


# ---------------------------------------------------------------------- several devices
def _parts(device: str, n: int) -> list[tuple[str, int, int]] | None:
    """(device, start, stop) of each device's contiguous share of ``n`` rows when ``device``
    names several ("cuda:0,cuda:1"), else None."""
    devices = device.split(",")
    if len(devices) == 1:
        return None
    bounds = np.linspace(0, n, len(devices) + 1).astype(np.int64)
    return [(d, int(a), int(b)) for d, a, b in zip(devices, bounds[:-1], bounds[1:])]


def _on_parts(parts: list[tuple[str, int, int]], work: Callable[[str, int, int], Any]) -> list[Any]:
    """``work(device, start, stop)`` for every part, each device in its own thread (with this
    thread's context: the TF32 setting, the uploads of a :func:`resident` block)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(parts)) as pool:
        futures = [pool.submit(contextvars.copy_context().run, work, d, a, b) for d, a, b in parts]
        return [f.result() for f in futures]


# ---------------------------------------------------------------------- passes
def row_statistics(
    gallery: np.ndarray,
    bank: np.ndarray,
    *,
    k: int,
    betas: list[float],
    probes: bool,
    nearest: bool,
    initial_topk: np.ndarray | None,
    device: str,
    dtype: str,
) -> tuple[np.ndarray | None, dict[float, np.ndarray], np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
    """What :func:`hubless.engine.statistics.row_statistics` computes, on the device: (top-k
    values, {beta: log-sum-exp}, sorted probes, (scores, ids) of each bank item's nearest gallery
    item). Several devices split the gallery rows (the nearest rows are merged: ties to the
    lower row)."""
    parts = _parts(device, gallery.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            initial = None if initial_topk is None else initial_topk[a:b]
            return row_statistics(
                gallery[a:b], bank, k=k, betas=betas, probes=probes, nearest=nearest, initial_topk=initial, device=dev, dtype=dtype
            )

        results = _on_parts(parts, part)
        near = None
        if nearest:
            values, ids = np.full(len(bank), -np.inf, np.float32), np.full(len(bank), np.iinfo(np.int64).max, np.int64)
            for (_, a, _), result in zip(parts, results):
                better = result[3][0] > values  # parts in row order: a tie keeps the lower row
                values[better], ids[better] = result[3][0][better], result[3][1][better] + a
            near = (values, ids)
        return (
            None if not k else np.concatenate([r[0] for r in results]),
            {b: np.concatenate([r[1][b] for r in results]) for b in betas},
            None if not probes else np.concatenate([r[2] for r in results]),
            near,
        )
    torch = _torch()
    n, m = gallery.shape[0], bank.shape[0]
    dev = torch.device(device)
    rows = _put(gallery, device, dtype)
    cols = _Streamed(bank, device, dtype, block_shape(n, m, device)[1]) if m and streams(bank, device, dtype) else _put(bank, device, dtype)
    makers: list[Callable[[int, int], _State]] = []
    topk = lse = probe_rows = None
    if k:
        topk = torch.empty((n, k), dtype=torch.float32, device=dev)
        initial = None if initial_topk is None else from_numpy(np.ascontiguousarray(initial_topk, dtype=np.float32)).to(dev)
        makers.append(lambda r0, r1: _TopKValues(topk, r0, r1, k, initial))
    if betas:
        lse = torch.empty((n, len(betas)), dtype=torch.float64, device=dev)
        terms, xp = lse_terms(list(betas), base2=False), torch_namespace()
        makers.append(lambda r0, r1: _LogSumExp(lse, r0, r1, list(betas), terms, xp))
    if probes:
        probe_rows = np.empty((n, m), dtype=np.float32)
        makers.append(lambda r0, r1: _SortedRows(probe_rows, r0, r1, m, dev))
    near = None
    if nearest:
        near = (
            torch.full((m,), -torch.inf, dtype=torch.float32, device=dev),
            torch.full((m,), np.iinfo(np.int64).max, dtype=torch.int64, device=dev),
        )
        makers.append(lambda r0, r1: _ColumnNearest(near[0], near[1], r0))
    if makers:
        _stream(rows, cols, makers, device)
    lse_host = None if lse is None else _host(lse)
    return (
        None if topk is None else _host(topk),
        {} if lse_host is None else {b: lse_host[:, t] for t, b in enumerate(betas)},
        probe_rows,
        None if near is None else (_host(near[0]), _host(near[1])),
    )


def nearest_gallery_items(
    bank: np.ndarray,
    gallery: np.ndarray,
    k: int,
    *,
    initial: tuple[np.ndarray, np.ndarray] | None,
    id_offset: int,
    device: str,
    dtype: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of the ``k`` gallery items nearest to each bank item, on the device (as
    :func:`hubless.engine.statistics.nearest_gallery_items`). Several devices split the bank rows."""
    parts = _parts(device, bank.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            first = None if initial is None else (initial[0][a:b], initial[1][a:b])
            return nearest_gallery_items(bank[a:b], gallery, k, initial=first, id_offset=id_offset, device=dev, dtype=dtype)

        results = _on_parts(parts, part)
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
    columns = _put(gallery, device, dtype)
    if not streams(bank, device, dtype):
        scores, ids = _topk_with_ids(_put(bank, device, dtype), columns, k, device, initial=initial, offset=id_offset)
        return _host(scores), _host(ids)
    # a bank larger than the device: its row blocks stream in, their results go out block by block
    scores_out, ids_out = np.empty((len(bank), k), np.float32), np.empty((len(bank), k), np.int64)
    rows = block_shape(len(bank), len(gallery), device)[0]
    for r0, r1, block_rows in _Streamed(bank, device, dtype, rows).blocks():
        earlier = None if initial is None else (initial[0][r0:r1], initial[1][r0:r1])
        scores, ids = _topk_with_ids(block_rows, columns, k, device, initial=earlier, offset=id_offset)
        scores_out[r0:r1], ids_out[r0:r1] = _host(scores), _host(ids)
    return scores_out, ids_out


def _topk_with_ids(rows, cols, k: int, device: str, *, initial=None, offset: int = 0, transform=None):
    torch = _torch()
    n = rows.shape[0]
    values = torch.empty((n, k), dtype=torch.float32, device=rows.device)
    ids = torch.empty((n, k), dtype=torch.int64, device=rows.device)
    if initial is not None:
        initial = tuple(from_numpy(np.ascontiguousarray(a)).to(rows.device) for a in initial)
    _stream(rows, cols, [lambda r0, r1: _TopKIds(values, ids, r0, r1, k, offset, initial)], device, transform=transform)
    return values, ids


def exact_search(
    queries: np.ndarray,
    gallery: np.ndarray,
    top_k: int,
    *,
    additive: tuple[np.ndarray, np.ndarray] | None,
    device: str,
    dtype: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Top ``top_k`` gallery items of each query on the device, by ``q . r`` or, with
    ``additive = (W, bias_columns)``, by the corrected ``q . r - W(q) . bias_columns(r)``
    (ties: the lower id). The gallery and its biases stay on the device between calls; only
    the queries, W and the (scores, ids) move. Several devices split the queries."""
    parts = _parts(device, queries.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            share = None if additive is None else (additive[0][a:b], additive[1])
            return exact_search(queries[a:b], gallery, top_k, additive=share, device=dev, dtype=dtype)

        results = _on_parts(parts, part)
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
    torch = _torch()
    dev = torch.device(device)
    gallery_t = _put(gallery, device, dtype, keep=True)
    queries_t = from_numpy(np.ascontiguousarray(queries)).to(device=dev, dtype=gallery_t.dtype)
    transform = None
    if additive is not None and np.any(additive[0]):  # W = 0 (the baseline, closed gates): raw scores
        weights, columns = additive
        w = from_numpy(np.ascontiguousarray(weights, dtype=np.float32)).to(dev)
        bias = _put(columns, device, "float32", keep=True)

        def transform(block, r0, r1, c0, c1):
            wb, bb = w[r0:r1], bias[c0:c1]
            if wb.shape[1] == 1:
                block.sub_(wb[:, :1] * bb[:, 0])  # w_q * b_r by broadcasting, as the numpy ranking
            else:
                block.sub_(wb @ bb.T)

    values, ids = _topk_with_ids(queries_t, gallery_t, top_k, device, transform=transform)
    return _host(values), _host(ids)


#: A host ranker of :func:`rank_queries`: ``rank(start, stop, sims)`` -> the ranking scores of
#: query rows start:stop from their raw similarities ``sims`` (float32 host arrays).
HostRanker = Callable[[int, int, np.ndarray], np.ndarray]


def rank_queries(
    queries: np.ndarray,
    gallery: np.ndarray,
    rankers: Sequence[tuple[np.ndarray, np.ndarray] | HostRanker],
    truth_rows: np.ndarray,
    truth_indptr: np.ndarray,
    truth_indices: np.ndarray,
    *,
    ties: str,
    depth: int,
    device: str,
    dtype: str,
) -> list[tuple[np.ndarray, np.ndarray | None, float]]:
    """Rank ``queries`` over ``gallery`` for several rankings in one pass on the device: per
    ranking, the 1-based rank of every relevant item (``truth_indices``, CSR by query) with the
    tie convention of :func:`hubless.metrics.relevant_ranks`, the top ``depth`` ids (ties: the
    lower id) and the seconds it would take alone.

    A ranking is ``(W, bias_columns)``, the additive ``q . r - W(q) . bias_columns(r)`` computed
    on the device, or a host function (a non-additive correction) given each block of raw
    similarities. Each block of query rows spans the whole gallery (one product shared by every
    ranking); only the ranks and top ids come back. Several devices split the queries.
    """
    parts = _parts(device, queries.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            lo, hi = int(truth_indptr[a]), int(truth_indptr[b])
            shares = [
                (lambda start, stop, sims, r=r: r(start + a, stop + a, sims)) if callable(r) else (r[0][a:b], r[1]) for r in rankers
            ]  # fmt: skip
            return rank_queries(
                queries[a:b], gallery, shares, truth_rows[lo:hi] - a, truth_indptr[a : b + 1] - lo, truth_indices[lo:hi],
                ties=ties, depth=depth, device=dev, dtype=dtype,
            )  # fmt: skip

        results = _on_parts(parts, part)
        return [
            (
                np.concatenate([r[i][0] for r in results]),
                None if not depth else np.concatenate([r[i][1] for r in results]),
                sum(r[i][2] for r in results),
            )
            for i in range(len(rankers))
        ]
    torch = _torch()
    dev = torch.device(device)
    n, m = queries.shape[0], gallery.shape[0]
    most = int(np.diff(truth_indptr).max()) if n else 1
    one_each = truth_indices.size == n  # one relevant item per query: rows are the queries
    budget = BLOCK_ELEMENTS["cuda" if device.startswith("cuda") else "other"]
    rb = BLOCK_SHAPE[0] if BLOCK_SHAPE is not None else max(1, min(n, budget // max(1, m * max(1, most))))
    G = _put(gallery, device, dtype, keep=True)
    Q = from_numpy(np.ascontiguousarray(queries)).to(device=dev, dtype=G.dtype)
    rows_t, cols_t = (from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(dev) for a in (truth_rows, truth_indices))
    prepared: list[Any] = []
    for ranker in rankers:
        if callable(ranker):
            prepared.append(ranker)
        else:
            w, bias = ranker
            if not np.any(w):  # W = 0 (the baseline, closed gates): the raw scores rank
                prepared.append(None)
                continue
            prepared.append((from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(dev), _put(bias, device, "float32", keep=True)))
    rank_type = torch.float64 if ties == "average" else torch.int64
    ranks = [torch.empty(truth_indices.size, dtype=rank_type, device=dev) for _ in rankers]
    tops = [torch.empty((n, depth), dtype=torch.int64, device=dev) if depth else None for _ in rankers]
    seconds = [0.0] * len(rankers)
    positions = torch.arange(m, device=dev)

    def clock() -> float:
        if device.startswith("cuda"):
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    with torch.no_grad(), tf32_products(device):
        for start in range(0, n, rb):
            stop = min(n, start + rb)
            t0 = clock()
            sims = Q[start:stop] @ G.T
            if sims.dtype != torch.float32:
                sims = sims.float()
            shared = clock() - t0
            lo, hi = int(truth_indptr[start]), int(truth_indptr[stop])
            r, c = rows_t[lo:hi] - start, cols_t[lo:hi]
            host = None
            for i, ranker in enumerate(prepared):
                t0 = clock()
                if ranker is None:
                    scores = sims
                elif callable(ranker):
                    host = _host(sims) if host is None else host
                    scores = from_numpy(np.ascontiguousarray(ranker(start, stop, host), dtype=np.float32)).to(dev)
                else:
                    w, bias = ranker[0][start:stop], ranker[1]
                    scores = sims - w[:, :1] * bias[:, 0] if bias.shape[1] == 1 else sims - w @ bias.T
                block = scores if one_each else scores.index_select(0, r)
                target = block.gather(1, c[:, None])
                above = (block > target).sum(dim=1)
                if ties == "optimistic":
                    ranks[i][lo:hi] = above + 1
                else:
                    equal = (block == target).sum(dim=1)
                    if ties == "average":
                        ranks[i][lo:hi] = above + 1 + (equal - 1) / 2.0
                    else:  # "index": among equal scores, the lower gallery index first
                        tied = (equal > 1).nonzero().squeeze(1)
                        if tied.numel():
                            before = (block[tied] == target[tied]) & (positions[None, :] < c[tied, None])
                            equal[tied] = before.sum(dim=1) + 1
                        ranks[i][lo:hi] = above + equal
                top = tops[i]
                if top is not None:
                    top[start:stop] = _ordered_topk(scores, depth)[1]
                seconds[i] += shared + clock() - t0
    return [(_host(ranks[i]), None if tops[i] is None else _host(tops[i]), seconds[i]) for i in range(len(rankers))]


def score_bank_pass(
    blocks: Iterator[tuple[int, np.ndarray]],
    n_rows: int,
    n_cols: int,
    *,
    k: int,
    betas: list[float],
    probes_out: np.ndarray | None,
    activation_k: int,
    device: str,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, np.ndarray | None]:
    """The score-matrix pass of :func:`hubless.engine.score_statistics.score_statistics` on the
    device: ``blocks`` yields (start, checked float32 rows) of one bank's (n_rows, n_cols) score
    matrix; each block is uploaded once, its columns (gallery items) fed to the column reducers
    (top-k, log-sum-exp, probes) and its rows give their top-``activation_k`` items (ties: the
    lower id); ``probes_out`` (n_cols, n_rows) receives the sorted probes when given. Returns
    (top-k values, log-sum-exp (n_cols, len(betas)), activation scores, activation ids), host
    arrays or None. Several devices: the first is used."""
    torch = _torch()
    device = device.split(",")[0]
    dev = torch.device(device)
    topk = torch.empty((n_cols, k), dtype=torch.float32, device=dev) if k else None
    lse = torch.empty((n_cols, len(betas)), dtype=torch.float64, device=dev) if betas else None
    probe_rows = probes_out
    states: list[_State] = []
    if topk is not None:
        states.append(_TopKValues(topk, 0, n_cols, k))
    if lse is not None:
        states.append(_LogSumExp(lse, 0, n_cols, betas, lse_terms(betas, base2=False), torch_namespace()))
    if probe_rows is not None:
        states.append(_SortedRows(probe_rows, 0, n_cols, n_rows, dev))
    act_k = min(activation_k, n_cols)
    act_scores = np.empty((n_rows, act_k), np.float32) if act_k else None
    act_ids = np.empty((n_rows, act_k), np.int64) if act_k else None
    with torch.no_grad():
        for start, rows in blocks:
            block = from_numpy(rows).to(dev)
            if act_scores is not None and act_ids is not None:
                values, ids = _ordered_topk(block, act_k)
                act_scores[start : start + len(rows)], act_ids[start : start + len(rows)] = _host(values), _host(ids)
            if states:
                columns = block.T.contiguous()  # gallery items x bank rows, as the reducers expect
                for state in states:
                    state.update(columns, start)
        for state in states:
            state.finish()
    return (
        None if topk is None else _host(topk),
        None if lse is None else _host(lse),
        act_scores,
        act_ids,
    )
