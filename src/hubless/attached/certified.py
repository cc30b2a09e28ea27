"""Corrected search of an attached collection through the store's own ANN, with a certificate.

**Search** (:class:`AttachedCollection`): the store's own ANN gives each query its k' >= k best
*plain* candidates (s = q . r, the store's scores), which are re-scored exactly with the
sidecar's biases through the correction's rank hook, ``ranking = s - W(q) . bias(r)``. With
``b_min[c]`` the smallest bias column c over the whole collection and ``W(q) >= 0``, any item r
outside the candidates has ``s(q, r) <= s_k'`` (the k'-th plain score: the store's plain ranking
puts r after it), hence

    ranking(q, r) = s(q, r) - sum_c W_c(q) bias_c(r) <= s_k' - sum_c W_c(q) b_min[c] =: bound(q).

The *reserve* tightens this: the sidecar keeps the vectors of the items of smallest bias (1% of
the collection by default; the items a correction promotes most), which are scored exactly on
every search next to the store's candidates, so ``b_min`` above need only bound the items
*outside* the reserve: ``t[c]``, each column's smallest bias outside it (``t = b_min`` with no
reserve). So when the k-th best corrected candidate scores strictly above
``bound(q) = s_k' - sum_c W_c(q) t[c]`` (strictly: an outside item at the bound could tie and
win on a lower id), no outside item can enter the top-k, and the answer equals exact corrected search over the collection *relative to the
store's plain ranking* (exact when the store searches exactly; for an ANN index, exact over what
its plain top-k' is). A query whose candidates cover the whole collection is certified too.
Uncertified queries are asked again with k' doubled, up to ``max_candidates``; the answer says
which queries were certified and the k' each needed. A float slack of a few float32 ulps of the
bound is kept (the ranking is computed in float32).

:meth:`AttachedCollection.evaluate` measures the attached search against
:meth:`AttachedCollection.exact_search` (a full scan): recall@k and the certified share.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hubless._validation import check_positive_int, check_top_k
from hubless.attached.prepare import collection_rows, correction_for
from hubless.attached.sidecar import Sidecar, read_sidecar, source_address
from hubless.attached.sources.base import BATCH, Source, open_source, sample_hash
from hubless.errors import Conflict, InvalidType

__all__ = ["AttachedCollection", "AttachedResult", "recall_at_k"]

#: Default first k' (candidates per query) as a multiple of top_k.
CANDIDATE_FACTOR = 8
#: Default largest k': this many times top_k (at least 1024), at most the collection.
MAX_FACTOR = 64
#: Candidate slots (queries x (k' + reserve)) re-scored at once by a search (bounds its temporaries).
ANSWER_ELEMENTS = 1 << 22
#: Queries ranked per scan by :meth:`AttachedCollection.exact_search` (bounds its memory).
EXACT_QUERY_BLOCK = 1024


@dataclass
class AttachedResult:
    """An attached search: ``scores``/``ids`` (n_queries, top_k) as :meth:`hubless.Index.search`
    (the method's scores, the store's ids, best first; missing slots id -1, score -inf),
    ``certified`` (n_queries,) bool (the top-k is exact relative to the store's plain ranking,
    see the module docstring) and ``candidates`` (n_queries,) the k' each query was answered with."""

    scores: np.ndarray
    ids: np.ndarray
    certified: np.ndarray
    candidates: np.ndarray
    #: with ``metadata=True``: per query, per hit ``{"id", **the store's payload}``
    metadata: list | None = None

    def __iter__(self):  # scores, ids = result
        return iter((self.scores, self.ids))


