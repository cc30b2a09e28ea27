"""The torch engine's reducers: each similarity block's reduction on the device, and the loop
that feeds them the blocks of ``rows @ cols.T``.

The reductions are the numpy engine's (:mod:`hubless.engine.stream`), with the same semantics:

* top-k values (NNN, CSLS; :class:`TopKValues`): the k largest similarities of each row,
  descending;
* top-k with ids (the activation sets of DIS / DualDIS, searches; :class:`TopKIds`,
  :func:`ordered_topk`): ordered by (value descending, id ascending), so ties go to the lower id
  as in :class:`hubless.engine.stream.TopK`;
* log-sum-exp at several betas (IS, DIS, DualIS, DualDIS; :class:`LogSumExp`): the formulas of
  :mod:`hubless.engine.formulas` (the same code as the numpy engine, run on torch tensors),
  around the running row maximum (the numpy engine refreshes its shift only when a term would
  overflow, a pass saved on a CPU; on a device the maximum costs less than the host sync the
  check needs);
* sorted probe rows (GC; :class:`SortedRows`);
* the nearest rows of every column (:class:`ColumnTopK`): each bank item's nearest gallery items
  (activation sets, bank coverage) from the gallery x bank blocks, in the same pass.

The top-k of a wide block is taken in two steps, the maximum of each chunk of columns and then
the top-k of the best chunks' entries (:func:`chunk_width`): the same result, ties included, for
one read of the block instead of a top-k over whole rows; the ordered top-k of a narrow block is
one ``torch.topk`` of int64 (value, -column) keys (:func:`keyed_topk`). Products in float16 /
bfloat16 are reduced in float32. No reducer reads a value back to the host inside the loop except
:func:`ordered_topk` over whole rows of a block too large for keys (over
:data:`KEYED_TOPK_ENTRIES` entries), to find rows tied at the k-th place (once per block).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from hubless._torch import from_numpy
from hubless.engine.device import tf32_products
from hubless.engine.formulas import LseTerm, lse_add, lse_finish, lse_recentre
from hubless.engine.torch_arrays import Streamed, block_budget, block_shape, to_host, torch_module

__all__ = [
    "ColumnTopK",
    "LogSumExp",
    "SortedRows",
    "State",
    "TopKIds",
    "TopKValues",
    "chunk_maxima",
    "chunk_width",
    "keyed_topk",
    "ordered_topk",
    "probe_rows_per_block",
    "sort_rows",
    "topk_from_chunks",
    "reduce_blocks",
]


class State:
    """One reducer over one row block (rows r0:r1) on the device."""

    def update(self, block, c0: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def finish(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def reduce_blocks(
    rows, cols, makers: Sequence[Callable[[int, int], State]], device: str, transform=None, offsets=None, max_rows: int | None = None
) -> None:
    """Feed every block of ``rows @ cols.T`` (device tensors) to new states of ``makers`` per
    row block; ``transform(block, r0, r1, c0, c1)`` may rewrite a block in place first;
    ``offsets`` (a float32 device row, one value per column) is added to every row of each
    block by the product itself (see :func:`_similarities`); ``max_rows``: at most that many
    rows per row block (a state that holds whole rows, :class:`SortedRows`, stays within the
    block budget).

    ``cols`` may be a :class:`~hubless.engine.torch_arrays.Streamed` host array (a bank larger
    than the device): then each column block is copied in once and meets every row block (the
    states of all row blocks live through the pass: they are n x small)."""
    torch = torch_module()
    n, m = rows.shape[0], len(cols)
    rb, cb = block_shape(n, m, device)
    rb = rb if max_rows is None else max(1, min(rb, max_rows))
    if isinstance(cols, Streamed):
        with torch.no_grad(), tf32_products(device):
            row_bounds = [(r0, min(n, r0 + rb)) for r0 in range(0, n, rb)]
            per_row_block = [[make(r0, r1) for make in makers] for r0, r1 in row_bounds]
            for c0, c1, column_block in cols.blocks():
                for (r0, r1), row_states in zip(row_bounds, per_row_block):
                    block = _similarities(rows[r0:r1], column_block, transform, r0, r1, c0, c1, offsets)
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
                block = _similarities(block_rows, cols[c0:c1], transform, r0, r1, c0, c1, offsets)
                for state in states:
                    state.update(block, c0)
            for state in states:
                state.finish()


def _similarities(block_rows, column_block, transform, r0: int, r1: int, c0: int, c1: int, offsets=None):
    """One block ``block_rows @ column_block.T`` in float32 (a half-precision product is widened),
    plus ``offsets[c0:c1]`` on every row when given, rewritten in place by
    ``transform(block, r0, r1, c0, c1)`` when one is given.

    A float32 product adds the offsets in the product's own epilogue (``torch.addmm`` with a
    row: cuBLASLt's bias epilogue on a GPU), one pass over the block fewer than a product and
    a subtraction (the device's corrected search: 0.83x the time of ``torch.topk(q @ G.T -
    bias)`` on an H100). The sum is ``round(product + offset)`` as before, but on a GPU the
    epilogue's kernel may accumulate the product in another order than the plain product's: a
    float32 rounding difference (up to 2e-6 at scores of 1.5, measured), as between two BLAS
    libraries."""
    torch = torch_module()
    if offsets is not None and block_rows.dtype == torch.float32:
        block = torch.addmm(offsets[c0:c1], block_rows, column_block.T)
    else:
        block = block_rows @ column_block.T
        if block.dtype != torch.float32:
            block = block.float()
        if offsets is not None:
            block.add_(offsets[c0:c1])
    if transform is not None:
        transform(block, r0, r1, c0, c1)
    return block


class TopKValues(State):
    """The k largest values of each row (sorted descending at the end), into ``out[r0:r1]``."""

    def __init__(self, out, r0: int, r1: int, k: int, initial=None) -> None:
        torch = torch_module()
        self.out, self.r0, self.r1, self.k = out, r0, r1, k
        if initial is None:
            self.values = torch.full((r1 - r0, k), -torch.inf, dtype=torch.float32, device=out.device)
        else:
            self.values = initial[r0:r1].clone()

    def update(self, block, c0: int) -> None:
        torch = torch_module()
        k = min(self.k, block.shape[1])
        width = chunk_width(block, k)
        if width:  # the k largest lie in the k chunks of the largest maxima (any k of them when tied)
            best = torch.topk(chunk_maxima(block, width), k, dim=1, sorted=False).indices
            candidates = _chunk_entries(best, width, block.shape[1], lambda columns: block.gather(1, columns))[0]
            new = torch.topk(candidates, k, dim=1, sorted=False).values
        else:
            new = torch.topk(block, k, dim=1, sorted=False).values
        self.values = torch.topk(torch.cat([self.values, new], dim=1), self.k, dim=1, sorted=False).values

    def finish(self) -> None:
        self.out[self.r0 : self.r1] = self.values.sort(dim=1, descending=True).values


def ordered_topk(block, k: int):
    """(values, column ids) of each row's ``k`` largest entries of ``block``, ordered by value
    descending then id ascending: ties go to the lower id, also at the k-th place (rows whose
    k-th value is tied beyond the k-th place are taken from a stable sort).

    A wide block is reduced in two steps (:func:`chunk_width`): the maximum of each chunk of
    columns, then the top k among the entries of the k chunks ranked first by (maximum
    descending, chunk ascending). That is exact, ties included: an entry outside those chunks
    has k entries before it in the order, the first maximal entry of each chosen chunk (a
    larger value, or the same value in an earlier chunk, so a lower id). One read of the block
    and a top-k over about ``k * width`` entries instead of a top-k over the whole row (0.45x
    the time of ``torch.topk`` on a CPU at 50,000 columns, ``benchmarks/ranking_pass.py``)."""
    torch = torch_module()
    width = chunk_width(block, k)
    if width:
        return topk_from_chunks(chunk_maxima(block, width), k, width, block.shape[1], lambda columns: block.gather(1, columns))
    if block.dtype == torch.float32 and block.numel() <= KEYED_TOPK_ENTRIES:
        return keyed_topk(block, k)
    # the (k+1)-th largest equals the k-th exactly when a tie straddles the k-th place
    values, ids = torch.topk(block, min(k + 1, block.shape[1]), dim=1)
    tied = values[:, k] == values[:, k - 1] if values.shape[1] > k else torch.zeros(len(block), dtype=torch.bool, device=block.device)
    values, ids = values[:, :k], ids[:, :k]
    if bool(tied.any()):  # the one sync of a block
        rows = tied.nonzero().squeeze(1)
        sorted_values, sorted_ids = torch.sort(block[rows], dim=1, descending=True, stable=True)
        values[rows], ids[rows] = sorted_values[:, :k], sorted_ids[:, :k]
    ids, order = torch.sort(ids, dim=1)
    values = values.gather(1, order)
    values, order = torch.sort(values, dim=1, descending=True, stable=True)
    return values, ids.gather(1, order)


#: The largest float32 block :func:`ordered_topk` ranks by :func:`keyed_topk` (its int64 keys
#: take twice the block's memory); a larger one by ``torch.topk`` and a stable sort of the rows
#: with a tie at the k-th place, which waits for the device once per block.
KEYED_TOPK_ENTRIES = 1 << 23


def keyed_topk(block, k: int):
    """:func:`ordered_topk` of a float32 block through one ``torch.topk`` of int64 keys that
    order the entries by (value descending, column ascending): the value's bits mapped to an
    int32 of the same order (negative floats' magnitude bits flipped, -0.0 made +0.0) in the
    high half, ``2^32 - 1 - column`` in the low half. Exact, ties included, and the device is
    never waited for (no data-dependent branch), which matters on a GPU, where each wait
    leaves it idle while the host queues the next work."""
    torch = torch_module()
    n, m = block.shape
    k = min(k, m)
    bits = block.contiguous().view(torch.int32)
    negative = bits < 0
    ordered = torch.bitwise_xor(bits, negative.int() * 0x7FFFFFFF) + negative.int()  # order of the values; -0.0 = +0.0
    low = (2**32 - 1) - torch.arange(m, dtype=torch.int64, device=block.device)
    keys = ordered.long().mul_(2**32).add_(low)
    top = torch.topk(keys, k, dim=1).values
    ids = (2**32 - 1) - torch.bitwise_and(top, 2**32 - 1)
    return block.gather(1, ids), ids


#: The narrowest chunk of columns :func:`ordered_topk` / :class:`TopKValues` reduce by their
#: maxima, and the widest (measured on a CPU, 2,684 rows: 32 to 128 columns within 15% of the best at 50,000 and
#: 100,000 columns for k from 1 to 16).
CHUNK_WIDTHS = (32, 256)


def chunk_width(block, k: int) -> int:
    """The chunk width for the top ``k`` of each row of ``block``: the power of two nearest
    sqrt(columns / k) within :data:`CHUNK_WIDTHS` (it balances the top-k over the chunk maxima
    and over the chosen chunks' entries) and so that the k chosen chunks hold at most a quarter
    of a row; 0 (one top-k over the whole rows) when no such width is left, or the rows are not
    contiguous (a transposed block)."""
    n, m = block.shape
    if not n or not k or block.stride(1) != 1:
        return 0
    low, high = CHUNK_WIDTHS
    widest = 1 << int(np.log2(m / (4 * k))) if m >= 4 * k else 0  # the chosen chunks: a quarter of a row at most
    width = min(max(1 << round(np.log2(max(1.0, m / k)) / 2), low), high, widest)
    return width if width >= max(2, low) else 0


def chunk_maxima(block, width: int):
    """The maximum of each chunk of ``width`` columns of each row (the last chunk may be
    narrower). Written with torch operations only, so a compiled caller
    (:mod:`hubless.engine.torch_fused`) fuses it with the work on the same block."""
    n, m = block.shape
    full = m // width
    maxima = block[:, : full * width].reshape(n, full, width).amax(dim=2)
    if full * width < m:
        maxima = torch_module().cat([maxima, block[:, full * width :].amax(dim=1, keepdim=True)], dim=1)
    return maxima


def topk_from_chunks(maxima, k: int, width: int, n_cols: int, entries):
    """The second step of :func:`ordered_topk`: (values, column ids) of each row's ``k`` best
    entries, ordered by (value descending, id ascending), from its chunk ``maxima`` and
    ``entries(columns)``, which gives the entries at ``columns`` ((rows, c) column ids, clamped
    to the last column) of the block the maxima came from."""
    chunks = ordered_topk(maxima, k)[1].sort(dim=1).values  # the best k chunks, in column order
    candidates, columns = _chunk_entries(chunks, width, n_cols, entries)
    values, at = ordered_topk(candidates, k)  # a tie to the earlier entry: the lower id
    return values, columns.gather(1, at)


def _chunk_entries(chunks, width: int, n_cols: int, entries):
    """(entries, column ids) of the chunks ``chunks`` ((rows, c) chunk numbers) of each row, side
    by side in the given order; the places past the last column hold -inf (never chosen before
    an entry: they come last)."""
    torch = torch_module()
    columns = (chunks[:, :, None] * width + torch.arange(width, device=chunks.device)).reshape(len(chunks), -1)
    past = columns >= n_cols
    columns.clamp_(max=n_cols - 1)
    return entries(columns).masked_fill_(past, -torch.inf), columns


class TopKIds(State):
    """The k best (value, id) of each row, by (value descending, id ascending), into
    ``values[r0:r1]`` and ``ids[r0:r1]``. Column blocks arrive in increasing id order and an
    initial top-k holds lower ids, so a stable merge keeps ties at the lower id."""

    def __init__(self, values, ids, r0: int, r1: int, k: int, offset: int, initial=None) -> None:
        torch = torch_module()
        self.out_values, self.out_ids, self.r0, self.r1, self.k, self.offset = values, ids, r0, r1, k, offset
        if initial is None:
            self.values = torch.full((r1 - r0, k), -torch.inf, dtype=torch.float32, device=values.device)
            self.ids = torch.full((r1 - r0, k), np.iinfo(np.int64).max, dtype=torch.int64, device=values.device)
        else:
            self.values, self.ids = initial[0][r0:r1].clone(), initial[1][r0:r1].clone()

    def update(self, block, c0: int) -> None:
        torch = torch_module()
        values, ids = ordered_topk(block, min(self.k, block.shape[1]))
        values = torch.cat([self.values, values], dim=1)
        ids = torch.cat([self.ids, ids + (c0 + self.offset)], dim=1)
        values, order = torch.sort(values, dim=1, descending=True, stable=True)
        self.values, self.ids = values[:, : self.k], ids.gather(1, order[:, : self.k])

    def finish(self) -> None:
        self.out_values[self.r0 : self.r1] = self.values
        self.out_ids[self.r0 : self.r1] = self.ids


class LogSumExp(State):
    """log sum_j exp(beta s_ij) per beta (the formulas of :mod:`hubless.engine.formulas`), into
    ``out[r0:r1]`` (float64)."""

    def __init__(self, out, r0: int, r1: int, betas: list[float], terms: list[LseTerm], xp) -> None:
        torch = torch_module()
        self.out, self.r0, self.r1, self.betas, self.terms, self.xp = out, r0, r1, betas, terms, xp
        self.peak = torch.full((r1 - r0,), -torch.inf, dtype=torch.float64, device=out.device)
        self.sums = torch.zeros((r1 - r0, len(betas)), dtype=torch.float64, device=out.device)
        self.count = 0

    def update(self, block, c0: int) -> None:
        torch = torch_module()
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


class SortedRows(State):
    """Every similarity of each row, sorted ascending, into ``out[r0:r1]`` (host). The rows
    gather on the device and are sorted there (the caller keeps ``r1 - r0`` rows within the
    block budget: :func:`probe_rows_per_block`), or (``on_host``: a streamed bank, or rows
    longer than a block) gather in ``out`` block by block and are sorted by :func:`sort_rows`."""

    def __init__(self, out: np.ndarray, r0: int, r1: int, n_cols: int, device, *, on_host: bool = False) -> None:
        torch = torch_module()
        self.out, self.r0, self.r1, self.device = out, r0, r1, device
        self.rows = None if on_host else torch.empty((r1 - r0, n_cols), dtype=torch.float32, device=device)

    def update(self, block, c0: int) -> None:
        if self.rows is None:
            self.out[self.r0 : self.r1, c0 : c0 + block.shape[1]] = to_host(block)
        else:
            self.rows[:, c0 : c0 + block.shape[1]] = block

    def finish(self) -> None:
        if self.rows is None:
            sort_rows(self.out[self.r0 : self.r1], self.device)
        else:
            self.out[self.r0 : self.r1] = to_host(self.rows.sort(dim=1).values)
            self.rows = None


def probe_rows_per_block(n_cols: int, device: str) -> int:
    """How many whole rows of ``n_cols`` similarities one block budget holds on ``device``
    (0: not even one; :class:`SortedRows` then gathers them on the host)."""
    return block_budget(device) // max(1, n_cols)


def sort_rows(out: np.ndarray, device) -> None:
    """Sort every row of the host array ``out`` ascending, in place: on ``device`` in chunks of
    rows that hold at most one block budget of entries (each uploaded once, its sorted values
    copied back), or on the host when one row is longer than that."""
    torch = torch_module()
    n, m = out.shape
    rows = probe_rows_per_block(m, str(device))
    if not rows:
        out.sort(axis=1)
        return
    with torch.no_grad():
        for r0 in range(0, n, rows):
            part = out[r0 : r0 + rows]
            part[...] = to_host(from_numpy(np.ascontiguousarray(part)).to(device).sort(dim=1).values)


class ColumnTopK(State):
    """The ``k`` nearest rows of every column over all row blocks, ordered by (value
    descending, row ascending), in ``values`` / ``ids`` ((n_cols, k) device tensors; empty slots
    -inf / int64 max). A gallery x bank pass gives each bank item's nearest gallery items (the
    activation sets of DIS / DualDIS, the bank's coverage) from the blocks the row reducers see,
    without a second product over the transposed pair. Row blocks reach every column in
    increasing row order (resident and streamed banks alike), so a stable merge keeps a tie at
    the lower row; k = 1 takes the first maximal row of each column (``max(dim=0)``)."""

    def __init__(self, values, ids, r0: int) -> None:
        self.values, self.ids, self.r0 = values, ids, r0

    def update(self, block, c0: int) -> None:
        torch = torch_module()
        c1, k = c0 + block.shape[1], self.values.shape[1]
        if k == 1:
            best, rows = block.max(dim=0)  # the first maximal row of each column
            better = best > self.values[c0:c1, 0]
            self.values[c0:c1, 0] = self.values[c0:c1, 0].where(~better, best)
            self.ids[c0:c1, 0] = self.ids[c0:c1, 0].where(~better, rows + self.r0)
            return
        new_values, new_rows = ordered_topk(block.T, min(k, block.shape[0]))
        values = torch.cat([self.values[c0:c1], new_values], dim=1)
        ids = torch.cat([self.ids[c0:c1], new_rows + self.r0], dim=1)
        values, order = torch.sort(values, dim=1, descending=True, stable=True)  # earlier rows first among ties
        self.values[c0:c1], self.ids[c0:c1] = values[:, :k], ids.gather(1, order[:, :k])

    def finish(self) -> None:
        pass
