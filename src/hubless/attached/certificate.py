"""One round of the attached search: the store's plain top-k' and the reserve re-scored with the
sidecar's biases, each query's answer, its certificate and whether it is exact.

**Scores.** The store ranks by its plain score; the correction by the similarity of normalised
vectors. The two differ by each item's *scale* (``scale.npy``: its norm on a store that ranks by
the raw inner product of vectors the correction normalises, else 1), so a candidate's similarity
is ``s = store score / scale``: the similarity the biases, the reserve (vectors kept normalised)
and :meth:`~hubless.attached.certified.AttachedCollection.exact_search` use. Ranking:
``ranking = s - W(q) . bias(r)`` (the correction's rank hook). The raw top-1 a gated method
(DIS, DualDIS) reads is the candidates' best ``s``, ties to the lower id.

**The certificate** (:func:`certificate_bound`, the one place the bound is computed). With
``s_k'`` the k'-th store score, every item r neither a candidate nor in the reserve has store
score <= ``s_k'``, so ``s(q, r) <= s_k' / scale_min`` (``s_k' / scale_max`` when ``s_k' < 0``),
and ``bias_c(r) >= t_c`` (each column's smallest bias outside the reserve), hence

    ranking(q, r) <= bound(q) = s_k' / scale - sum_c W_c(q) t_c          (W >= 0).

An answer is **certified** when its k-th ranking is above ``bound(q)`` by more than a slack of
a few float32 ulps (an item at the bound could tie and win on a lower id), the store filled its
k' slots (a list that ran dry bounds nothing), and, for a gated method, the raw top-1 is above
the bound too (else an item outside could be the raw top-1 and change the gate). Certified is
relative to the store's plain ranking: exact over what its top-k' is.

An answer is **exact** (equal to exact corrected search over the collection as it is now) when
it is certified and the store's candidates are complete (the store searched exactly:
:meth:`~hubless.attached.sources.base.Source.searches_exactly`, or the candidates cover the
collection), and no two items the answer orders (its top-k and the best item after it; for a
gated method, the raw top-1 and second) score within the slack of each other: such a tie or
near-tie is decided by the last bits of a float32 dot product, which differ between the store's
arithmetic and another machine's BLAS (even two copies of one vector can score a bit apart in
two columns of one GEMM), so it is not claimed. The collection being the one the sidecar
describes is the caller's check (:mod:`hubless.attached.checks`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np

from hubless.hits import Hits

__all__ = ["SLACK_ULPS", "Round", "answer_round", "certificate_bound", "take_queries"]

#: The certificate's slack, and the near-tie width, in float32 ulps of the scores' magnitude.
SLACK_ULPS = 8


def certificate_bound(last: np.ndarray, weights: np.ndarray, thresholds: np.ndarray, scale_range: tuple[float, float]):
    """(bound, slack) per query: the largest ranking an item outside the candidates and the
    reserve can have (see the module docstring), from ``last`` the k'-th store score (float64;
    +inf when the store returned nothing), ``weights`` W(q) (n, c), ``thresholds`` t (c,) and the
    collection's (smallest, largest) scale; ``slack``: a few float32 ulps of the terms. Several
    sets of thresholds at once (c, m) give (n, m) bounds (the bias bands' regions)."""
    low, high = scale_range
    with np.errstate(invalid="ignore"):
        similarity = np.where(last >= 0, last / low, last / high)
    if np.ndim(thresholds) == 2:
        similarity = similarity[:, None]
    w = np.asarray(weights, np.float64)
    bound = similarity - w @ thresholds
    slack = SLACK_ULPS * np.finfo(np.float32).eps * (np.abs(similarity) + np.abs(w) @ np.abs(thresholds) + 1.0)
    return bound, slack


@dataclass
class Round:
    """One round's answers for its queries: ``scores``, ``ids``, ``found``, ``from_reserve``
    (n, k; ``from_reserve``: the hits scored from the reserve's copies of their vectors),
    ``certified`` and ``exact`` (n,), and what a band round (:mod:`hubless.attached.bands`)
    goes on from: the store's top-k' ``plain``, its k'-th score ``last``, whether it filled its
    k' slots ``full``, the k-th ranking ``kth`` and the weights W(q) ``weights`` (float64)."""

    scores: np.ndarray
    ids: np.ndarray
    found: np.ndarray
    certified: np.ndarray
    exact: np.ndarray
    from_reserve: np.ndarray
    plain: Hits
    last: np.ndarray
    full: np.ndarray
    kth: np.ndarray
    weights: np.ndarray

    def rows(self, rows: np.ndarray) -> Round:
        """The round of the queries ``rows`` only."""
        plain = Hits(self.plain.scores[rows], self.plain.ids[rows], self.plain.found[rows])
        return replace(self, plain=plain, **{f.name: getattr(self, f.name)[rows] for f in fields(self) if f.name != "plain"})

    def put(self, rows: np.ndarray, other: Round) -> None:
        """Take ``other``'s answers (a round of the queries ``rows``) for those queries."""
        for name in ("scores", "ids", "found", "certified", "exact", "from_reserve", "kth"):
            getattr(self, name)[rows] = getattr(other, name)


def answer_round(
    collection,
    batch,
    k: int,
    kp: int,
    knobs: dict,
    complete: bool,
    *,
    plain: Hits | None = None,
    extra: Hits | None = None,
    bound=None,
    last: np.ndarray | None = None,
    reserve: bool = True,
) -> Round:
    """One round for the queries of ``batch``: the store's plain top-``kp`` (with ``knobs``) plus
    the reserve, re-scored, each query's answer and its certificate (:class:`Round`).
    ``complete``: the store searched exactly with ``knobs``. A band round
    (:mod:`hubless.attached.bands`) passes the store's top-k' it had (``plain``), more of the
    store's hits to re-score with it (``extra``: the band's) and the bound they give
    (``bound(last, weights) -> (bound, slack)``; default :func:`certificate_bound`). A round
    the store ranked by the corrected score (:mod:`hubless.attached.store_ranking`) passes its
    top-k as ``plain`` and the k'-th plain score of the candidates it ranked as ``last``
    (+inf where it held fewer than k'); ``reserve=False``: what the store's answer alone
    certifies (no reserve scored; the bound then uses the collection's smallest biases)."""
    from hubless.corrections import QueryStatistics

    corr = collection.correction
    nq, m, n = len(batch), collection.reserve_ids.size if reserve else 0, collection.ntotal
    reserve_ids, reserve_rows, reserve_vectors = collection.reserve_ids[:m], collection.reserve_rows[:m], collection.reserve_vectors[:m]
    thresholds = collection.threshold if reserve else collection.b_min
    if plain is None:
        plain = collection.source.search(batch.vectors, kp, **knobs)
    valid, pos, sims = _store_hits(collection, plain)
    # the raw neighbours a correction reads (DIS/DualDIS's top-1, CSLS's top-k): the store's top-k' by similarity
    raw_order = np.lexsort((np.where(valid, plain.ids, 0), ~valid, -sims.astype(np.float64)), axis=1)
    raw_sims, raw_pos = np.take_along_axis(sims, raw_order, axis=1), np.take_along_axis(pos, raw_order, axis=1)
    request = corr.query_request
    if request.depth:
        batch.statistics = QueryStatistics.from_neighbours(request, np.where(np.isfinite(raw_sims), raw_sims, 0), raw_pos)
    store_ids, store_ok, store_pos, store_sims = plain.ids, valid, pos, sims
    if extra is not None:  # more of the store's hits: each id once per query (the first list's copy kept)
        more_ok, more_pos, more_sims = _store_hits(collection, extra)
        store_ids = np.hstack([plain.ids, extra.ids])
        store_ok = _first_copies(store_ids, np.hstack([valid, more_ok]))
        store_pos, store_sims = np.hstack([pos, more_pos]), np.hstack([sims, more_sims])
    width_store = store_ids.shape[1]
    # the reserve: scored exactly for every query, except where the store returned it already
    in_store = np.zeros((nq, m), bool)
    if m:
        at = np.minimum(np.searchsorted(reserve_ids, store_ids), m - 1)
        hit = store_ok & (reserve_ids[at] == store_ids)
        in_store[np.nonzero(hit)[0], at[hit]] = True
    reserve_sims = batch.vectors @ reserve_vectors.T if m else np.zeros((nq, 0), np.float32)
    all_sims = np.hstack([np.where(store_ok, store_sims, 0), reserve_sims]).astype(np.float32)
    columns = np.hstack([store_pos, np.broadcast_to(reserve_rows, (nq, m))])
    ids = np.hstack([store_ids, np.broadcast_to(reserve_ids, (nq, m))])
    ok_slot = np.hstack([store_ok, ~in_store])
    ranking = np.array(corr.rank(batch, all_sims, columns=columns), dtype=np.float32, copy=True)
    ranking[~ok_slot] = -np.inf
    width = min(k + 1, ranking.shape[1])
    order = np.lexsort((ids, ~ok_slot, -ranking.astype(np.float64)), axis=1)[:, :width]
    top_rank = np.take_along_axis(ranking, order, axis=1).astype(np.float64)
    found = np.take_along_axis(ok_slot, order, axis=1)
    # the certificate
    n_valid = valid.sum(axis=1)
    covered = ok_slot.sum(axis=1) >= n
    if last is None:
        full = n_valid >= kp  # the store filled its k' slots (a list that ran dry bounds nothing)
        last = np.where(n_valid > 0, plain.scores[np.arange(nq), np.maximum(n_valid - 1, 0)], np.inf).astype(np.float64)
    else:
        last = np.asarray(last, np.float64)
        full = np.isfinite(last)
    w = np.asarray(corr.weights(batch), np.float64)
    if bound is None:
        limit, slack = certificate_bound(last, w, thresholds, collection.scale_range)
    else:
        limit, slack = bound(last, w)
    kth = np.where(found[:, k - 1], top_rank[:, k - 1], -np.inf)
    certified = covered | (full & (kth > limit + slack))
    if request.top1:  # an outside item could be the raw top-1 and change the gate
        sim_bound, sim_slack = certificate_bound(last, np.zeros((nq, 0)), np.zeros(0), collection.scale_range)
        certified &= covered | (raw_sims[:, 0].astype(np.float64) > sim_bound + sim_slack)
    # exact: no near-tie among what the answer orders (same vector and biases excepted)
    tie_slack = certificate_bound(last, w, thresholds, collection.scale_range)[1]
    ties = _near_ties(top_rank, found, tie_slack)
    if request.top1 and raw_sims.shape[1] > 1:
        two = np.isfinite(raw_sims[:, :2]).all(axis=1)
        gap = raw_sims[:, 0].astype(np.float64) - raw_sims[:, 1]
        ties |= two & (gap <= tie_slack)
    top = order[:, :k]
    shown_rank = np.where(found[:, :k], top_rank[:, :k], 0).astype(np.float32)
    shown = np.where(found[:, :k], corr.method_scores(batch, shown_rank), -np.inf).astype(np.float32)
    from_reserve = (top >= width_store) & found[:, :k]
    exact = certified & ~ties & (complete | covered)
    return Round(shown, np.take_along_axis(ids, top, axis=1), found[:, :k], certified, exact, from_reserve, plain, last, full, kth, w)


def take_queries(batch, rows: np.ndarray):
    """The queries ``rows`` of ``batch`` (a :class:`~hubless.corrections.QueryBatch`), without
    their statistics (a round computes them from the store's hits)."""
    weight = batch.weight
    if weight is not None and weight.ndim == 1:
        weight = weight[rows]
    return replace(batch, vectors=batch.vectors[rows], weight=weight, statistics=None)


def _store_hits(collection, hits: Hits) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(found, sidecar rows, similarities) of the store's ``hits``: a similarity is the store's
    score over the item's scale (-inf where not found); an id the sidecar does not hold means the
    collection changed (:class:`~hubless.errors.Conflict`)."""
    from hubless.errors import Conflict

    side, n = collection.sidecar, collection.ntotal
    valid = hits.found
    pos = np.minimum(np.searchsorted(side.ids, hits.ids), n - 1)
    unknown = valid & (side.ids[pos] != hits.ids)
    if unknown.any():
        raise Conflict(
            f"{collection.source.uri} returned id {int(hits.ids[unknown][0])}, which the sidecar does not hold: the collection "
            "changed since it was attached; run hubless attach --update"
        )
    pos = np.where(valid, pos, 0)
    sims = np.where(valid, hits.scores.astype(np.float64) / collection.scale[pos], -np.inf).astype(np.float32)
    return valid, pos, sims


def _first_copies(ids: np.ndarray, found: np.ndarray) -> np.ndarray:
    """``found`` with every found slot whose id a found slot before it in its row holds cleared."""
    cols = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    order = np.lexsort((cols, ids, ~found), axis=1)
    s_ids, s_found = np.take_along_axis(ids, order, axis=1), np.take_along_axis(found, order, axis=1)
    again = np.zeros(ids.shape, bool)
    again[:, 1:] = s_found[:, 1:] & s_found[:, :-1] & (s_ids[:, 1:] == s_ids[:, :-1])
    out = found.copy()
    np.put_along_axis(out, order, np.take_along_axis(out, order, axis=1) & ~again, axis=1)
    return out


def _near_ties(top_rank: np.ndarray, found: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """Per query: two adjacent items of its top-k and the best after it rank within ``slack`` of
    each other (a tie included)."""
    both = found[:, 1:] & found[:, :-1]
    gap = np.where(both, top_rank[:, :-1] - top_rank[:, 1:], np.inf)
    return (both & (gap <= slack[:, None])).any(axis=1)
