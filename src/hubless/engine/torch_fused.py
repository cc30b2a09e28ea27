"""The ranking pass's per-block work as compiled kernels (opt-in: ``HUBLESS_COMPILE=1`` or
``use_device(..., compiled=True)``).

For every ranking of a block of queries, :mod:`hubless.engine.torch_ranking` needs the rank of
each relevant item, ``1 + #(scores above its score)`` and the number of equal scores (for the
tie conventions), and the chunk maxima that give the top ids
(:func:`hubless.engine.torch_reducers.topk_from_chunks`), where ``scores = base - minus`` (the
raw similarities less nothing or a bias row, or less the per-query products ``W(q) .
bias_columns(r)``). In eager torch each of these is a pass over the block (the subtraction, two
compares and two sums, the maxima: about ten reads and writes of a 2^27-entry block per
ranking). :func:`block_counts` states them for one ranking, :func:`rankings_counts` for every
ranking of a block that shares its raw similarities, as one function (one graph: nothing in it
that ``torch.compile`` cannot trace) that the compiler turns into kernels where reductions over
the same ranges fuse: the block is read for every ranking's counts and maxima together, the
scores never written (Triton kernels on a GPU; on a CPU one C++ kernel for six rankings,
checked in the generated code). Measured on a 2-core CPU, one block of 2,684 queries x 50,000
items, ``benchmarks/ranking_pass.py``: 0.26x the eager passes' time per ranking (69 ms against
261 ms; 0.35x when each ranking was compiled alone). A CPU is compute-bound here; on a GPU
these passes are bound by memory, where one read for all rankings is the point.

The kernels compute exactly what the eager passes compute: a subtraction (no multiplication, so
no fused multiply-add can change a last bit; products of per-query weights are formed before,
as the eager path forms them; a gated row is selected, ``1 * b`` being ``b``), compares, and
integer sums. Compiling takes seconds (about 20 s
the first time on a 2-core CPU, a few seconds from torch's on-disk cache after), which only a
long ranking pass repays, hence opt-in. A compiler that fails (no C++ compiler for CPU torch,
no Triton for a GPU) is reported once as a :class:`CompileFallbackWarning` and the pass goes on
with the eager kernels; an error while the kernels run (out of memory) propagates and leaves
compiling on (:func:`compile_failure` tells them apart).
"""

from __future__ import annotations

import threading
import warnings

import torch

from hubless.engine.torch_reducers import chunk_maxima

__all__ = ["CompileFallbackWarning", "block_counts", "compile_failure", "compiled_rankings_counts", "rankings_counts"]


class CompileFallbackWarning(RuntimeWarning):
    """``torch.compile`` failed for the ranking pass; it runs with eager torch kernels."""


def block_counts(base, minus, rows, target, width: int, before=None):
    """(above, equal, maxima) of one ranking of a block: with ``scores = base - minus``
    (``minus`` None, a row broadcast over the block, a block of the same shape, or ``(gates,
    row)``: the row where a row's bool gate is open, zero elsewhere) and
    ``block = scores[rows]`` (``rows`` None: the scores' own rows), per row of ``block`` the
    number of entries above and equal to its ``target`` (int64; with ``before``, a column per
    row, only the equal entries in columns before it: the index tie convention's count, so no
    row needs a second look), and the maxima of the chunks of ``width`` columns of ``scores``
    (None when ``width`` is 0)."""
    if isinstance(minus, tuple):  # (gates, row): the row subtracted where a row's gate is open
        gates, row = minus
        minus = torch.where(gates[:, None], row, 0.0)
    scores = base if minus is None else base - minus
    block = scores if rows is None else scores.index_select(0, rows)
    above = (block > target).sum(dim=1)
    same = block == target
    if before is not None:
        same = same & (torch.arange(block.shape[1], device=block.device) < before)
    return above, same.sum(dim=1), chunk_maxima(scores, width) if width else None


def rankings_counts(base, minuses, rows, targets, width: int, before=None):
    """:func:`block_counts` of several rankings of one block, ``scores_k = base - minuses[k]``
    (each None, a row or (gates, row)), with their ``targets``: a list of (above, equal,
    maxima). One function, so the compiled kernels read the block once for every ranking's
    counts and once for every ranking's chunk maxima (reductions over the same ranges fuse),
    instead of twice per ranking, with one call's overhead per block instead of one per
    ranking."""
    return [block_counts(base, minus, rows, target, width, before) for minus, target in zip(minuses, targets)]


_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


def compiled_rankings_counts(base, minuses, rows, targets, width: int, before=None):
    """:func:`rankings_counts` compiled by ``torch.compile`` (dynamic shapes: one compilation
    serves every block and gallery size for each number of rankings and kind of each: nothing,
    a row, a block or a gated row subtracted), or None when compiling failed (now or before: a
    :class:`CompileFallbackWarning` says why, once per process)."""
    return _run_compiled(rankings_counts, base, minuses, rows, targets, width, before)


def _run_compiled(function, *args):
    """``function(*args)`` by its ``torch.compile`` form (made once per process), or None when
    compiling fails (the first failure warns; later calls return None at once).

    Only a failure of the compiler falls back (:func:`compile_failure`: no C++ compiler, no
    Triton, code the compiler cannot handle): any other error of the call, such as the device
    running out of memory, is the pass's own and propagates, and the next call compiles as
    before (the eager kernels would need the same memory)."""
    name = function.__name__
    try:
        with _LOCK:
            if "failed" in _STATE:
                return None
            if name not in _STATE:
                try:
                    _STATE[name] = torch.compile(function, dynamic=True)
                except Exception as exc:  # torch.compile itself refused (a Python it cannot compile for)
                    raise _CompileRefused(str(exc) or type(exc).__name__) from exc
            compiled = _STATE[name]
        return compiled(*args)  # type: ignore[operator]
    except Exception as exc:
        if not compile_failure(exc):
            raise
        told: BaseException = exc.__cause__ if isinstance(exc, _CompileRefused) and exc.__cause__ is not None else exc
        with _LOCK:
            first = "failed" not in _STATE
            _STATE["failed"] = True
        if first:
            reason = f"{type(told).__name__}: {str(told).strip().splitlines()[0] if str(told).strip() else ''}"
            warnings.warn(
                f"HUBLESS_COMPILE: torch.compile failed ({reason[:300]}); the ranking pass runs with eager torch kernels",
                CompileFallbackWarning,
                stacklevel=3,
            )
        return None


def compile_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says that compiling failed (torch's compiler errors: dynamo's, which
    wrap the backend's, inductor's C++ and CUDA compile errors), not that the compiled code ran
    out of memory or met another error at run time (an out-of-memory error anywhere in the
    chain of causes is never a compile failure)."""
    from torch._dynamo.exc import TorchDynamoException
    from torch._inductor.exc import CppCompileError, CUDACompileError

    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 32:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    if any(isinstance(e, torch.OutOfMemoryError) for e in chain):
        return False
    return isinstance(exc, (_CompileRefused, TorchDynamoException, CppCompileError, CUDACompileError))


class _CompileRefused(RuntimeError):
    """``torch.compile`` refused to make the compiled function (its cause says why)."""
