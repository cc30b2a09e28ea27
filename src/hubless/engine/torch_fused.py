"""The ranking pass's per-block work as compiled kernels (opt-in: ``HUBLESS_COMPILE=1`` or
``use_device(..., compiled=True)``).

For every ranking of a block of queries, :mod:`hubless.engine.torch_ranking` needs the rank of
each relevant item, ``1 + #(scores above its score)`` and the number of equal scores (for the
tie conventions), and the chunk maxima that give the top ids
(:func:`hubless.engine.torch_reducers.topk_from_chunks`), where ``scores = base - minus`` (the
raw similarities less a bias row, or less the per-query products ``W(q) . bias_columns(r)``). In eager torch each of
these is a pass over the block (the subtraction, two compares and two sums, the maxima: about
ten reads and writes of a 2^27-entry block per ranking). :func:`block_counts` states them as
one function that ``torch.compile`` turns into kernels reading the block once for the counts
and once for the maxima, the scores never written (Triton kernels on a GPU, C++ on a CPU;
measured on a 2-core CPU, one block of 2,684 queries x 50,000 items: 0.35x the time of the eager
passes, ``benchmarks/ranking_pass.py``).

The kernels compute exactly what the eager passes compute: a subtraction (no multiplication, so
no fused multiply-add can change a last bit; products of per-query weights are formed before,
as the eager path forms them), compares, and integer sums. Compiling takes seconds (about 20 s
the first time on a 2-core CPU, a few seconds from torch's on-disk cache after), which only a
long ranking pass repays, hence opt-in. A compiler that fails (no C++ compiler for CPU torch,
no Triton for a GPU) is reported once as a :class:`CompileFallbackWarning` and the pass goes on
with the eager kernels.
"""

from __future__ import annotations

import threading
import warnings

import torch

from hubless.engine.torch_reducers import chunk_maxima

__all__ = ["CompileFallbackWarning", "block_counts", "compiled_block_counts"]


class CompileFallbackWarning(RuntimeWarning):
    """``torch.compile`` failed for the ranking pass; it runs with eager torch kernels."""


def block_counts(base, minus, rows, target, width: int, before=None):
    """(above, equal, maxima) of one ranking of a block: with ``scores = base - minus``
    (``minus`` None, a row broadcast over the block, or a block of the same shape) and
    ``block = scores[rows]`` (``rows`` None: the scores' own rows), per row of ``block`` the
    number of entries above and equal to its ``target`` (int64; with ``before``, a column per
    row, only the equal entries in columns before it: the index tie convention's count, so no
    row needs a second look), and the maxima of the chunks of ``width`` columns of ``scores``
    (None when ``width`` is 0)."""
    scores = base if minus is None else base - minus
    block = scores if rows is None else scores.index_select(0, rows)
    above = (block > target).sum(dim=1)
    same = block == target
    if before is not None:
        same = same & (torch.arange(block.shape[1], device=block.device) < before)
    return above, same.sum(dim=1), chunk_maxima(scores, width) if width else None


_LOCK = threading.Lock()
_STATE: dict[str, object] = {}


def compiled_block_counts(base, minus, rows, target, width: int, before=None):
    """:func:`block_counts` compiled by ``torch.compile`` (dynamic shapes: one compilation
    serves every block and gallery size), or None when compiling failed (now or before: a
    :class:`CompileFallbackWarning` says why, once per process)."""
    with _LOCK:
        if "failed" in _STATE:
            return None
        if "compiled" not in _STATE:
            _STATE["compiled"] = torch.compile(block_counts, dynamic=True)
        compiled = _STATE["compiled"]
    try:
        return compiled(base, minus, rows, target, width, before)  # type: ignore[operator]
    except Exception as exc:  # a missing or failing compiler: the eager kernels do the same work
        with _LOCK:
            first = "failed" not in _STATE
            _STATE["failed"] = True
        if first:
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            warnings.warn(
                f"HUBLESS_COMPILE: torch.compile failed ({reason[:300]}); the ranking pass runs with eager torch kernels",
                CompileFallbackWarning,
                stacklevel=2,
            )
        return None
