"""The store ranks by the corrected score, in one request (issue 52, item 6).

With the bias written into the collection (``hubless attach --write-payload``: the payload field
or column ``hubless_bias``, one per bias column), a store whose query language can compute an
expression ranks by the corrected score itself: its plain top-k' through its own index, then
re-ordered by ``s - W(q) . bias`` over the field, and only the best k come back.

* **Qdrant** (a server through ``qdrant-client``, 1.14 or newer, qdrant-client's local engine, and
  the in-process engine ``qdrant-edge-py``): the Query API, a prefetch of k' by the dense vector
  and a formula query ``$score - w * hubless_bias`` (``FormulaQuery`` / ``qdrant_edge.Formula``),
  and in the same batch request the plain query at offset k' - 1, whose one point gives s_k'.
* **pgvector**: one SQL statement per batch: the index's top-k' as a subquery (``ORDER BY
  embedding <#> q LIMIT k'``), re-ordered by ``s - w * hubless_bias``, with the k'-th plain score
  and the count as window functions over the subquery.
* **LanceDB, Milvus, Chroma**: their query APIs cannot order by an expression over a column
  (LanceDB orders a vector query by its distance only; its ``rerank()`` hook runs a ``Reranker``
  in the client over the k' rows returned, which is what hubless's own re-scoring does; Milvus's
  Boost Ranker multiplies or adds a constant weight to the hits a filter matches, a step function
  of the bias at best; Chroma has no ranking function): refused, naming the stores that can.

hubless certifies from what comes back (:func:`store_round`): the k hits' plain scores (Qdrant
returns the formula's value: the plain score is that plus ``w . bias`` of the hit's field), the
reserve scored locally as always, and the single bound of
:func:`~hubless.attached.certificate.certificate_bound` with the store's s_k'. A query left
uncertified goes on as an ordinary search (the store's plain top-k', its bands, widening), so the
answers are the same as :meth:`~hubless.attached.certified.AttachedCollection.search_certified`
gives, in one request for the queries certified at once. Methods whose weight reads the query's
raw neighbours (DIS, DualDIS, CSLS: a second request first) are refused.

A user whose own clients query the store can send the same request with no hubless in the query
path (:func:`store_formula` gives the field and the weight): ``docs/how-to/corrected-store-queries.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hubless._validation import check_positive_int, check_top_k
from hubless.attached import checks
from hubless.attached.beam import beam_knobs
from hubless.attached.certificate import answer_round, take_queries
from hubless.attached.sources.base import field_names
from hubless.errors import InvalidInput
from hubless.hits import Hits

__all__ = ["StoreFormula", "check_store_ranking", "ranked_in_store", "store_formula", "store_round"]


@dataclass(frozen=True)
class StoreFormula:
    """What a store's own query needs to rank by the corrected score: ``ranking = s - sum_c
    weights[c] * fields[c]`` (``weights`` W, constant for the methods a store can rank by)."""

    fields: tuple[str, ...]
    weights: tuple[float, ...]


def check_store_ranking(collection) -> tuple[str, ...]:
    """The payload fields a store ranking reads; :class:`~hubless.errors.InvalidInput` naming why
    when the collection's store, sidecar or method cannot rank in the store."""
    source, corr = collection.source, collection.correction
    if not getattr(source, "ranks_corrected", False):
        raise InvalidInput(
            f"{source.kind} collection {source.uri} cannot rank by an expression over a field in its own query "
            "(Qdrant's formula queries and pgvector's SQL can): search it without in_store"
        )
    payload = collection.sidecar.info.get("payload") or {}
    if not payload.get("fields"):
        raise InvalidInput(
            f"the sidecar of {source.uri} records no bias written into the collection: attach with --write-payload "
            "(write_payload=True) so that the store can rank by it"
        )
    if corr.query_request.depth:
        raise InvalidInput(
            f"{corr.spec} weighs each query by its raw neighbours (a search first): the store cannot rank by it in one request"
        )
    return field_names(payload["fields"])


def store_formula(collection, **weight) -> StoreFormula:
    """The field(s) and weight(s) a store's own query ranks by: ``s - sum_c weights[c] *
    fields[c]`` (``weight``: the correction's weight override, ``weight=``).
    Refused (:class:`~hubless.errors.InvalidInput`) for a method whose weight depends on the query."""
    fields = check_store_ranking(collection)
    corr = collection.correction
    w = np.asarray(corr.weights(corr.queries(np.ones((2, collection.sidecar.info["dim"]), np.float32), **weight)), np.float64)
    if not np.all(w == w[0]):  # pragma: no cover - the methods check_store_ranking lets through have one weight
        raise InvalidInput(f"{corr.spec} weighs each query differently: no one formula ranks for it")
    return StoreFormula(fields, tuple(float(v) for v in w[0]))


def store_round(collection, batch, k: int, kp: int, knobs: dict, complete: bool, fallback):
    """The first round of a search the store ranks (see the module docstring): one request for
    the queries of ``batch``, re-scored and certified; the queries it leaves uncertified answered
    by ``fallback(collection, batch_rows, k, kp, knobs, complete)`` (the ordinary round)."""
    fields = check_store_ranking(collection)
    w = np.asarray(collection.correction.weights(batch), np.float64)
    hits, last = collection.source.search_corrected(batch.vectors, k, kp, w, fields, **knobs)
    got = answer_round(collection, batch, k, kp, knobs, complete, plain=hits, last=last)
    rows = np.flatnonzero(~got.certified)
    if rows.size:
        got.put(rows, fallback(collection, take_queries(batch, rows), k, kp, knobs, complete))
    return got


def ranked_in_store(collection, queries, top_k: int = 10, *, candidates: int | None = None, **options):
    """What a client that queries the store directly gets, and what the certificate says of it:
    the store's own corrected top-``top_k`` among its plain top-``candidates`` (default 8 x
    top_k), one request, as :class:`~hubless.Hits` with the store's ranking (re-scored by hubless
    with the sidecar's biases: the same order) and per query ``certified`` and ``exact`` (the
    reserve, which a client's query does not see, is left out: an answer it would change is not
    certified). ``options``: the weight (``alpha=``, ``weight=``) and the store's knobs."""
    check_store_ranking(collection)
    corr = collection.correction
    top_k = check_top_k(top_k, collection.ntotal, "the collection")
    weight = {k: options.pop(k) for k in list(options) if k in (corr.weight_param, "weight")}
    batch = corr.queries(queries, **weight)
    knobs = collection.source.check_knobs(options)
    k = min(top_k, collection.ntotal)
    kp = min(check_positive_int(candidates, "candidates") if candidates is not None else 8 * k, collection.ntotal)
    kp = max(kp, k)
    with collection.lock:
        checks.ensure_fresh(collection)
        knobs = beam_knobs(collection.beam, knobs, kp)
        complete = collection.source.searches_exactly(knobs) and collection.sidecar.digests is not None
        fields = check_store_ranking(collection)
        w = np.asarray(corr.weights(batch), np.float64)
        hits, last = collection.source.search_corrected(batch.vectors, k, kp, w, fields, **knobs)
        got = answer_round(collection, batch, k, kp, knobs, complete, plain=hits, last=last, reserve=False)
    n = len(batch)
    scores = np.full((n, top_k), -np.inf, np.float32)
    ids = np.full((n, top_k), -1, np.int64)
    found = np.zeros((n, top_k), bool)
    scores[:, :k], ids[:, :k], found[:, :k] = got.scores, got.ids, got.found
    used = np.full(n, kp)
    return Hits.from_found(scores, ids, found, certified=got.certified, exact=got.exact, candidates=used, method=collection.spec)
