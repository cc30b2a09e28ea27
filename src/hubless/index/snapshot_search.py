"""Searching one version of an index (a :class:`~hubless.index.live.Snapshot`), read-only.

The FAISS structure (none for Flat, which is searched exactly by the streamed engine) holds the
base's [r, bias(r)] and is queried with [q, -W(q)]; rows written since the base are searched
exactly and merged in; dead rows and rows a ``where`` filter excludes are left out (FAISS
``IDSelector``; a filter leaving at most :data:`SUBSET_ROWS` rows is searched exactly over
them). With re-scoring (default for every ANN index) ``rescore_factor x top_k`` candidates are
re-scored exactly by the correction's ranking hook, so approximation only decides which items
become candidates. Raw-neighbour statistics (the DIS/DualDIS gates' raw top-1, CSLS's r_q) come
from one extra search of the same index with w = 0, over every live item
(:func:`raw_statistics`). Nothing here changes the snapshot but its caches (``snap.extra``).
"""

from __future__ import annotations

import numpy as np

from hubless._validation import as_embeddings, check_positive_int, check_top_k
from hubless.corrections import QueryBatch, QueryStatistics
from hubless.hits import Hits
from hubless.index.faiss_build import packed_bits, search_parameters, search_rows, with_selection
from hubless.index.live import MISSING, Snapshot, _best

__all__ = ["SUBSET_ROWS", "exact_topk", "search", "search_uncorrected"]

#: A filter leaving at most this many rows is searched exactly over them, on any index.
SUBSET_ROWS = 4096


def search(
    snap: Snapshot,
    queries,
    top_k: int = 10,
    *,
    where: dict | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    rescore: bool | None = None,
    **weight,
) -> Hits:
    """:meth:`hubless.index.Index.search` over one version ``snap`` of an index: the top ``top_k``
    (method scores, item ids) as :class:`~hubless.Hits`; unfilled slots (fewer items, or fewer
    matching ``where``, than ``top_k``; IVF lists probed that ran dry) come last, not ``found``,
    with id ``MISSING`` and score -inf, the one top-k rule of :func:`hubless._validation.check_top_k`."""
    corr = snap.serving
    nprobe, ef_search = _knobs(snap, nprobe, ef_search)
    batch = corr.queries(queries, **weight)
    allowed = snap.allowed(where)
    n_allowed = snap.n_alive if allowed is None else _count(snap, allowed)
    top_k = check_top_k(top_k, snap.n_alive, "the index")
    params = None if snap.faiss is None else search_parameters(snap.faiss, nprobe=nprobe, ef_search=ef_search)
    raw_statistics(snap, batch, params)
    exact, selection = _route(snap, params, allowed, n_allowed)
    if exact:
        ranking, rows = exact_topk(snap, batch, top_k, allowed, n_allowed)
    else:
        ranking, rows = ann_topk(snap, batch, top_k, allowed, n_allowed, params if selection is None else selection[0], rescore)
    found = rows != MISSING
    ids = np.where(found, snap.ids[np.where(found, rows, 0)], MISSING)
    if found.all():
        return Hits(corr.method_scores(batch, ranking), ids, found)
    scores = corr.method_scores(batch, np.where(found, ranking, 0).astype(np.float32))
    return Hits.from_found(scores, ids, found)


def search_uncorrected(
    snap: Snapshot,
    queries,
    top_k: int = 10,
    *,
    where: dict | None = None,
    nprobe: int | None = None,
    ef_search: int | None = None,
    rescore: bool | None = None,
) -> Hits:
    """:meth:`hubless.index.Index.search_uncorrected` over ``snap``: plain inner products
    through the same structure as :func:`search`, ANN candidates re-scored exactly."""
    config = snap.config
    nprobe, ef_search = _knobs(snap, nprobe, ef_search)
    vectors = as_embeddings(queries, "queries", normalize=snap.normalize, dim=snap.dim)
    allowed = snap.allowed(where)
    n_allowed = snap.n_alive if allowed is None else _count(snap, allowed)
    top_k = check_top_k(top_k, snap.n_alive, "the index")
    params = None if snap.faiss is None else search_parameters(snap.faiss, nprobe=nprobe, ef_search=ef_search)
    exact, selection = _route(snap, params, allowed, n_allowed)
    if exact:
        scores, rows = snap.stream_topk(vectors, top_k, allowed)
    else:
        params = params if selection is None else selection[0]
        do_rescore = config.rescore if rescore is None else bool(rescore)
        depth = max(1, min(n_allowed, top_k * config.rescore_factor) if do_rescore else min(top_k, n_allowed))
        zeros = np.zeros((vectors.shape[0], snap.bias.shape[1]), np.float32)
        scores, rows = _faiss_search(snap, vectors, zeros, min(depth, snap.n_base), params)
        if snap.n_tail:
            tail = snap.stream_topk(vectors, depth, allowed, rows="tail")
            scores, rows = _best(np.concatenate([scores, tail[0]], axis=1), np.concatenate([rows, tail[1]], axis=1), depth)
        if do_rescore:
            found = rows != MISSING
            sims = snap.candidate_sims(vectors, np.where(found, rows, 0))
            scores, rows = _best(np.where(found, sims, -np.inf), rows, top_k)
        else:
            scores, rows = _pad(scores[:, :top_k], rows[:, :top_k], top_k)
    found = rows != MISSING
    return Hits.from_found(scores, np.where(found, snap.ids[np.where(found, rows, 0)], MISSING), found)