class AttachedCollection:
    """A collection with its attached sidecar: corrected search through the store's own ANN,
    certified (see the module docstring). Open one with :meth:`open`."""

    def __init__(self, source: Source, sidecar: Sidecar, *, verify: bool = True) -> None:
        self.source = source
        self.sidecar = sidecar
        info = sidecar.info
        self.correction = correction_for(info["spec"], bool(info["normalize"])).for_rows(sidecar.bias, sidecar.statistics)
        self.b_min = np.asarray(info["b_min"], np.float64)
        #: each bias column's smallest value outside the reserve: the certificate's bound
        self.threshold = np.asarray(info["reserve"]["threshold"], np.float64)
        self.reserve_ids = sidecar.reserve_ids
        self.reserve_vectors = sidecar.reserve_vectors
        self.reserve_rows = np.searchsorted(sidecar.ids, sidecar.reserve_ids)
        if verify:
            self.verify()

    @classmethod
    def open(cls, source, sidecar, **source_options) -> AttachedCollection:
        """The collection ``source`` with the sidecar directory ``sidecar``; refused
        (:class:`~hubless.errors.Conflict`) when the collection changed since the sidecar was
        written (run :func:`update`)."""
        return cls(open_source(source, **source_options), read_sidecar(sidecar))

    @classmethod
    def from_sidecar(cls, sidecar, **source_options) -> AttachedCollection:
        """The collection the sidecar directory ``sidecar`` is attached to, opened with the
        options it was attached with (``source_options`` add to them or replace them: an open
        ``shard=`` or ``client=``); a local collection is found from the sidecar's folder
        (:func:`hubless.attached.sidecar.source_address`), not from the working folder."""
        found = read_sidecar(sidecar)
        options = {**found.info["source"].get("options", {}), **source_options}
        return cls(open_source(source_address(found), **options), found)

    def __repr__(self) -> str:
        return f"AttachedCollection({self.source.uri!r}, {self.sidecar.spec!r}, n={self.ntotal})"

    @property
    def ntotal(self) -> int:
        return int(self.sidecar.ids.size)

    @property
    def spec(self) -> str:
        return self.sidecar.spec

    def verify(self) -> None:
        """Check the collection against the sidecar's fingerprint (count, then the sample hash):
        :class:`~hubless.errors.Conflict` naming what changed."""
        fp = self.sidecar.fingerprint
        self._check_count()
        try:
            _, digest = sample_hash(self.source, self.sidecar.ids)
        except KeyError:  # NotFound: a sampled id is gone
            digest = None
        if digest != fp["sample_sha256"]:
            raise Conflict(
                f"{self.source.uri} changed since it was attached (the sampled items' vectors or ids differ): "
                f"run hubless attach --update (hubless.attached.update) before searching"
            )

    def _check_count(self) -> None:
        n = self.source.count()
        if n != self.ntotal:
            raise Conflict(
                f"{self.source.uri} changed since it was attached ({self.ntotal} items then, {n} now): "
                "run hubless attach --update (hubless.attached.update) before searching"
            )

    def search(self, queries, top_k: int = 10, **options) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) as :meth:`hubless.Index.search`; see :meth:`search_certified`."""
        result = self.search_certified(queries, top_k, **options)
        return result.scores, result.ids

    def search_certified(
        self,
        queries,
        top_k: int = 10,
        *,
        candidates: int | None = None,
        max_candidates: int | None = None,
        metadata: bool = False,
        **options,
    ) -> AttachedResult:
        """Corrected top-``top_k`` through the store's plain search (see the module docstring).

        ``candidates``: the first k' (default ``8 * top_k``); ``max_candidates``: the largest k'
        an uncertified query is widened to (default ``max(1024, 64 * top_k)``, at most the
        collection). ``options``: the correction's weight (``alpha=``, ``lam=``, ``weight=``) and
        the store's search knobs (``nprobe``, ``ef_search``, ...). ``metadata``: also read the
        hits' metadata from the store (its payload or other columns; one read for the batch).
        A ``top_k`` beyond the collection keeps the width: the slots past it come last with id
        -1 and score -inf (the one top-k rule, :func:`hubless._validation.check_top_k`).
        """
        if not isinstance(metadata, (bool, np.bool_)):
            raise InvalidType(f"metadata must be True or False; got {metadata!r}")
        corr = self.correction
        n = self.ntotal
        top_k = check_top_k(top_k, n, "the collection")  # the one top-k rule: beyond the items, padded
        weight = {k: options.pop(k) for k in list(options) if k in (corr.weight_param, "weight")}
        batch = corr.queries(queries, **weight)
        depth = corr.query_request.depth
        k = min(top_k, n)
        first = check_positive_int(candidates, "candidates") if candidates is not None else CANDIDATE_FACTOR * k
        limit = check_positive_int(max_candidates, "max_candidates") if max_candidates is not None else max(1024, MAX_FACTOR * k)
        limit = min(max(limit, k), n)
        first = min(max(first, k, depth), limit if candidates is None else n)
        self._check_count()
        nq = len(batch)
        scores = np.full((nq, top_k), -np.inf, np.float32)
        ids = np.full((nq, top_k), -1, np.int64)
        certified = np.zeros(nq, bool)
        used = np.zeros(nq, np.int64)
        todo = np.arange(nq)
        kp = first
        while todo.size:
            ok = np.zeros(todo.size, bool)
            step = max(1, ANSWER_ELEMENTS // (kp + self.reserve_ids.size))  # queries per round: bounded temporaries
            for lo in range(0, todo.size, step):
                rows = todo[lo : lo + step]
                part = batch.rows(0, nq) if rows.size == nq else _take(batch, rows)
                s, i, ok[lo : lo + step] = self._answer(part, k, kp, options)
                scores[rows, :k], ids[rows, :k], certified[rows], used[rows] = s, i, ok[lo : lo + step], kp
            if kp >= limit:
                break
            todo = todo[~ok]
            kp = min(2 * kp, limit)
        found_meta: list | None = None
        if metadata:
            flat = iter(self.source.payloads(ids[ids >= 0]))
            found_meta = [[{"id": int(i), **next(flat)} for i in hits[hits >= 0].tolist()] for hits in ids]
        return AttachedResult(scores, ids, certified, used, found_meta)

    def evaluate(self, queries, top_k: int = 10, **options) -> dict:
        """The attached search measured against exact corrected search (:meth:`exact_search`,
        a full scan) on ``queries``: ``recall`` = mean over queries of
        |attached top-k ∩ exact top-k| / |exact top-k| (recall@k, 1.0 when every answer is the
        exact one), ``certified`` = the share of queries whose answer carries the certificate
        (exact relative to the store's plain ranking), ``candidates`` = the mean k' used, with
        ``top_k`` and ``queries`` (their count). ``options`` as :meth:`search_certified` (the
        weight applies to both searches). Reads the whole collection: for evaluation only."""
        return self.evaluate_at(queries, [top_k], **options)[0]

    def evaluate_at(self, queries, ks, **options) -> list[dict]:
        """:meth:`evaluate` at each cut-off of ``ks`` (one dict per k, in that order), with one
        exact scan at the largest k: the exact top-k is the first k of the exact top-K (one
        ranking, ties to the lower id); the attached search runs once per k (its certificate
        depends on k). What ``hubless eval --attached SIDECAR`` prints."""
        ks = [check_positive_int(k, "top_k") for k in (ks if isinstance(ks, (list, tuple)) else [ks])]
        if not ks:
            raise InvalidType("ks must name at least one cut-off")
        weight = {k: options[k] for k in list(options) if k in (self.correction.weight_param, "weight")}
        want = self.exact_search(queries, max(ks), **weight)[1]
        rows = []
        for k in ks:
            result = self.search_certified(queries, k, **options)
            rows.append(
                {
                    "top_k": int(k),
                    "queries": int(result.ids.shape[0]),
                    "recall": recall_at_k(result.ids, want[:, :k]),
                    "certified": float(result.certified.mean()) if result.certified.size else 1.0,
                    "candidates": float(result.candidates.mean()) if result.candidates.size else 0.0,
                }
            )
        return rows

    def exact_search(self, queries, top_k: int = 10, *, batch: int = BATCH, **weight) -> tuple[np.ndarray, np.ndarray]:
        """Exact corrected search over every item of the collection, by brute force: the
        collection is scanned (twice for DIS/DualDIS/CSLS, whose raw top neighbours come
        first) and every item ranked ``s - W(q) . bias`` with the sidecar's biases; (scores,
        ids) as :meth:`search`. What :meth:`search` is measured against (``hubless attach
        --search Q --exact``); it reads the whole collection, so it is for evaluation, not
        serving."""
        from hubless.corrections import QueryStatistics

        corr = self.correction
        top_k = check_top_k(top_k, self.ntotal, "the collection")
        batch = check_positive_int(batch, "batch")
        all_queries = corr.queries(queries, **weight)
        self._check_count()
        n, nq = self.ntotal, len(all_queries)
        k = min(top_k, n)
        depth = corr.query_request.depth
        scores = np.full((nq, top_k), -np.inf, np.float32)
        ids = np.full((nq, top_k), -1, np.int64)
        for lo in range(0, nq, EXACT_QUERY_BLOCK):
            part = all_queries.rows(lo, min(nq, lo + EXACT_QUERY_BLOCK))
            if depth:
                raw, pos = self._scan_top(part, min(depth, n), batch, None)
                part.statistics = QueryStatistics.from_neighbours(corr.query_request, raw, pos)
            w = np.asarray(corr.weights(part), np.float32)
            ranking, pos = self._scan_top(part, k, batch, w)
            found = pos >= 0
            shown = corr.method_scores(part, np.where(found, ranking, 0))
            scores[lo : lo + len(part), :k] = np.where(found, shown, -np.inf)
            ids[lo : lo + len(part), :k] = np.where(found, self.sidecar.ids[np.maximum(pos, 0)], -1)
        return scores, ids

    def _scan_top(self, part, k: int, batch: int, w) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (values, sidecar rows) of each query over a scan of the collection: raw
        similarities (``w`` None) or the ranking ``s - w . bias`` (exactly additive methods only,
        as every attached one is)."""
        from hubless.engine.merge import merge_topk_ids

        nq = len(part)
        best = (np.full((nq, 0), -np.inf, np.float32), np.zeros((nq, 0), np.int64))
        seen = 0
        for item_ids, vectors in self.source.scan(batch):
            rows = collection_rows(self.correction, self.source, vectors, seen)
            seen += rows.shape[0]
            pos = np.minimum(np.searchsorted(self.sidecar.ids, item_ids), self.ntotal - 1)
            if (self.sidecar.ids[pos] != item_ids).any():
                raise Conflict(f"{self.source.uri} holds ids the sidecar does not: run hubless attach --update")
            values = part.vectors @ rows.T
            if w is not None:
                values = values - w @ self.sidecar.bias[pos].T
            best = merge_topk_ids(best, (values.astype(np.float32), np.broadcast_to(pos, values.shape)), k)
        return best[0].astype(np.float32), best[1]

    def _answer(self, batch, k: int, kp: int, knobs: dict):
        """One round: the store's plain top-``kp`` plus the reserve, re-scored exactly, and the
        certificate of each query (see the module docstring)."""
        from hubless.corrections import QueryStatistics

        corr = self.correction
        nq, m = len(batch), self.reserve_ids.size
        plain, found = self.source.search(batch.vectors, kp, **knobs)
        valid = found >= 0
        pos = np.minimum(np.searchsorted(self.sidecar.ids, found), self.ntotal - 1)
        unknown = valid & (self.sidecar.ids[pos] != found)
        if unknown.any():
            raise Conflict(
                f"{self.source.uri} returned id {int(found[unknown][0])}, which the sidecar does not hold: the collection changed "
                "since it was attached; run hubless attach --update"
            )
        pos = np.where(valid, pos, 0)
        request = corr.query_request
        if request.depth:  # raw top-1 (DIS/DualDIS gates), raw top-k (CSLS's shown r_q): the store's plain ranking
            batch.statistics = QueryStatistics.from_neighbours(request, plain, pos)
        # the reserve: scored exactly for every query, except where the store returned it already
        in_store = np.zeros((nq, m), bool)
        if m:
            at = np.minimum(np.searchsorted(self.reserve_ids, found), m - 1)
            hit = valid & (self.reserve_ids[at] == found)
            in_store[np.nonzero(hit)[0], at[hit]] = True
        reserve_sims = batch.vectors @ self.reserve_vectors.T if m else np.zeros((nq, 0), np.float32)
        sims = np.hstack([np.where(valid, plain, 0), reserve_sims]).astype(np.float32)
        columns = np.hstack([pos, np.broadcast_to(self.reserve_rows, (nq, m))])
        ids = np.hstack([np.where(valid, found, -1), np.broadcast_to(self.reserve_ids, (nq, m))])
        ok_slot = np.hstack([valid, ~in_store])
        ranking = np.array(corr.rank(batch, sims, columns=columns), dtype=np.float32, copy=True)
        ranking[~ok_slot] = -np.inf
        order = np.lexsort((np.where(ok_slot, ids, np.iinfo(np.int64).max), -ranking.astype(np.float64)), axis=1)[:, :k]
        top_rank = np.take_along_axis(ranking, order, axis=1)
        top_ids = np.where(np.isfinite(top_rank), np.take_along_axis(ids, order, axis=1), -1)
        n_valid = valid.sum(axis=1)
        covered = ok_slot.sum(axis=1) >= self.ntotal
        last = np.where(n_valid > 0, plain[np.arange(nq), np.maximum(n_valid - 1, 0)], np.inf).astype(np.float64)
        w = np.asarray(corr.weights(batch), np.float64)
        bound = last - w @ self.threshold
        slack = 8 * np.finfo(np.float32).eps * (np.abs(last) + np.abs(w) @ np.abs(self.threshold) + 1.0)
        kth = top_rank[:, k - 1].astype(np.float64)
        ok = covered | (np.isfinite(kth) & (kth > bound + slack))
        shown = np.where(np.isfinite(top_rank), corr.method_scores(batch, np.where(np.isfinite(top_rank), top_rank, 0)), -np.inf)
        return shown.astype(np.float32), top_ids, ok


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over rows of |found ∩ exact| / |exact| (ids; -1 marks an empty slot), blocked in
    NumPy: the recall@k of ``found`` against the exact answers ``exact``."""
    found, exact = np.asarray(found, np.int64), np.asarray(exact, np.int64)
    if found.shape[0] == 0:
        return 1.0
    hit = (found[:, :, None] == exact[:, None, :]) & (exact[:, None, :] >= 0)
    wanted = np.maximum((exact >= 0).sum(axis=1), 1)
    return float((hit.any(axis=1).sum(axis=1) / wanted).mean())


def _take(batch, rows: np.ndarray):
    weight = batch.weight
    if weight is not None and weight.ndim == 1:
        weight = weight[rows]
    return replace(batch, vectors=batch.vectors[rows], weight=weight, statistics=None)
