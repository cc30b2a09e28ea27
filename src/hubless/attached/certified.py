"""Corrected search of an attached collection through the store's own ANN: answers that say
whether they are *certified* and whether they are *exact*.

**Search** (:class:`AttachedCollection`): the store's own search gives each query its k' >= k
best *plain* candidates, which are re-scored exactly with the sidecar's biases through the
correction's rank hook, ``ranking = s - W(q) . bias(r)``, next to the *reserve* (the items of
smallest bias, whose vectors the sidecar keeps: the items a correction promotes most, scored on
every search). One round, its scores and its certificate are
:func:`hubless.attached.certificate.answer_round`; the bound is
:func:`hubless.attached.certificate.certificate_bound`. Uncertified queries are asked again with
k' doubled, up to ``max_candidates``. On an ANN store the store's beam is the one attach chose
from the store's measured recall (:mod:`hubless.attached.beam`) unless the caller gives one.

Two promises, per query (``Hits.certified``, ``Hits.exact``):

* **certified**: no item outside the candidates and the reserve can enter the top-k: the answer
  is exact *relative to the store's plain ranking* (exact over what its top-k' is);
* **exact**: the top-k equals exact corrected search over the collection as it is now
  (:meth:`AttachedCollection.exact_search`): certified, over candidates known complete (a store
  that searched exactly, or candidates covering the collection), without a near-tie decided by
  float32 rounding, on a collection the checks of :mod:`hubless.attached.checks` found to be
  the one the sidecar describes. Through an ANN index an answer is never claimed exact.

Any int64 is an id (negative ones too): the answer is a :class:`~hubless.Hits`, whose ``found``
mask says which slots hold a hit. :meth:`AttachedCollection.evaluate` measures the attached
search against :meth:`AttachedCollection.exact_search` (a full scan): recall@k and the shares
certified and exact.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np

from hubless._deprecation import deprecated_names
from hubless._validation import check_positive_int, check_top_k
from hubless.attached import checks
from hubless.attached.bands import CollectionBands
from hubless.attached.beam import beam_knobs
from hubless.attached.certificate import Round, answer_round, take_queries
from hubless.attached.prepare import collection_rows, correction_for
from hubless.attached.sidecar import Sidecar, read_sidecar, same_collection, source_address
from hubless.attached.sources.base import BATCH, Source, open_source
from hubless.attached.store_ranking import check_store_ranking, store_round
from hubless.engine.topk import NO_ID
from hubless.errors import Conflict, InvalidType
from hubless.hits import Hits

__all__ = ["AttachedCollection", "recall_at_k"]

#: Default first k' (candidates per query) as a multiple of top_k.
CANDIDATE_FACTOR = 8
#: Default largest k': this many times top_k (at least 1024), at most the collection.
MAX_FACTOR = 64
#: Candidate slots (queries x (k' + reserve)) re-scored at once by a search (bounds its temporaries).
ANSWER_ELEMENTS = 1 << 22
#: Queries ranked per scan by :meth:`AttachedCollection.exact_search` (bounds its memory).
EXACT_QUERY_BLOCK = 1024

#: ``AttachedResult`` is now :class:`hubless.Hits` (deprecated name, removed in 0.2.0)
__getattr__ = deprecated_names(__name__, {"AttachedResult": "hubless.hits:Hits"})


class AttachedCollection:
    """A collection with its attached sidecar: corrected search through the store's own ANN,
    certified and, where it can be, exact (see the module docstring). Open one with
    :meth:`open` or :meth:`from_sidecar`."""

    def __init__(self, source: Source, sidecar: Sidecar, *, verify: bool = True) -> None:
        self.source = source
        #: one search (its checks, a sidecar read again, its rounds) at a time: a served handle's
        #: threads never see half of a new sidecar
        self.lock = threading.RLock()
        self._load(sidecar)
        if verify:
            checks.verify_open(self)

    def _load(self, sidecar: Sidecar) -> None:
        """Take ``sidecar``'s arrays and what is derived from them."""
        self.sidecar = sidecar
        #: the sidecar version read (its CURRENT file's mark): a newer one is read before a search
        self.sidecar_mark = checks.sidecar_mark(sidecar)
        info = sidecar.info
        self.correction = correction_for(info["spec"], bool(info["normalize"])).for_rows(sidecar.bias, sidecar.statistics)
        self.b_min = np.asarray(info["b_min"], np.float64)
        #: each bias column's smallest value outside the reserve: the certificate's bound
        self.threshold = np.asarray(info["reserve"]["threshold"], np.float64)
        self.reserve_ids = sidecar.reserve_ids
        self.reserve_vectors = sidecar.reserve_vectors
        self.reserve_rows = np.searchsorted(sidecar.ids, sidecar.reserve_ids)
        #: each item's store score over its similarity (see hubless.attached.certificate)
        self.scale = np.ones(sidecar.ids.size, np.float32) if sidecar.scale is None else sidecar.scale
        self.scale_range = (float(self.scale.min()), float(self.scale.max())) if self.scale.size else (1.0, 1.0)
        #: the default beam attach chose from the store's measured recall (None: none recorded)
        self.beam = info.get("beam")
        #: the source's version mark the sidecar is in step with (hubless.attached.checks)
        self.mark = info["source"].get("version")
        self.checked_at = time.monotonic()
        #: the bias bands of the tighter certificate, where the store can search them (None: it cannot)
        self.bands = CollectionBands.of(self)

    def reload(self) -> bool:
        """Read the sidecar again when an update wrote a new version of it since (True when it
        did; a long-lived handle, ``hubless serve``, calls this before each search), checked as
        an open is."""
        if self.sidecar.path is None or checks.sidecar_mark(self.sidecar) == self.sidecar_mark:
            return False
        self._load(read_sidecar(self.sidecar.path))
        checks.verify_open(self)
        return True

    @classmethod
    def open(cls, source, sidecar, **source_options) -> AttachedCollection:
        """The collection ``source`` with the sidecar directory ``sidecar``; refused
        (:class:`~hubless.errors.Conflict`) when the sidecar is another collection's, or when the
        collection changed since the sidecar was written (run :func:`update`; what is checked:
        :mod:`hubless.attached.checks`)."""
        found = read_sidecar(sidecar)
        src = open_source(source, **source_options)
        if isinstance(source, (str, Path)) and not same_collection(src, found):
            from hubless.export.base import without_password

            raise Conflict(
                f"sidecar {sidecar} is attached to {without_password(found.info['source']['uri'])}, not {src.uri}: "
                f"give the collection it was attached to, or attach {src.uri} to another --out"
            )
        return cls(src, found)

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
        """Check that the collection is the one the sidecar describes, as an open does
        (:func:`hubless.attached.checks.verify_open`): :class:`~hubless.errors.Conflict` naming
        what changed."""
        checks.verify_open(self)

    def search(self, queries, top_k: int = 10, **options) -> Hits:
        """:meth:`search_certified` (its :class:`~hubless.Hits` unpacks to (scores, ids), as
        :meth:`hubless.Index.search` returns)."""
        return self.search_certified(queries, top_k, **options)

    def search_certified(
        self,
        queries,
        top_k: int = 10,
        *,
        candidates: int | None = None,
        max_candidates: int | None = None,
        metadata: bool = False,
        in_store: bool = False,
        **options,
    ) -> Hits:
        """Corrected top-``top_k`` through the store's plain search (see the module docstring):
        :class:`~hubless.Hits` with per query ``certified``, ``exact`` and ``candidates`` (the
        k' it was answered with).

        ``candidates``: the first k' (default ``8 * top_k``); ``max_candidates``: the largest k'
        an uncertified query is widened to (default ``max(1024, 64 * top_k)``, at most the
        collection). ``options``: the correction's weight (``alpha=``, ``lam=``, ``weight=``) and
        the store's search knobs (``nprobe``, ``ef_search``, ``exact``, ...; without the beam's
        knob, the beam attach chose). ``metadata``: also read the hits' metadata from the store
        (its payload or other columns, by id; one read for the batch). A ``top_k`` beyond the
        collection keeps the width: the slots past it are not ``found`` (the one top-k rule,
        :func:`hubless._validation.check_top_k`). ``in_store``: the store ranks the first round
        by the corrected score over the payload ``--write-payload`` wrote, in one request
        (Qdrant's formula query, pgvector's SQL: :mod:`hubless.attached.store_ranking`); the
        queries it leaves uncertified go on as without it.
        """
        for name, flag in (("metadata", metadata), ("in_store", in_store)):
            if not isinstance(flag, (bool, np.bool_)):
                raise InvalidType(f"{name} must be True or False; got {flag!r}")
        if in_store:
            check_store_ranking(self)  # refused before anything is searched, naming why
        with self.lock:
            return self._search(queries, top_k, candidates, max_candidates, bool(metadata), bool(in_store), options)

    def _search(self, queries, top_k, candidates, max_candidates, metadata: bool, in_store: bool, options: dict) -> Hits:
        corr = self.correction
        n = self.ntotal
        top_k = check_top_k(top_k, n, "the collection")  # the one top-k rule: beyond the items, padded
        weight = {k: options.pop(k) for k in list(options) if k in (corr.weight_param, "weight")}
        batch = corr.queries(queries, **weight)
        knobs = self.source.check_knobs(options)
        depth = corr.query_request.depth
        k = min(top_k, n)
        first = check_positive_int(candidates, "candidates") if candidates is not None else CANDIDATE_FACTOR * k
        limit = check_positive_int(max_candidates, "max_candidates") if max_candidates is not None else max(1024, MAX_FACTOR * k)
        limit = min(max(limit, k), n)
        first = min(max(first, k, depth, 2 if depth else 1), limit if candidates is None else n)
        checks.ensure_fresh(self)
        nq = len(batch)
        scores = np.full((nq, top_k), -np.inf, np.float32)
        ids = np.full((nq, top_k), -1, np.int64)
        found = np.zeros((nq, top_k), bool)
        served = np.zeros((nq, top_k), bool)  # hits scored from the reserve's copies
        certified, exact = np.zeros(nq, bool), np.zeros(nq, bool)
        used = np.zeros(nq, np.int64)
        todo = np.arange(nq)
        kp = first
        while todo.size:
            ok = np.zeros(todo.size, bool)
            round_knobs = beam_knobs(self.beam, knobs, kp)
            complete = self.source.searches_exactly(round_knobs) and self.sidecar.digests is not None
            step = max(1, ANSWER_ELEMENTS // (kp + self.reserve_ids.size))  # queries per round: bounded temporaries
            for lo in range(0, todo.size, step):
                rows = todo[lo : lo + step]
                part = batch.rows(0, nq) if rows.size == nq else take_queries(batch, rows)
                if in_store and kp == first:  # ranked by the store, the uncertified queries by _round
                    got = store_round(self, part, k, kp, round_knobs, complete, _round)
                else:
                    got = _round(self, part, k, kp, round_knobs, complete)
                scores[rows, :k], ids[rows, :k], found[rows, :k], served[rows, :k] = got.scores, got.ids, got.found, got.from_reserve
                certified[rows], exact[rows], used[rows] = got.certified, got.exact, kp
                ok[lo : lo + step] = got.certified
            if kp >= limit:
                break
            todo = todo[~ok]
            kp = min(2 * kp, limit)
        checks.check_hits(self, ids[found], served[found])
        records = None
        if metadata:
            shown = np.unique(ids[found])
            records = dict(zip(shown.tolist(), self.source.payloads(shown)))
        return Hits.from_found(scores, ids, found, certified=certified, exact=exact, candidates=used, metadata=records, method=self.spec)

    def evaluate(self, queries, top_k: int = 10, **options) -> dict:
        """The attached search measured against exact corrected search (:meth:`exact_search`,
        a full scan) on ``queries``: ``recall`` = mean over queries of
        |attached top-k ∩ exact top-k| / |exact top-k| (recall@k, 1.0 when every answer is the
        exact one; hits read from the ``found`` masks, so any id counts), ``certified`` and
        ``exact`` = the shares of queries whose answer carries each promise (see the module
        docstring), ``wrong_exact`` = the queries claimed exact whose top-k differs from the
        exact one (0 when the promise holds), ``candidates`` = the mean k' used, with ``top_k``
        and ``queries`` (their count). ``options`` as :meth:`search_certified` (the weight
        applies to both searches). Reads the whole collection: for evaluation only."""
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
        want = self.exact_search(queries, max(ks), **weight)
        rows = []
        for k in ks:
            result = self.search_certified(queries, k, **options)
            top = want.with_fields(scores=want.scores[:, :k], ids=want.ids[:, :k], found=want.found[:, :k])
            claimed = np.asarray(result.exact, bool)
            same = (result.found == top.found).all(axis=1) & ((result.ids == top.ids) | ~top.found).all(axis=1)
            rows.append(
                {
                    "top_k": int(k),
                    "queries": int(result.n_queries),
                    "recall": recall_at_k(result, top),
                    "certified": _share(result.certified),
                    "exact": _share(result.exact),
                    "wrong_exact": int((claimed & ~same).sum()),
                    "candidates": float(np.mean(np.asarray(result.candidates, np.float64))) if result.n_queries else 0.0,
                }
            )
        return rows

    def exact_search(self, queries, top_k: int = 10, *, batch: int = BATCH, **weight) -> Hits:
        """Exact corrected search over every item of the collection, by brute force: the
        collection is scanned (twice for DIS/DualDIS/CSLS, whose raw top neighbours come
        first) and every item ranked ``s - W(q) . bias`` with the sidecar's biases, ties to the
        lower id; :class:`~hubless.Hits` as :meth:`search` (every answer ``exact``). What
        :meth:`search` is measured against (``hubless attach --search Q --exact``); it reads
        the whole collection, so it is for evaluation, not serving."""
        with self.lock:
            return self._exact_search(queries, top_k, batch, weight)

    def _exact_search(self, queries, top_k, batch, weight: dict) -> Hits:
        from hubless.corrections import QueryStatistics

        corr = self.correction
        top_k = check_top_k(top_k, self.ntotal, "the collection")
        batch = check_positive_int(batch, "batch")
        all_queries = corr.queries(queries, **weight)
        checks.ensure_fresh(self)
        n, nq = self.ntotal, len(all_queries)
        k = min(top_k, n)
        depth = corr.query_request.depth
        scores = np.full((nq, top_k), -np.inf, np.float32)
        ids = np.full((nq, top_k), -1, np.int64)
        found = np.zeros((nq, top_k), bool)
        for lo in range(0, nq, EXACT_QUERY_BLOCK):
            part = all_queries.rows(lo, min(nq, lo + EXACT_QUERY_BLOCK))
            if depth:
                raw, pos = self._scan_top(part, min(depth, n), batch, None)
                part.statistics = QueryStatistics.from_neighbours(corr.query_request, raw, pos)
            w = np.asarray(corr.weights(part), np.float32)
            ranking, pos = self._scan_top(part, k, batch, w)
            hit = (pos != NO_ID) & np.isfinite(ranking)
            shown = corr.method_scores(part, np.where(hit, ranking, 0))
            scores[lo : lo + len(part), :k] = np.where(hit, shown, -np.inf)
            ids[lo : lo + len(part), :k] = self.sidecar.ids[np.maximum(pos, 0)]
            found[lo : lo + len(part), :k] = hit
        every = np.ones(nq, bool)
        return Hits.from_found(scores, ids, found, certified=every, exact=every, method=self.spec)

    def _scan_top(self, part, k: int, batch: int, w) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (values, sidecar rows; ``NO_ID`` for an empty slot) of each query over a scan
        of the collection: raw similarities (``w`` None) or the ranking ``s - w . bias`` (exactly
        additive methods only, as every attached one is), ties to the lower row (the lower id).
        The scan compares every vector with its digest: a collection changed in place is refused."""
        from hubless.attached.digests import vector_digests
        from hubless.engine.merge import merge_topk_ids

        nq = len(part)
        best = (np.full((nq, 0), -np.inf, np.float32), np.zeros((nq, 0), np.int64))
        for item_ids, vectors in self.source.scan(batch):
            rows = collection_rows(self.correction, self.source, vectors, item_ids)
            pos = np.minimum(np.searchsorted(self.sidecar.ids, item_ids), self.ntotal - 1)
            if (self.sidecar.ids[pos] != item_ids).any():
                raise Conflict(f"{self.source.uri} holds ids the sidecar does not: run hubless attach --update")
            if self.sidecar.digests is not None and (vector_digests(vectors) != self.sidecar.digests[pos]).any():
                raise Conflict(f"{self.source.uri} holds vectors changed since it was attached: run hubless attach --update --full")
            values = part.vectors @ rows.T
            if w is not None:
                values = values - w @ self.sidecar.bias[pos].T
            best = merge_topk_ids(best, (values.astype(np.float32), np.broadcast_to(pos, values.shape)), k)
        return best[0].astype(np.float32), best[1]


def _round(collection, batch, k: int, kp: int, knobs: dict, complete: bool) -> Round:
    """One round: the store's plain top-``kp`` and the reserve re-scored and certified
    (:func:`~hubless.attached.certificate.answer_round`), then the band certificate for the
    queries it left uncertified (:mod:`hubless.attached.bands`)."""
    got = answer_round(collection, batch, k, kp, knobs, complete)
    if collection.bands is not None and not got.certified.all():
        got = collection.bands.tighten(collection, batch, got, k, kp, knobs, complete)
    return got


def recall_at_k(found: Hits, exact: Hits) -> float:
    """Mean over queries of |found ∩ exact| / |exact|: the recall@k of the answers ``found``
    against the exact answers ``exact``, both :class:`~hubless.Hits` (a slot counts when its
    ``found`` is set, whatever its id: any int64 is an id), blocked in NumPy."""
    if not isinstance(found, Hits) or not isinstance(exact, Hits):
        raise InvalidType("recall_at_k compares two hubless.Hits (their found masks say which slots are hits)")
    if found.n_queries == 0:
        return 1.0
    hit = (found.ids[:, :, None] == exact.ids[:, None, :]) & found.found[:, :, None] & exact.found[:, None, :]
    wanted = np.maximum(exact.found.sum(axis=1), 1)
    return float((hit.any(axis=1).sum(axis=1) / wanted).mean())


def _share(flags) -> float:
    flags = np.asarray(flags, bool)
    return float(flags.mean()) if flags.size else 1.0
