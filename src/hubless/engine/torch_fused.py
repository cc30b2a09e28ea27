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

import sys
import threading
import types
import warnings

import torch

from hubless.engine.torch_reducers import chunk_maxima, keyed_topk, topk_from_chunks

__all__ = ["CompileFallbackWarning", "block_counts", "compiled_ranking_work", "ranking_work"]


class CompileFallbackWarning(RuntimeWarning):
    """``torch.compile`` failed for the ranking pass; it runs with eager torch kernels."""


#: Count per chunk of columns (the counts and the chunk maxima from one read of the block: one
#: reduction over each chunk with three results) when the block's rows are its queries' own;
#: False: the counts over whole rows and the maxima apart (two reads).
CHUNKED_COUNTS = True


def block_counts(base, minus, rows, target, width: int, before=None, chunked: bool = False):
    """(above, equal, maxima) of one ranking of a block: with ``scores = base - minus``
    (``minus`` None, a row broadcast over the block, or a block of the same shape) and
    ``block = scores[rows]`` (``rows`` None: the scores' own rows), per row of ``block`` the
    number of entries above and equal to its ``target`` (int64; with ``before``, a column per
    row, only the equal entries in columns before it: the index tie convention's count, so no
    row needs a second look), and the maxima of the chunks of ``width`` columns of ``scores``
    (None when ``width`` is 0). ``chunked`` (rows None, a width): counted chunk by chunk, the
    same numbers from one reduction over the chunks that also gives their maxima."""
    scores = base if minus is None else base - minus
    if chunked and rows is None and width:
        return _chunk_counts(scores, target, width, before)
    block = scores if rows is None else scores.index_select(0, rows)
    above = (block > target).sum(dim=1)
    same = block == target
    if before is not None:
        same = same & (torch.arange(block.shape[1], device=block.device) < before)
    return above, same.sum(dim=1), chunk_maxima(scores, width) if width else None


def _chunk_counts(scores, target, width: int, before):
    """:func:`block_counts` of a block whose rows are the targets' rows, per chunk of ``width``
    columns: the entries above and equal to the target and the maximum of each chunk (one
    reduction over each chunk, three results), then the counts summed over the chunks; the
    columns past the last whole chunk counted apart."""
    n, m = scores.shape
    full = m // width
    head = scores[:, : full * width].reshape(n, full, width)
    t = target[:, :, None]
    same = head == t
    if before is not None:
        columns = torch.arange(full * width, device=scores.device).reshape(full, width)
        same = same & (columns < before[:, :, None])
    above, equal, maxima = (head > t).sum(dim=2).sum(dim=1), same.sum(dim=2).sum(dim=1), head.amax(dim=2)
    if full * width < m:
        tail = scores[:, full * width :]
        tail_same = tail == target
        if before is not None:
            tail_same = tail_same & (torch.arange(full * width, m, device=scores.device) < before)
        above = above + (tail > target).sum(dim=1)
        equal = equal + tail_same.sum(dim=1)
        maxima = torch.cat([maxima, tail.amax(dim=1, keepdim=True)], dim=1)
    return above, equal, maxima


def ranking_work(base, minus, rows, columns, width: int, depth: int, index_ties: bool, chunked: bool):
    """All the ranking pass needs of one ranking of a block (:mod:`hubless.engine.torch_ranking`),
    with ``scores = base - minus`` never written: (above, equal, top ids) where ``above`` and
    ``equal`` count, per relevant pair (its query row ``rows``, None: the block's own rows, and
    its gallery column ``columns``), the scores above and equal to the pair's (with
    ``index_ties``: only the equal ones before its column), and the top ids are each row's
    ``depth`` best columns (ties to the lower id; None for depth 0) from the chunk maxima
    (:func:`hubless.engine.torch_reducers.topk_from_chunks`). A pair's score and the candidates
    of the top ids are ``base[i] - minus[i]`` at their places, the scores' own subtraction."""
    whole = None if minus is None else minus.expand_as(base)  # a bias row as a view of the block's shape

    def scores_at(index):
        return base[index] if whole is None else base[index] - whole[index]

    pair_rows = torch.arange(columns.shape[0], device=base.device) if rows is None else rows
    target = scores_at((pair_rows, columns))[:, None]
    above, equal, maxima = block_counts(base, minus, rows, target, width, columns[:, None] if index_ties else None, chunked)
    if not depth:
        return above, equal, None
    row_ids = torch.arange(base.shape[0], device=base.device)[:, None]
    return above, equal, topk_from_chunks(maxima, depth, width, base.shape[1], lambda at: scores_at((row_ids, at)), keyed_topk)[1]


_LOCK = threading.Lock()
_STATE: dict[object, object] = {}


def _fixed(width: int, depth: int, index_ties: bool, chunked: bool):
    """:func:`ranking_work` with its settings fixed (constants to the compiler), as a function
    with a code object of its own: torch.compile counts recompilations (a bias row or a block,
    rows or none) per code object and runs a function eagerly past its limit (8), so settings
    must not share one."""

    def work(base, minus, rows, columns):
        return ranking_work(base, minus, rows, columns, width, depth, index_ties, chunked)

    name = f"ranking_work_w{width}_d{depth}_{'index' if index_ties else 'counts'}_{'chunked' if chunked else 'apart'}"
    code = work.__code__.replace(co_name=name)
    if sys.version_info >= (3, 11):
        code = code.replace(co_qualname=name)
    return types.FunctionType(code, work.__globals__, name, work.__defaults__, work.__closure__)


def compiled_ranking_work(base, minus, rows, columns, width: int, depth: int, index_ties: bool):
    """:func:`ranking_work` compiled by ``torch.compile`` (dynamic shapes: one compilation per
    setting serves every block; the chunk width a constant, so each chunk's reduction has a
    fixed length), or None when compiling failed (now or before: a
    :class:`CompileFallbackWarning` says why, once per process)."""
    key = (width, depth, index_ties, CHUNKED_COUNTS)
    with _LOCK:
        if "failed" in _STATE:
            return None
        if key not in _STATE:
            _STATE[key] = torch.compile(_fixed(*key), dynamic=True)
        compiled = _STATE[key]
    try:
        return compiled(base, minus, rows, columns)  # type: ignore[operator]
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
