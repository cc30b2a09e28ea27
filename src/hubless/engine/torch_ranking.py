"""The evaluation's ranking pass on a torch device: ranks of the truth and top ids of several
rankings from one product per block of queries.

:func:`rank_queries` serves ``evaluate`` / ``tune`` (:mod:`hubless.evaluation.core`) when a torch
device is in effect: each block of query rows spans the whole gallery, its raw similarities are
computed once on the device and shared by every ranking (an additive correction's
``q . r - W(q) . bias_columns(r)`` on the device, any other correction on the host from the
block), and only the 1-based ranks of the relevant items, the top ids and the seconds come back.
Ranks follow the tie conventions of :func:`hubless.metrics.relevant_ranks`. Several devices
(``"cuda:0,cuda:1"``) split the queries. Arrays are placed by :mod:`hubless.engine.torch_arrays`.
Each ranking's counts and top ids come from eager passes over its block, or with
``HUBLESS_COMPILE`` from the compiled kernels of :mod:`hubless.engine.torch_fused` (the same
ranks; the rankings that are the raw similarities less nothing, one row, or one row where a
query's gate is open counted together, one read of the block for all, and their top ids in one
stacked second step). On a GPU the host waits for the device once, for the results, except
where a host ranking takes a block to the host (GC, the published DualDIS) and in
:func:`~hubless.engine.torch_reducers.ordered_topk` over whole rows of a large block (a narrow
gallery). :func:`corrected_top_k` is the top-k of corrected score rows (``correct_scores``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hubless._torch import from_numpy
from hubless.engine import torch_arrays
from hubless.engine.device import compiled_enabled, tf32_products
from hubless.engine.duplicates import Duplicates
from hubless.engine.torch_arrays import block_budget, device_parts, on_parts, put, to_host, torch_module
from hubless.engine.torch_bias import one_row, products
from hubless.engine.torch_clock import Stopwatch
from hubless.engine.torch_reducers import chunk_width, ordered_topk, topk_from_chunks
from hubless.metrics.retrieval import tie_ranks

__all__ = ["GatedRanker", "HostRanker", "corrected_top_k", "rank_queries", "rank_score_rows"]

#: A host ranker of :func:`rank_queries`: ``rank(start, stop, sims)`` -> the ranking scores of
#: query rows start:stop from their raw similarities ``sims`` (float32 host arrays).
HostRanker = Callable[[int, int, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class GatedRanker:
    """A ranking ``q . r - W(q) . bias_columns(r)`` whose weights are activation gates (DIS,
    DualDIS in bias form): W(q) is the row of ``masks`` (n_gallery, n_sets; 1 open, 0 closed,
    no other value) of the query's raw top-1 gallery item, which :func:`rank_queries` takes on
    the device from the very block of similarities it ranks (its argmax, the first of equal
    maxima: ties to the lower id, as the numpy pass): no search of the queries, nothing to the
    host and back."""

    masks: Any  # numpy arrays (a device tensor once the pass has placed them)
    bias: Any


#: A ranking of the pass: ``(W, bias_columns)`` (additive), a :class:`GatedRanker` or a host ranker.
Ranking = tuple[np.ndarray, np.ndarray] | GatedRanker | HostRanker
#: What the pass gives per ranking: (ranks of the relevant items, top ids or None, seconds).
Ranked = tuple[np.ndarray, np.ndarray | None, float]


def rank_queries(
    queries: np.ndarray,
    gallery: np.ndarray,
    rankers: Sequence[Ranking],
    truth_rows: np.ndarray,
    truth_indptr: np.ndarray,
    truth_indices: np.ndarray,
    *,
    ties: str,
    depth: int,
    device: str,
    dtype: str,
    duplicates: Duplicates | None = None,
) -> list[Ranked]:
    """Rank ``queries`` over ``gallery`` for several rankings in one pass on the device: per
    ranking, the 1-based rank of every relevant item (``truth_indices``, CSR by query) with the
    tie convention of :func:`hubless.metrics.relevant_ranks`, the top ``depth`` ids (ties: the
    lower id) and the seconds it would take alone.

    A ranking is ``(W, bias_columns)``, the additive ``q . r - W(q) . bias_columns(r)`` computed
    on the device, a :class:`GatedRanker` (the same with W the gates of each query's raw top-1), or
    a host function (a non-additive correction) given each block of raw similarities. Each
    block of query rows spans the whole gallery (one product shared by every ranking); only the
    ranks and top ids come back. Several devices split the queries. ``duplicates``: the exact
    duplicate rows of ``gallery``, whose columns of each block of similarities get their first
    copy's (:mod:`hubless.engine.duplicates`: copies tie exactly, as on the numpy engine).
    """
    parts = device_parts(device, queries.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            lo, hi = int(truth_indptr[a]), int(truth_indptr[b])
            shares = [
                r
                if isinstance(r, GatedRanker)
                else (lambda start, stop, sims, r=r: r(start + a, stop + a, sims))
                if callable(r)
                else (r[0][a:b], r[1])
                for r in rankers
            ]
            return rank_queries(
                queries[a:b],
                gallery,
                shares,
                truth_rows[lo:hi] - a,
                truth_indptr[a : b + 1] - lo,
                truth_indices[lo:hi],
                ties=ties,
                depth=depth,
                device=dev,
                dtype=dtype,
                duplicates=duplicates,
            )

        results = on_parts(parts, part)
        return [
            (
                np.concatenate([r[i][0] for r in results]),
                None if not depth else np.concatenate([r[i][1] for r in results]),
                sum(r[i][2] for r in results),
            )
            for i in range(len(rankers))
        ]
    torch = torch_module()
    G = put(gallery, device, dtype, keep=True)
    Q = put(queries, device, dtype)  # the upload the input check made, when there was one
    ranking = _RankingPass(rankers, gallery.shape[0], truth_rows, truth_indptr, truth_indices, ties=ties, depth=depth, device=device)
    copies = firsts = None
    if duplicates:  # each copy's column gets its first copy's: exact ties on any device
        copies, firsts = (from_numpy(a).to(ranking.dev) for a in (duplicates.copies, duplicates.firsts))
    with torch.no_grad(), tf32_products(device):
        for start, stop in ranking.blocks():
            t0 = ranking.clock.mark()
            sims = ranking.similarities(start, stop)
            if G.dtype == torch.float32:
                torch.matmul(Q[start:stop], G.T, out=sims)
            else:  # a half-precision product, ranked in float32
                sims.copy_(Q[start:stop] @ G.T)
            if copies is not None:
                sims.index_copy_(1, copies, sims.index_select(1, firsts))
            ranking.rank(start, stop, sims, (t0, ranking.clock.mark()))
    return ranking.results()


def rank_score_rows(
    read: Callable[[int, int], np.ndarray],
    n_gallery: int,
    rankers: Sequence[Ranking],
    truth_rows: np.ndarray,
    truth_indptr: np.ndarray,
    truth_indices: np.ndarray,
    *,
    ties: str,
    depth: int,
    device: str,
) -> list[Ranked]:
    """:func:`rank_queries` for rows of a query x gallery score matrix instead of embeddings:
    ``read(start, stop)`` gives the checked float32 rows start:stop (host), each block is
    uploaded once and ranked on the device as a block of similarities is (the score-matrix
    mode's ranking pass, :func:`hubless.score_matrices.rank.rank_score_rows`). The first device of a
    list is used."""
    torch = torch_module()
    device = device.split(",")[0]
    ranking = _RankingPass(rankers, n_gallery, truth_rows, truth_indptr, truth_indices, ties=ties, depth=depth, device=device)
    with torch.no_grad():
        for start, stop in ranking.blocks():
            t0 = ranking.clock.mark()
            sims = ranking.similarities(start, stop).copy_(from_numpy(np.ascontiguousarray(read(start, stop), dtype=np.float32)))
            ranking.rank(start, stop, sims, (t0, ranking.clock.mark()))
    return ranking.results()


def corrected_top_k(
    block: np.ndarray,
    k: int,
    *,
    depth: int,
    weights: Callable[[tuple[np.ndarray, np.ndarray] | None], np.ndarray],
    bias: np.ndarray,
    device: str,
) -> tuple[np.ndarray, np.ndarray]:
    """(values, ids) of each row's ``k`` best corrected scores ``s - W(q) . bias(r)`` of a block
    of raw score rows (host, checked), best first, ties to the lower id, on the device: the
    block is uploaded once, each row's raw top-``depth`` (scores, ids) taken there and given to
    ``weights`` (None when ``depth`` is 0), which returns W (host), and the subtraction and the
    top-k run there (the score-matrix mode's ``correct_scores(..., top_k=)``). The scores are
    the ranking pass's, bitwise: one row subtracted when every row has one weight, else the
    rounded products."""
    torch = torch_module()
    dev = torch.device(device.split(",")[0])
    with torch.no_grad():
        scores = from_numpy(np.ascontiguousarray(block, dtype=np.float32)).to(dev)
        raw = tuple(to_host(x) for x in ordered_topk(scores, depth)) if depth else None
        w = weights(raw)  # type: ignore[arg-type]
        if np.any(w):
            w_t, bias_t = from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(dev), put(bias, str(dev), "float32", keep=True)
            row = one_row(w, w_t, bias_t)
            torch.sub(scores, row if row is not None else products(w_t, bias_t, torch.empty_like(scores)), out=scores)
        values, ids = ordered_topk(scores, k)
    return to_host(values), to_host(ids)


class _RankingPass:
    """The per-block work of the ranking pass on one device: every ranking's scores of a block
    of raw similarities (query rows x the whole gallery), the ranks of the relevant items, the
    top ids and each ranking's seconds. Three blocks are reused throughout (the similarities, a
    ranking's scores, 0/1 flags to count)."""

    def __init__(self, rankers, m: int, truth_rows, truth_indptr, truth_indices, *, ties: str, depth: int, device: str) -> None:
        torch = self.torch = torch_module()
        dev = self.dev = torch.device(device)
        n = self.n = len(truth_indptr) - 1
        self.m = m
        self.ties, self.depth, self.indptr = ties, depth, truth_indptr
        self.compiled = compiled_enabled()  # the per-ranking work by torch.compile's kernels (torch_fused)
        running = RUNNING_TIE_COUNTS
        self.running_tie_counts = dev.type == "cuda" if running is None else running
        most = int(np.diff(truth_indptr).max()) if n else 1
        self.one_each = truth_indices.size == n  # one relevant item per query: rows are the queries
        shape = torch_arrays.BLOCK_SHAPE
        self.rb = shape[0] if shape is not None else max(1, min(n, block_budget(device) // max(1, m * max(1, most))))
        self.rows_t, self.cols_t = (from_numpy(np.ascontiguousarray(a, dtype=np.int64)).to(dev) for a in (truth_rows, truth_indices))
        self.prepared: list[Any] = []
        for ranker in rankers:
            if isinstance(ranker, GatedRanker):
                masks = from_numpy(np.ascontiguousarray(ranker.masks, dtype=np.float32)).to(dev)
                self.prepared.append(GatedRanker(masks, put(ranker.bias, device, "float32", keep=True)))  # on the device
            elif callable(ranker):
                self.prepared.append(ranker)
            else:
                w, bias = ranker
                if not np.any(w):  # W = 0 (the baseline, closed gates): the raw scores rank
                    self.prepared.append(None)
                    continue
                w_t, bias_t = from_numpy(np.ascontiguousarray(w, dtype=np.float32)).to(dev), put(bias, device, "float32", keep=True)
                self.prepared.append((one_row(w, w_t, bias_t) if len(w) else None, w_t, bias_t))
        # index ties: the ranks; the others: the counts above (and equal to) each relevant item's
        # score and, with several relevant items per query, those scores (metrics.tie_ranks)
        self.ranks = [torch.empty(truth_indices.size, dtype=torch.int64, device=dev) for _ in rankers]
        self.equals = [torch.empty(truth_indices.size, dtype=torch.int64, device=dev) for _ in rankers] if ties == "average" else None
        several = ties != "index" and not self.one_each
        self.targets = [torch.empty(truth_indices.size, dtype=torch.float32, device=dev) for _ in rankers] if several else None
        self.tops = [torch.empty((n, depth), dtype=torch.int64, device=dev) if depth else None for _ in rankers]
        self.clock = Stopwatch(dev)
        self.positions = torch.arange(m, device=dev)
        self.intervals: list[list[tuple[Any, Any, float]]] = [[] for _ in rankers]  # (start, end, share) of each ranking's work
        # flat, so that every block is a view of the same relation to its buffer (a last, shorter
        # block cut from a 2-d buffer made torch.compile recompile its kernels for it)
        self.sims_buffer = torch.empty(min(n, self.rb) * m, dtype=torch.float32, device=dev)
        self.scores_buffer = torch.empty_like(self.sims_buffer)
        self.flags_buffer = torch.empty((min(n, self.rb) * (1 if self.one_each else most), m), dtype=torch.float32, device=dev)

    def blocks(self) -> list[tuple[int, int]]:
        return [(start, min(self.n, start + self.rb)) for start in range(0, self.n, self.rb)]

    def _rows(self, buffer, n: int):
        """The first ``n`` rows (as wide as the gallery) of a flat buffer, a view."""
        return buffer[: n * self.m].view(n, self.m)

    def similarities(self, start: int, stop: int):
        """The reused block the raw similarities of rows start:stop go into."""
        return self._rows(self.sims_buffer, stop - start)

    def rank(self, start: int, stop: int, sims, shared: tuple[Any, Any]) -> None:
        """Rank query rows start:stop from their raw similarities ``sims`` for every ranking
        (``shared``: the :class:`Stopwatch` marks around the block's own work, counted in each
        ranking's seconds). Compiled, the rankings that are the raw scores less nothing, one
        row or a gated row are counted together (one read of the block for all), each charged an
        equal share."""
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        r, c = self.rows_t[lo:hi] - start, self.cols_t[lo:hi].clone()  # fresh tensors: the compiled kernels see no view
        out = self._rows(self.scores_buffer, stop - start)
        cache: dict[str, Any] = {}
        pending = list(enumerate(self.prepared))
        together = [i for i, p in pending if self._counted_together(p)] if self.compiled else []
        for g0 in range(0, len(together), COUNTED_TOGETHER):
            group = together[g0 : g0 + COUNTED_TOGETHER]
            t0 = self.clock.mark()
            minuses = [self._together_minus(self.prepared[i], sims, cache) for i in group]
            if not self._rank_compiled(group, lo, hi, start, stop, sims, minuses, r, c):
                break  # not compiled: every ranking by the eager passes
            end = self.clock.mark()
            for i in group:
                self.intervals[i] += [(*shared, 1.0), (t0, end, 1.0 / len(group))]
            pending = [(i, p) for i, p in pending if i not in group]
        for i, ranker in pending:
            t0 = self.clock.mark()
            base, minus = self._terms(ranker, start, stop, sims, out, cache)
            if not (self.compiled and self._rank_compiled([i], lo, hi, start, stop, base, [minus], r, c)):
                scores = base if minus is None else self.torch.sub(base, minus, out=out)
                self._rank_eager(i, lo, hi, start, stop, scores, r, c)
            self.intervals[i] += [(*shared, 1.0), (t0, self.clock.mark(), 1.0)]

    @staticmethod
    def _counted_together(ranker) -> bool:
        """Whether the compiled kernels count ``ranker`` with the others of its block: the raw
        similarities less nothing, one row, or one row where a query's gate is open (a gated
        ranking with one column)."""
        if isinstance(ranker, GatedRanker):
            return ranker.masks.shape[1] == 1
        return ranker is None or (isinstance(ranker, tuple) and ranker[0] is not None)

    @staticmethod
    def _together_minus(ranker, sims, cache: dict[str, Any]):
        """What a ranking counted together subtracts from the block: None, a row, or (gates, row),
        the row subtracted where a row's gate is open (0/1 weights: ``1 * b`` is ``b`` exactly,
        so the kernels' selection gives the products' scores; a closed gate's -0.0 or +0.0 ranks
        the same)."""
        if isinstance(ranker, GatedRanker):
            return ranker.masks[_raw_top1(sims, cache), 0] > 0, ranker.bias[:, 0]
        return None if ranker is None else ranker[0]

    def _terms(self, ranker, start: int, stop: int, sims, out, cache: dict[str, Any]):
        """(base, minus) of one ranking's scores ``base - minus`` for rows start:stop: the raw
        similarities or a host ranking's scores, less nothing, one row, or the per-query
        products ``W(q) . bias_columns(r)`` (formed in ``out``)."""
        dev = self.dev
        if ranker is None:
            return sims, None
        if callable(ranker):
            if "host" not in cache:
                cache["host"] = to_host(sims)
            return from_numpy(np.ascontiguousarray(ranker(start, stop, cache["host"]), dtype=np.float32)).to(dev), None
        if isinstance(ranker, GatedRanker):  # W of these rows: the gates of their raw top-1 in this block
            return sims, products(ranker.masks[_raw_top1(sims, cache)], ranker.bias, out)
        if ranker[0] is not None:  # one weight for every query: one row subtracted
            return sims, ranker[0]
        return sims, products(ranker[1][start:stop], ranker[2], out)

    def _rank_eager(self, i: int, lo: int, hi: int, start: int, stop: int, scores, r, c) -> None:
        """Ranks and top ids of ranking ``i`` from its scores, by eager passes (float 0/1 flags
        counted by float sums)."""
        torch = self.torch
        block = scores if self.one_each else scores.index_select(0, r)
        target = block.gather(1, c[:, None])
        flags = self.flags_buffer[: len(block)]
        above = count_true(torch.gt(block, target, out=flags))
        if self.ties == "optimistic":
            equal = None
        elif self.ties == "index" and self.running_tie_counts:  # the equal entries up to each relevant item's column
            equal = count_true_through(torch.eq(block, target, out=flags), c)
        elif self.ties == "index":  # the equal entries, then those up to its column in the rows with ties
            equal = count_true(torch.eq(block, target, out=flags))
            tied = (equal > 1).nonzero().squeeze(1)  # waits for the device
            if tied.numel():
                through = (block[tied] == target[tied]) & (self.positions[None, :] <= c[tied, None])
                equal[tied] = through.sum(dim=1)
        else:
            equal = count_true(torch.eq(block, target, out=flags))
        self._store_ranks(i, lo, hi, above, equal, target)
        top = self.tops[i]
        if top is not None:
            top[start:stop] = ordered_topk(scores, self.depth)[1]

    def _rank_compiled(self, indices: list[int], lo: int, hi: int, start: int, stop: int, base, minuses: list, r, c) -> bool:
        """Ranks and top ids of the rankings ``indices``, with scores ``base - minuses[k]``
        (each None, a row, a block, or (gates, row): the row where a row's gate is open), by the
        compiled kernels of :mod:`hubless.engine.torch_fused` (the scores never written); False
        when they do not apply (top ids over a gallery too narrow for chunks) or could not be
        compiled."""
        from hubless.engine import torch_fused

        width = chunk_width(base, self.depth) if self.depth else 0
        if self.depth and not width:
            return False
        torch = self.torch
        pair_rows = torch.arange(len(c), device=self.dev) if self.one_each else r
        index_ties = self.ties == "index"

        def scorer(minus):  # ``(base - minus)[index]``, formed as the kernels form it
            if minus is None:
                return lambda index: base[index]
            if isinstance(minus, tuple):  # (gates, row): the row where the row's gate is open
                gates, row = minus
                return lambda index: base[index] - torch.where(gates[index[0]], row[index[1]], 0.0)
            whole = minus.expand_as(base)  # a bias row as a view of the block's shape
            return lambda index: base[index] - whole[index]

        scorers = [scorer(minus) for minus in minuses]
        targets = [scores((pair_rows, c))[:, None] for scores in scorers]
        counts = torch_fused.compiled_rankings_counts(
            base, minuses, None if self.one_each else r, targets, width, c[:, None] if index_ties else None
        )
        if counts is None:
            return False
        for i, target, (above, equal, _) in zip(indices, targets, counts):
            # index ties: ``equal`` counts the equal entries before each relevant item's column
            self._store_ranks(i, lo, hi, above, None if self.ties == "optimistic" else equal + 1 if index_ties else equal, target)
        if self.depth:  # every ranking's top ids from its chunk maxima, the rankings' rows stacked: one second step
            row_ids = torch.arange(base.shape[0], device=self.dev)[:, None]

            def entries(columns):  # the stacked rankings' scores at ``columns``, ranking by ranking
                return torch.cat([scores((row_ids, part)) for scores, part in zip(scorers, columns.chunk(len(scorers)))])

            maxima = torch.cat([maxima for _, _, maxima in counts])
            ids = topk_from_chunks(maxima, self.depth, width, base.shape[1], entries)[1]
            for i, part in zip(indices, ids.chunk(len(indices))):
                self.tops[i][start:stop] = part  # type: ignore[index]
        return True

    def _store_ranks(self, i: int, lo: int, hi: int, above, equal, target) -> None:
        """Keep what the ranks of pairs lo:hi of ranking ``i`` follow from: the counts of scores
        above each pair's and ``equal`` to it (None for optimistic ties; for index ties only
        those up to the pair's own column, its own included: then the rank is their sum), and
        the pairs' own scores ``target`` (pairs x 1), which tell the relevant items of a tie
        group apart (:func:`hubless.metrics.retrieval.tie_ranks`, applied in :meth:`results`)."""
        if self.ties == "index":  # among equal scores, the lower gallery index first
            self.ranks[i][lo:hi] = above + equal
            return
        self.ranks[i][lo:hi] = above
        if self.equals is not None:
            self.equals[i][lo:hi] = equal
        if self.targets is not None:
            self.targets[i][lo:hi] = target.reshape(-1)

    def _ranks(self, i: int) -> np.ndarray:
        """Ranking ``i``'s ranks of the relevant items, by the tie convention, on the host."""
        counts = to_host(self.ranks[i])
        if self.ties == "index":
            return counts
        equal = None if self.equals is None else to_host(self.equals[i])
        targets = None if self.targets is None else to_host(self.targets[i])
        return tie_ranks(self.ties, counts, equal, targets, self.indptr)

    def results(self) -> list[Ranked]:
        out = [(self._ranks(i), None if top is None else to_host(top)) for i, top in enumerate(self.tops)]
        return [(ranks, top, self.clock.seconds(intervals)) for (ranks, top), intervals in zip(out, self.intervals)]


def _raw_top1(sims, cache: dict[str, Any]):
    """Each row's raw top-1 column in the block ``sims`` (the first of equal maxima: the lower
    id), taken once per block for every gated ranking."""
    if "top1" not in cache:
        cache["top1"] = sims.argmax(dim=1)
    return cache["top1"]


#: The most rankings the compiled kernels count together (more are counted in groups of this
#: many): a kernel's outputs and registers, and its compile time, grow with the rankings.
COUNTED_TOGETHER = 8

#: How the eager pass counts, for the index tie convention, the scores equal to a relevant
#: item's up to its column: by running sums of the equal flags (True: :func:`count_true_through`,
#: no wait for the device) or by the equal count and a second look at the rows with ties (False:
#: a ``nonzero`` per ranking and block, which waits for the device). None: running sums on a CUDA
#: device, where each wait leaves the GPU idle while the host catches up; the second look on
#: others, which run each kernel as it is called (on a CPU the running sums cost more than the
#: sum they replace: six methods' ``evaluate`` at 6,000 x 6,000, d 64, spent 127 ms in them).
RUNNING_TIE_COUNTS: bool | None = None

#: Columns a float32 sum of 0/1 flags counts exactly (every partial sum an integer < 2^24).
EXACT_FLOAT_COUNT = 1 << 24


def count_true(flags):
    """Per row, the number of ones in ``flags`` (float32 0/1), as int64, summed in chunks of
    :data:`EXACT_FLOAT_COUNT` columns, where a float32 sum of ones is exact. Float flags, not
    bool: torch sums a bool block far slower than a float one, measured 10x on a CPU and on an
    H100 (0.9 ms against about 0.2 ms for a 2^27-entry block, above the compare itself)."""
    width = flags.shape[1]
    if width <= EXACT_FLOAT_COUNT:
        return flags.sum(dim=1).long()
    return sum(flags[:, c0 : c0 + EXACT_FLOAT_COUNT].sum(dim=1).long() for c0 in range(0, width, EXACT_FLOAT_COUNT))


def count_true_through(flags, columns):
    """Per row ``q``, the number of ones in ``flags[q, :columns[q] + 1]`` (float32 0/1 flags,
    overwritten by their running sums), as int64: the index tie convention's rank part of the
    equal scores, the relevant item's own among them, with no look at which rows have ties (a
    ``nonzero`` there made the host wait for the device per ranking and block). Running sums in
    chunks of :data:`EXACT_FLOAT_COUNT` columns, where a float32 sum of ones is exact."""
    torch = torch_module()
    width, at = flags.shape[1], columns[:, None]
    if width <= EXACT_FLOAT_COUNT:
        return flags.cumsum_(dim=1).gather(1, at).squeeze(1).long()
    total = torch.zeros(len(flags), dtype=torch.int64, device=flags.device)
    for c0 in range(0, width, EXACT_FLOAT_COUNT):
        sums = flags[:, c0 : c0 + EXACT_FLOAT_COUNT].cumsum_(dim=1)
        last = (at - c0).clamp_(max=sums.shape[1] - 1)  # the chunk's last column for items after it
        through = sums.gather(1, last.clamp(min=0)).squeeze(1).long()
        total += torch.where(at.squeeze(1) >= c0, through, 0)
    return total
