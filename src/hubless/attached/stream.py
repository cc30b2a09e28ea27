"""One streamed pass over (ids, vectors) batches of a collection: what an attach and an update
compute from the vectors they read.

For each batch (:func:`fit_stream`), rows in id order:

* the bank statistics against the reference banks and each item's bias columns at once (every
  bias of NNN, CSLS, IS, DN, DualIS and DIS/DualDIS is row-local: it reads the item and the banks
  only, :meth:`~hubless.corrections.additive.AdditiveCorrection.row_bias`);
* each item's content digest (:func:`hubless.attached.digests.vector_digests`) and *scale*, the
  store's score over the correction's similarity (:func:`hubless.attached.prepare.store_scale`);
* the gallery-wide statistics, merged batch by batch: the running sum of the vectors (the
  collection's mean) and DIS/DualDIS activation sets, each bank item's k_a nearest items by
  similarity, **ties to the lower id** (:func:`merge_activation`: the rows of a batch are put in
  id order and batches merge by id, so the set is the one a fit over the collection sorted by id
  gives, whatever order the store returns its items in; the query gate reads the store's plain
  ranking, whose ties go to the lower id too);
* the reserve, the items of smallest summed bias (:func:`keep_reserve`), and the exact plain
  top-k' of the recall probe (:class:`hubless.attached.beam.RecallProbe`), when given.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hubless.attached.digests import vector_digests
from hubless.attached.prepare import collection_rows, store_scale
from hubless.attached.sources.base import Source
from hubless.engine import BankStatistics, StatisticsRequest, compute_statistics
from hubless.engine.topk import NO_ID

__all__ = ["Fitted", "fit_stream", "global_statistics", "keep_reserve", "merge_activation"]


@dataclass
class Fitted:
    """What one pass computed, row for row with ``ids`` (in the order the batches came, each
    batch in id order)."""

    ids: np.ndarray
    bias: np.ndarray
    digests: np.ndarray
    scale: np.ndarray
    gallery_sum: np.ndarray
    #: side -> (scores, stream rows, ids), each bank item's activation top-k
    activation: dict
    reserve_ids: np.ndarray  # the reserve's ids and vectors (as the correction reads them)
    reserve_vectors: np.ndarray


def keep_reserve(kept: tuple[np.ndarray, np.ndarray, np.ndarray], ids, rows, bias, size: int, below) -> tuple:
    """The reserve after one more batch: the ``size`` items of smallest summed bias so far, or
    (``below`` given: an update) every new item with a bias column under its threshold."""
    if below is not None:
        take = np.flatnonzero((bias < np.asarray(below, np.float32)[None, :]).any(axis=1))
    else:
        take = np.arange(ids.size)
    keys = np.concatenate([kept[2], bias[take].sum(axis=1, dtype=np.float64)])
    all_ids = np.concatenate([kept[0], ids[take]])
    all_rows = np.concatenate([kept[1], rows[take]])
    if below is None and keys.size > size:
        pick = np.argpartition(keys, size - 1)[:size] if size else np.zeros(0, np.int64)
        return all_ids[pick], all_rows[pick], keys[pick]
    return all_ids, all_rows, keys


def merge_activation(acc: tuple | None, scores: np.ndarray, rows: np.ndarray, ids: np.ndarray, seen: int, k: int) -> tuple:
    """Each bank item's top-``k`` items so far, by similarity, ties to the lower **id**: the
    accumulated (scores, stream rows, ids) merged with one batch's (``scores``, ``rows`` local to
    the batch, whose ids are ``ids``; empty slots ``NO_ID``), the batch starting at stream row
    ``seen``."""
    empty = rows == NO_ID
    local = (scores, np.where(empty, NO_ID, rows + seen), np.where(empty, NO_ID, ids[np.where(empty, 0, rows)]))
    if acc is None:
        n_bank = scores.shape[0]
        acc = (np.zeros((n_bank, 0), np.float32), np.zeros((n_bank, 0), np.int64), np.zeros((n_bank, 0), np.int64))
    values = np.concatenate([acc[0], local[0]], axis=1)
    stream_rows = np.concatenate([acc[1], local[1]], axis=1)
    keys = np.concatenate([acc[2], local[2]], axis=1)
    # empty slots (-inf) last whatever their key; among real items, higher similarity, then lower id
    order = np.lexsort((keys, stream_rows == NO_ID, -values.astype(np.float64)), axis=1)[:, :k]
    return tuple(np.take_along_axis(a, order, axis=1) for a in (values, stream_rows, keys))


def fit_stream(
    corr,
    source: Source,
    batches,
    request: StatisticsRequest,
    qb,
    gb,
    n_total: int,
    progress,
    *,
    reserve: int = 0,
    below=None,
    probe=None,
) -> Fitted:
    """Biases, digests and scales of every (ids, vectors) batch, the merged gallery-wide
    statistics, the reserve (``reserve`` items, or with ``below`` every new item under those
    thresholds) and the recall ``probe``'s exact top-k' (see the module docstring)."""
    from hubless.progress import progress_bar

    means = (
        np.zeros(source.dim) if qb is None else qb.mean(axis=0, dtype=np.float64),
        None if gb is None else gb.mean(axis=0, dtype=np.float64),
    )
    parts: dict[str, list] = {"ids": [], "bias": [], "digests": [], "scale": []}
    total = np.zeros(source.dim, np.float64)
    activation: dict[str, tuple] = {}
    seen = 0
    kept = (np.zeros(0, np.int64), np.zeros((0, source.dim), np.float32), np.zeros(0, np.float64))
    bar = progress_bar(None, progress, total=n_total, desc="attach", unit="item") if n_total else None
    for ids, vectors in batches:
        ids = np.asarray(ids, np.int64)
        order = np.argsort(ids, kind="stable")  # a batch's rows in id order: its ties go to the lower id
        ids, vectors = ids[order], np.asarray(vectors)[order]
        norms = np.linalg.norm(np.asarray(vectors, np.float64), axis=1) if corr.normalize and not source.cosine else np.ones(len(ids))
        rows = collection_rows(corr, source, vectors, ids, norms)
        part = compute_statistics(rows, qb, gb, request, bank_means=means)
        bias = corr.row_bias(rows, part)
        for name, value in (
            ("ids", ids),
            ("bias", bias),
            ("digests", vector_digests(vectors)),
            ("scale", store_scale(corr, source, norms)),
        ):
            parts[name].append(value)
        kept = keep_reserve(kept, ids, rows, bias, reserve, below)
        total += rows.sum(axis=0, dtype=np.float64)
        if probe is not None:  # scored as the store ranks: the cosine on a cosine store, else the raw inner product
            probe.add(ids, rows if source.cosine else vectors)
        for side, k in (("query", request.query_activation_k), ("gallery", request.gallery_activation_k)):
            if k:
                scores, local = getattr(part, f"{side}_activation_scores"), getattr(part, f"{side}_activation")
                activation[side] = merge_activation(activation.get(side), scores, local, ids, seen, k)
        seen += rows.shape[0]
        if bar is not None:
            bar.update(rows.shape[0])
    if bar is not None:
        bar.close()
    width = parts["bias"][0].shape[1] if parts["bias"] else 1
    empty = {
        "ids": np.zeros(0, np.int64),
        "bias": np.zeros((0, width), np.float32),
        "digests": np.zeros(0, np.uint64),
        "scale": np.zeros(0, np.float32),
    }
    joined = {name: np.concatenate(value) if value else empty[name] for name, value in parts.items()}
    return Fitted(joined["ids"], joined["bias"], joined["digests"], joined["scale"], total, activation, kept[0], kept[1])


def global_statistics(request: StatisticsRequest, n: int, qb, gb, gallery_mean, activation: dict) -> BankStatistics:
    """The gallery-wide statistics with empty per-row arrays (what the query side reads);
    ``activation``: side -> (scores, rows of the sidecar's ids)."""
    dim = gallery_mean.shape[0]
    stats = BankStatistics(
        n_gallery=n,
        n_query_bank=0 if qb is None else qb.shape[0],
        n_gallery_bank=None if gb is None else gb.shape[0],
        query_bank_mean=np.zeros(dim) if qb is None else qb.mean(axis=0, dtype=np.float64),
        gallery_mean=np.asarray(gallery_mean, np.float64),
        gallery_bank_mean=None if gb is None else gb.mean(axis=0, dtype=np.float64),
    )
    if request.query_topk:
        stats.query_topk = np.zeros((0, request.query_topk), np.float32)
    stats.query_lse = {b: np.zeros(0, np.float64) for b in request.query_betas}
    stats.gallery_lse = {b: np.zeros(0, np.float64) for b in request.gallery_betas}
    for side, (scores, rows) in activation.items():
        setattr(stats, f"{side}_activation_scores", scores)
        setattr(stats, f"{side}_activation", rows)
    return stats
