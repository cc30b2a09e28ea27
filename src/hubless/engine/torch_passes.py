"""The torch engine's passes: bank statistics, activation sets, exact searches and the
score-matrix bank pass, each block's product AND its reduction on the device.

Used whenever a torch device is in effect (``device="cuda"`` / ``"cpu"`` on ``fit`` and
``search``, :func:`hubless.engine.use_device`, ``HUBLESS_DEVICE``; see
:mod:`hubless.engine.device`). The column side (a bank, or the gallery of a search) and the row
side are uploaded once (:mod:`hubless.engine.torch_arrays`), every similarity block
``rows @ cols.T`` is computed and reduced on the device (:mod:`hubless.engine.torch_reducers`),
and only the per-row results (n x small: top-k values, log-sum-exp sums, activation sets, the
(scores, ids) of a search) come back to host memory. A bank larger than the device streams in
from host memory; several devices (``"cuda:0,cuda:1"``) split the rows, merged as the Ray tiles
are. The numpy engine (:mod:`hubless.engine.stream`) stays the default and never imports this
module. The evaluation's ranking pass is :mod:`hubless.engine.torch_ranking`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from hubless._torch import from_numpy
from hubless.engine.formulas import lse_terms
from hubless.engine.topk import NO_ID
from hubless.engine.torch_arrays import (
    Streamed,
    block_shape,
    device_parts,
    on_parts,
    put,
    streams,
    to_host,
    torch_module,
    torch_namespace,
)
from hubless.engine.torch_bias import one_row, products
from hubless.engine.torch_reducers import (
    ColumnTopK,
    LogSumExp,
    SortedRows,
    State,
    TopKIds,
    TopKValues,
    ordered_topk,
    probe_rows_per_block,
    reduce_blocks,
    sort_rows,
)

__all__ = ["exact_search", "nearest_gallery_items", "row_statistics", "score_bank_pass", "topk_with_ids"]


def row_statistics(
    gallery: np.ndarray,
    bank: np.ndarray,
    *,
    k: int,
    betas: list[float],
    probes: bool,
    nearest: int,
    initial_topk: np.ndarray | None,
    device: str,
    dtype: str,
) -> tuple[np.ndarray | None, dict[float, np.ndarray], np.ndarray | None, tuple[np.ndarray, np.ndarray] | None]:
    """What :func:`hubless.engine.statistics.row_statistics` computes, on the device: (top-k
    values, {beta: log-sum-exp}, sorted probes, (scores, ids) (n_bank, ``nearest``) of each bank
    item's ``nearest`` nearest gallery items, from the same blocks). Several devices split the
    gallery rows (the nearest rows are merged by (value descending, row ascending))."""
    parts = device_parts(device, gallery.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            initial = None if initial_topk is None else initial_topk[a:b]
            return row_statistics(
                gallery[a:b], bank, k=k, betas=betas, probes=probes, nearest=nearest, initial_topk=initial, device=dev, dtype=dtype
            )

        results = on_parts(parts, part)
        near = None
        if nearest:
            values = np.concatenate([r[3][0] for r in results], axis=1)
            ids = np.concatenate([np.where(r[3][1] == NO_ID, NO_ID, r[3][1] + a) for (_, a, _), r in zip(parts, results)], axis=1)
            order = np.lexsort((ids, -values), axis=1)[:, :nearest]  # a tie keeps the lower row
            near = (np.take_along_axis(values, order, axis=1), np.take_along_axis(ids, order, axis=1))
        return (
            None if not k else np.concatenate([r[0] for r in results]),
            {b: np.concatenate([r[1][b] for r in results]) for b in betas},
            None if not probes else np.concatenate([r[2] for r in results]),
            near,
        )
    torch = torch_module()
    n, m = gallery.shape[0], bank.shape[0]
    dev = torch.device(device)
    rows = put(gallery, device, dtype)
    streamed = bool(m) and streams(bank, device, dtype)
    cols = Streamed(bank, device, dtype, block_shape(n, m, device)[1]) if streamed else put(bank, device, dtype)
    makers: list[Callable[[int, int], State]] = []
    topk = lse = probe_rows = None
    if k:
        topk = torch.empty((n, k), dtype=torch.float32, device=dev)
        initial = None if initial_topk is None else from_numpy(np.ascontiguousarray(initial_topk, dtype=np.float32)).to(dev)
        makers.append(lambda r0, r1: TopKValues(topk, r0, r1, k, initial))
    if betas:
        lse = torch.empty((n, len(betas)), dtype=torch.float64, device=dev)
        terms, xp = lse_terms(list(betas), base2=False), torch_namespace()
        makers.append(lambda r0, r1: LogSumExp(lse, r0, r1, list(betas), terms, xp))
    max_rows = None
    if probes:  # whole rows of m probes: as many rows per block as the block budget holds
        probe_rows = np.empty((n, m), dtype=np.float32)
        on_host = streamed or not probe_rows_per_block(m, device)
        max_rows = None if on_host else probe_rows_per_block(m, device)
        makers.append(lambda r0, r1: SortedRows(probe_rows, r0, r1, m, dev, on_host=on_host))
    near = None
    if nearest:
        near = (
            torch.full((m, nearest), -torch.inf, dtype=torch.float32, device=dev),
            torch.full((m, nearest), NO_ID, dtype=torch.int64, device=dev),
        )
        makers.append(lambda r0, r1: ColumnTopK(near[0], near[1], r0))
    if makers:
        reduce_blocks(rows, cols, makers, device, max_rows=max_rows)
    lse_host = None if lse is None else to_host(lse)
    return (
        None if topk is None else to_host(topk),
        {} if lse_host is None else {b: lse_host[:, t] for t, b in enumerate(betas)},
        probe_rows,
        None if near is None else (to_host(near[0]), to_host(near[1])),
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
    parts = device_parts(device, bank.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            first = None if initial is None else (initial[0][a:b], initial[1][a:b])
            return nearest_gallery_items(bank[a:b], gallery, k, initial=first, id_offset=id_offset, device=dev, dtype=dtype)

        results = on_parts(parts, part)
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
    columns = put(gallery, device, dtype)
    if not streams(bank, device, dtype):
        scores, ids = topk_with_ids(put(bank, device, dtype), columns, k, device, initial=initial, offset=id_offset)
        return to_host(scores), to_host(ids)
    # a bank larger than the device: its row blocks stream in, their results go out block by block
    scores_out, ids_out = np.empty((len(bank), k), np.float32), np.empty((len(bank), k), np.int64)
    rows = block_shape(len(bank), len(gallery), device)[0]
    for r0, r1, block_rows in Streamed(bank, device, dtype, rows).blocks():
        earlier = None if initial is None else (initial[0][r0:r1], initial[1][r0:r1])
        scores, ids = topk_with_ids(block_rows, columns, k, device, initial=earlier, offset=id_offset)
        scores_out[r0:r1], ids_out[r0:r1] = to_host(scores), to_host(ids)
    return scores_out, ids_out


def topk_with_ids(rows, cols, k: int, device: str, *, initial=None, offset: int = 0, transform=None, column_offsets=None):
    """(values, ids) device tensors of the ``k`` best columns of each row (ties: the lower id),
    merged into ``initial`` (host (scores, ids) of earlier columns) when given; the blocks
    rewritten by ``transform`` or given ``column_offsets`` (see :func:`reduce_blocks`)."""
    torch = torch_module()
    n = rows.shape[0]
    values = torch.empty((n, k), dtype=torch.float32, device=rows.device)
    ids = torch.empty((n, k), dtype=torch.int64, device=rows.device)
    first = None
    if initial is not None:
        first = (
            from_numpy(np.ascontiguousarray(initial[0], dtype=np.float32)).to(rows.device),
            from_numpy(np.ascontiguousarray(initial[1], dtype=np.int64)).to(rows.device),
        )
    makers = [lambda r0, r1: TopKIds(values, ids, r0, r1, k, offset, first)]
    reduce_blocks(rows, cols, makers, device, transform=transform, offsets=column_offsets)
    return values, ids


def exact_search(
    queries: np.ndarray,
    gallery: np.ndarray,
    top_k: int,
    *,
    additive: tuple[np.ndarray, np.ndarray] | None,
    device: str,
    dtype: str,
    masked: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Top ``top_k`` gallery items of each query on the device, by ``q . r`` or, with
    ``additive = (W, bias_columns)``, by the corrected ``q . r - W(q) . bias_columns(r)``
    (ties: the lower id). The gallery and its biases stay on the device between calls; only
    the queries, W and the (scores, ids) move. Several devices split the queries. ``masked``:
    sorted gallery ids left out (their scores -inf: the copies of exact duplicate rows, put
    back by :func:`hubless.engine.exact_search`)."""
    parts = device_parts(device, queries.shape[0])
    if parts is not None:

        def part(dev: str, a: int, b: int):
            share = None if additive is None else (additive[0][a:b], additive[1])
            return exact_search(queries[a:b], gallery, top_k, additive=share, device=dev, dtype=dtype, masked=masked)

        results = on_parts(parts, part)
        return np.concatenate([r[0] for r in results]), np.concatenate([r[1] for r in results])
    torch = torch_module()
    dev = torch.device(device)
    gallery_t = put(gallery, device, dtype, keep=True)
    queries_t = put(queries, device, dtype)  # the upload the input check made, when there was one
    transform = offsets = None
    if additive is not None and np.any(additive[0]):  # W = 0 (the baseline, closed gates): raw scores
        weights, columns = additive
        w = from_numpy(np.ascontiguousarray(weights, dtype=np.float32)).to(dev)
        bias = put(columns, device, "float32", keep=True)
        row = one_row(weights, w, bias)
        if row is not None:  # one weight for every query: minus one row, added by the product itself
            offsets = torch.neg(row)
        else:  # per-query weights: minus the products w_q * b_r

            def transform(block, r0, r1, c0, c1):
                block.sub_(products(w[r0:r1], bias[c0:c1]))

    if masked is not None and masked.size:
        transform = _masking(transform, masked, dev)
    values, ids = topk_with_ids(queries_t, gallery_t, top_k, device, transform=transform, column_offsets=offsets)
    return to_host(values), to_host(ids)


def _masking(transform, masked: np.ndarray, dev):
    """``transform`` (or nothing) followed by the columns ``masked`` (sorted ids) of each block
    set to -inf."""
    torch = torch_module()
    ids = from_numpy(np.ascontiguousarray(masked, dtype=np.int64)).to(dev)

    def rewrite(block, r0, r1, c0, c1):
        if transform is not None:
            transform(block, r0, r1, c0, c1)
        lo, hi = np.searchsorted(masked, (c0, c1))
        if hi > lo:
            block.index_fill_(1, ids[lo:hi] - c0, -torch.inf)

    return rewrite


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
    (top-k, log-sum-exp) and its rows give their top-``activation_k`` items (ties: the lower
    id); ``probes_out`` (n_cols, n_rows) receives the sorted probes when given: gathered on the
    host from the blocks read there, then sorted on the device in chunks of one block budget
    (:func:`~hubless.engine.torch_reducers.sort_rows`), never whole on the device. Returns
    (top-k values, log-sum-exp (n_cols, len(betas)), activation scores, activation ids), host
    arrays or None. Several devices: the first is used."""
    torch = torch_module()
    device = device.split(",")[0]
    dev = torch.device(device)
    topk = torch.empty((n_cols, k), dtype=torch.float32, device=dev) if k else None
    lse = torch.empty((n_cols, len(betas)), dtype=torch.float64, device=dev) if betas else None
    states: list[State] = []
    if topk is not None:
        states.append(TopKValues(topk, 0, n_cols, k))
    if lse is not None:
        states.append(LogSumExp(lse, 0, n_cols, betas, lse_terms(betas, base2=False), torch_namespace()))
    act_k = min(activation_k, n_cols)
    act_scores = np.empty((n_rows, act_k), np.float32) if act_k else None
    act_ids = np.empty((n_rows, act_k), np.int64) if act_k else None
    with torch.no_grad():
        for start, rows in blocks:
            if probes_out is not None:  # gathered on the host (n_cols x n_rows: no device holds it), sorted below
                probes_out[:, start : start + len(rows)] = rows.T
            block = from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).to(dev)
            if act_scores is not None and act_ids is not None:
                values, ids = ordered_topk(block, act_k)
                act_scores[start : start + len(rows)], act_ids[start : start + len(rows)] = to_host(values), to_host(ids)
            if states:
                columns = block.T.contiguous()  # gallery items x bank rows, as the reducers expect
                for state in states:
                    state.update(columns, start)
        for state in states:
            state.finish()
    if probes_out is not None:
        sort_rows(probes_out, dev)
    return (
        None if topk is None else to_host(topk),
        None if lse is None else to_host(lse),
        act_scores,
        act_ids,
    )