def _knobs(snap: Snapshot, nprobe: int | None, ef_search: int | None) -> tuple[int, int]:
    """(nprobe, ef_search) of a search: the given values, checked whatever the index (an exact
    index ignores them but refuses an invalid one, as an ANN index does), else the index's own."""
    config = snap.config
    return (
        config.nprobe if nprobe is None else check_positive_int(nprobe, "nprobe"),
        config.ef_search if ef_search is None else check_positive_int(ef_search, "ef_search"),
    )


def _transform(snap: Snapshot, batch: QueryBatch):
    corr = snap.serving

    def transform(sims, r0, r1, c0, c1):
        corr._rank(batch.rows(r0, r1), sims, slice(c0, c1), sims)

    return transform


def exact_topk(snap: Snapshot, batch: QueryBatch, top_k: int, allowed, n_allowed: int):
    """Exact corrected top-k over the allowed rows (the streamed engine, or the gathered
    rows of a selective filter)."""
    if allowed is not None and n_allowed <= max(SUBSET_ROWS, snap.n_rows // 4):
        return snap.subset_topk(batch, top_k, np.flatnonzero(allowed))
    ranking, rows = snap.stream_topk(batch.vectors, top_k, allowed, _transform(snap, batch))
    short = (rows == MISSING).sum(axis=1) > max(0, top_k - n_allowed)
    if short.any():  # rows ranked -inf (published DualDIS, s <= 0) tied with left-out rows: redo exactly
        sub = snap.subset_topk(_rows_of_batch(batch, short), top_k, np.flatnonzero(snap.alive if allowed is None else allowed))
        ranking[short], rows[short] = sub
    return ranking, rows


def ann_topk(snap: Snapshot, batch: QueryBatch, top_k: int, allowed, n_allowed: int, params, rescore):
    """FAISS over the base (dead and filtered rows left out) + the rows written since the
    base exactly; then exact re-scoring of the candidates."""
    corr = snap.serving
    config = snap.config
    weights = np.ascontiguousarray(corr.weights(batch), dtype=np.float32)
    # a score only partly of bias form is always re-scored exactly (candidates from the bias form)
    do_rescore = (config.rescore if rescore is None else bool(rescore)) or not corr.exactly_additive
    depth = max(1, min(n_allowed, top_k * config.rescore_factor) if do_rescore else min(top_k, n_allowed))
    if allowed is None and snap.n_dead == 0:
        selection = None
    else:
        selection = _selection(snap, params, snap.alive if allowed is None else allowed)
        if selection is None:  # this FAISS index cannot leave rows out: exact over the allowed rows
            return exact_topk(snap, batch, top_k, snap.alive if allowed is None else allowed, n_allowed)
        params = selection[0]
    ranking, rows = _faiss_search(snap, batch.vectors, -weights, min(depth, snap.n_base), params)
    if snap.n_tail:
        tail = snap.stream_topk(batch.vectors, depth, snap.alive if allowed is None else allowed, _transform(snap, batch), rows="tail")
        ranking, rows = _best(np.concatenate([ranking, tail[0]], axis=1), np.concatenate([rows, tail[1]], axis=1), depth)
    if do_rescore:
        return rescored(snap, batch, rows, top_k)
    return _pad(ranking[:, :top_k], rows[:, :top_k], top_k)


def raw_statistics(snap: Snapshot, batch: QueryBatch, params) -> None:
    """Fill the raw-neighbour statistics the correction asks for, over every live item
    (w = 0); queries the index found too few raw neighbours for get them exactly."""
    corr = snap.serving
    request = corr.query_request
    if not request.depth:
        return
    depth = min(request.depth, snap.n_alive)
    if snap.faiss is None:
        scores, rows = snap.nearest_live(batch.vectors, depth)
    else:
        live_params = params
        if snap.n_dead:
            selection = _selection(snap, params, snap.alive)
            live_params = None if selection is None else selection[0]
        if snap.n_dead and live_params is None:
            scores, rows = snap.stream_topk(batch.vectors, depth, snap.alive)
        else:
            zeros = np.zeros((len(batch), snap.bias.shape[1]), np.float32)
            scores, rows = _faiss_search(snap, batch.vectors, zeros, min(depth, snap.n_base), live_params)
            if snap.n_tail:
                tail = snap.stream_topk(batch.vectors, depth, snap.alive if snap.n_dead else None, rows="tail")
                scores, rows = _best(np.concatenate([scores, tail[0]], axis=1), np.concatenate([rows, tail[1]], axis=1), depth)
        short = np.flatnonzero((rows[:, :depth] == MISSING).any(axis=1))
        if short.size:
            scores = np.array(scores[:, :depth])
            rows = np.array(rows[:, :depth])
            scores[short], rows[short] = snap.stream_topk(batch.vectors[short], depth, snap.alive if snap.n_dead else None)
    batch.statistics = QueryStatistics.from_neighbours(request, scores[:, :depth], rows[:, :depth])


def rescored(snap: Snapshot, batch: QueryBatch, rows: np.ndarray, top_k: int):
    """Exact ranking scores of the candidate rows by the correction's ranking hook, sorted
    (ties to the lower row); missing candidates sort last."""
    found = rows != MISSING
    safe = np.where(found, rows, 0)
    sims = snap.candidate_sims(batch.vectors, safe)
    ranking = snap.serving.rank(batch, sims, columns=safe, out=sims)
    return _best(np.where(found, ranking, -np.inf), np.where(found, rows, MISSING), top_k)


def _faiss_search(snap: Snapshot, q: np.ndarray, extra: np.ndarray, k: int, params):
    """FAISS top-k of [q, extra] over the base rows: (scores, rows), MISSING where unfilled."""
    nq = q.shape[0]
    if k <= 0:
        return np.full((nq, 0), -np.inf, np.float32), np.full((nq, 0), MISSING, np.int64)
    scores, rows = search_rows(snap.faiss, q, extra, k, params, snap.layout)
    return np.where(rows >= 0, scores, -np.inf).astype(np.float32), np.where(rows >= 0, rows, MISSING)


def _kept(snap: Snapshot, mask: np.ndarray, name: str, make):
    """``make(mask)``, kept in the snapshot's caches for this very mask (a filter's mask and the
    alive mask are made once per version), so a search does not redo O(n) work per call."""
    cache = snap.extra.setdefault(name, {})
    hit = cache.get(id(mask))
    if hit is None or hit[0] is not mask:
        if len(cache) > 64:
            cache.clear()
        hit = cache[id(mask)] = (mask, make(mask))
    return hit[1]


def _count(snap: Snapshot, allowed: np.ndarray) -> int:
    """How many rows ``allowed`` (a mask of the snapshot's rows) lets through."""
    return _kept(snap, allowed, "counts", lambda mask: int(np.count_nonzero(mask)))


def _route(snap: Snapshot, params, allowed: np.ndarray | None, n_allowed: int):
    """How a search over ``snap`` runs: (exact, selection). Exact over the allowed rows for a
    Flat index, a filter leaving at most :data:`SUBSET_ROWS` rows, or a FAISS index that cannot
    leave rows out; else through FAISS, with ``selection`` (:func:`_selection`) when a filter is
    given (packed only when FAISS will use it)."""
    selection = None
    if snap.faiss is not None and allowed is not None and n_allowed > SUBSET_ROWS:
        selection = _selection(snap, params, allowed)
    exact = snap.faiss is None or (allowed is not None and (n_allowed <= SUBSET_ROWS or selection is None))
    return exact, selection


def _selection(snap: Snapshot, params, allowed: np.ndarray):
    """:func:`~hubless.index.faiss_build.with_selection` of the base rows ``allowed`` lets
    through (a mask of every row), its bitmap packed once per mask and version."""
    bits = _kept(snap, allowed, "bits", lambda mask: packed_bits(mask[: snap.n_base]))
    return with_selection(snap.faiss, params, allowed[: snap.n_base], bits=bits)


def _pad(ranking: np.ndarray, rows: np.ndarray, k: int):
    if ranking.shape[1] >= k:
        return ranking, rows
    pad = k - ranking.shape[1]
    return np.pad(ranking, ((0, 0), (0, pad)), constant_values=-np.inf), np.pad(rows, ((0, 0), (0, pad)), constant_values=MISSING)


def _rows_of_batch(batch: QueryBatch, which: np.ndarray) -> QueryBatch:
    index = np.flatnonzero(which)
    weight = batch.weight
    if weight is not None and weight.ndim == 1:
        weight = weight[index]
    stats = batch.statistics
    if stats is not None:
        stats = QueryStatistics(
            top1=None if stats.top1 is None else stats.top1[index], topk=None if stats.topk is None else stats.topk[index]
        )
    return QueryBatch(batch.vectors[index], weight, stats)
