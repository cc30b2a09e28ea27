"""Bias bands: the attached search's tighter certificate on hub-prone data (issue 52, item 5).

The single bound of :mod:`hubless.attached.certificate` treats every item outside the candidates
(the store's plain top-k' and the reserve) as if it had the smallest bias outside the reserve,
``t[c]``: ``ranking(q, r) <= s_k' - W(q) . t``. On strongly hub-prone data it certifies few
queries: the hubs that fill the plain top-k' carry large biases, so the corrected top-k lies far
down the plain ranking, among items of low bias the store's top-k' never reached.

A *band* ``F_j`` is the set of items with some bias column below the band's edge ``E_j[c]``
(each column's :data:`BAND_SHARES` ``[j]`` quantile over the items outside the reserve: an
actual bias value, so the store's comparison and numpy's agree to the bit; bands are nested,
``F_0 ⊂ F_1 ⊂ ...``). The store is asked for its plain top-k'' *within a band*, through its own
filter: a range over the payload field ``hubless attach --write-payload`` wrote
(:class:`BandFilter` ``fields``; on Qdrant, LanceDB and pgvector a point or row without the
field counts as in the band), or for a FAISS file by the band's positions (``members``: a
small band scanned exactly over its own vectors, a larger one searched with a selector).
``f_j[c]`` is each column's smallest bias outside the reserve and outside ``F_j``
(>= ``E_j[c]``); ``s''_j`` the k''-th plain score the band's query returned (-inf when it
returned the whole band; s_k' when it ran dry short of it).

**The bound.** A query asked within bands ``j_0 ⊃ j_1 ⊃ ... ⊃ j_L`` (largest first) splits the
items outside its candidates (store top-k', the bands' top-k'', the reserve) into regions, each
with a largest store score ``u`` and smallest biases ``f``:

    outside F_{j_0}:                 u = s_k',                          f = f_{j_0}
    in F_{j_l}, outside F_{j_l+1}:   u = min(s_k', s''_{j_0..j_l}),     f = f_{j_l+1}
    in F_{j_L}:                      u = min(s_k', s''_{j_0..j_L}),     f = t        (not in the reserve)

so, as ``W(q) >= 0``, every such item ranks at most ``bound(q) = max over regions of
(u - W(q) . f)`` (each term through :func:`~hubless.attached.certificate.certificate_bound`,
with its store-scale conversion and float32 slack), and the answer is certified when its k-th
ranking is strictly above ``bound(q)``. With no band this is the single bound.

**The bands a query is asked in** (:meth:`CollectionBands.tighten`, only for queries the single
bound left uncertified, at the same depth k'' = k'): first the smallest band whose outside
region already lies below the k-th candidate (:meth:`Bands.first`; the largest when none does);
then, while uncertified, the largest band inside the last one whose ring already lies below it
(:meth:`Bands.lower`), up to :data:`BAND_ROUNDS` bands. Each band's hits are re-scored exactly
with the others (a band changes which answers are certified, never an answer's scores). Queries
still uncertified are widened (k' doubled) as before. Measured on the strongly hub-prone
synthetic set (``cone=0.5``, 100k x 256): the queries certified at k' = 80 on an exact store go
from 11% to 98% with NNN, from 6% to 96% with IS (``benchmarks/attach.py --hub-prone``).

The certificate is relative to the store's ranking, as the single bound is: exact on a store
that searches exactly, its filtered search included (a FAISS Flat file, LanceDB without an
index, a Qdrant or pgvector collection searched exactly); through an ANN index it holds over
what the index's plain and filtered top-k' are. A store's band filter reads the field hubless
wrote, so bands are used only where the sidecar records that field as written (``update``
keeps it in step; a value someone else changed under the field is not seen).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hubless.attached.certificate import Round, answer_round, certificate_bound, take_queries
from hubless.attached.sources.base import BandFilter, field_names
from hubless.hits import Hits

__all__ = ["BAND_ROUNDS", "BAND_SHARES", "BandFilter", "Bands", "CollectionBands", "make_bands"]

#: Each band's edge: this share of the items outside the reserve lies below it (per bias column).
BAND_SHARES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 0.9, 0.95, 0.98)
#: Band queries at most per query and round (the first band, then bands nested inside it).
BAND_ROUNDS = 3


@dataclass(frozen=True)
class Bands:
    """The bands of one sidecar (see the module docstring): ``edges`` (n_bands, n_columns)
    float32, ``floors`` (n_bands, n_columns) float64 (``f_j``; +inf where no item outside the
    reserve lies outside the band), ``threshold`` (n_columns,) float64 (``t``) and ``sizes``
    (n_bands,) the items of each band (the reserve's included, as the store's filter counts them)."""

    edges: np.ndarray
    floors: np.ndarray
    threshold: np.ndarray
    sizes: np.ndarray

    def __len__(self) -> int:
        return int(self.edges.shape[0])

    def members(self, band: int, bias: np.ndarray) -> np.ndarray:
        """Which rows of ``bias`` (n, n_columns) are in ``band``: some column below its edge."""
        return (np.asarray(bias) < self.edges[band][None, :]).any(axis=1)

    def regions(self, ub: np.ndarray, w: np.ndarray, scale_range) -> np.ndarray:
        """(n_queries, n_bands + 1): the largest ranking (its slack added) of an item whose store
        score is at most ``ub`` and whose biases are at least each band's floors ``f_j`` (the
        last column: the threshold t), through :func:`certificate_bound`; -inf where no item can
        be (a band holding every item outside the reserve has no outside; ``ub`` = -inf)."""
        floors = np.vstack([self.floors, self.threshold[None, :]])
        some = np.isfinite(floors).all(axis=1)
        bound, slack = certificate_bound(ub, w, np.where(some[:, None], floors, 0.0).T, scale_range)
        with np.errstate(invalid="ignore"):
            out = bound + slack
        return np.where(some[None, :] & (ub > -np.inf)[:, None], out, -np.inf)

    def first(self, last: np.ndarray, w: np.ndarray, kth: np.ndarray, scale_range) -> np.ndarray:
        """Each query's first band: the smallest whose outside (items outside it and the
        candidates) lies strictly below its k-th candidate ``kth``, else the largest."""
        fits = self.regions(last, w, scale_range)[:, :-1] < kth[:, None]
        return np.where(fits.any(axis=1), fits.argmax(axis=1), len(self) - 1)

    def lower(self, band: np.ndarray, ub: np.ndarray, w: np.ndarray, kth: np.ndarray, scale_range) -> np.ndarray:
        """Each query's next band inside its last one ``band``: the largest band i below it whose
        ring (in ``band``, outside i; store scores at most ``ub``) lies strictly below ``kth``,
        so that only band i itself is left to search; -1 where none does."""
        fits = (np.arange(len(self))[None, :] < band[:, None]) & (self.regions(ub, w, scale_range)[:, :-1] < kth[:, None])
        return np.where(fits.any(axis=1), len(self) - 1 - fits[:, ::-1].argmax(axis=1), -1)

    def bound(self, queried: np.ndarray, band_last: np.ndarray, scale_range):
        """``bound(last, w) -> (bound, 0)`` (the slack added in) over nested bands: ``queried``
        (n, r) each query's bands, largest first (-1: none that round), ``band_last`` (n, r)
        each one's k''-th store score s'' (-inf when the query returned the whole band, +inf
        when it ran dry short of it: then its items are bounded by s_k' alone). Regions: outside
        the first band (s_k', f_first); each ring between a band and the next (the least s''
        so far, f_next); the innermost band (the least s'', t). See the module docstring."""
        t_column = len(self)

        def bound(last: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            rows = np.arange(last.size)
            out = self.regions(last, w, scale_range)[rows, np.where(queried[:, 0] >= 0, queried[:, 0], t_column)]
            ub = last.copy()
            for r in range(queried.shape[1]):
                has = queried[:, r] >= 0
                ub = np.where(has, np.minimum(ub, band_last[:, r]), ub)
                inner = queried[:, r + 1] if r + 1 < queried.shape[1] else np.full(last.shape, -1)
                ring = self.regions(ub, w, scale_range)[rows, np.where(inner >= 0, inner, t_column)]
                out = np.maximum(out, np.where(has, ring, -np.inf))
            return out, np.zeros(last.shape)

        return bound


def make_bands(bias: np.ndarray, outside: np.ndarray, threshold, shares=BAND_SHARES) -> Bands | None:
    """The bands of a collection's ``bias`` (n, n_columns) float32, ``outside`` the rows not in
    the reserve, ``threshold`` each column's smallest bias outside it; None when fewer than two
    items lie outside the reserve (the single bound is then as good). Each edge is an actual
    bias value (so a store compares the field it holds with it exactly); equal edges are merged."""
    bias = np.asarray(bias, np.float32)
    outside = np.asarray(outside, bool)
    rest = bias[outside]
    m = rest.shape[0]
    if m < 2:
        return None
    picks = sorted({min(m - 1, max(1, int(share * m))) for share in shares})
    edges = np.sort(rest, axis=0)[picks]  # (n_bands, n_columns): that share of the items outside the reserve below each
    edges = edges[np.r_[True, (np.diff(edges, axis=0) != 0).any(axis=1)]]
    floors = np.empty(edges.shape, np.float64)
    sizes = np.empty(len(edges), np.int64)
    for j, edge in enumerate(edges):
        inside = (bias < edge[None, :]).any(axis=1)
        beyond = ~inside[outside]
        floors[j] = rest[beyond].min(axis=0) if beyond.any() else np.inf
        sizes[j] = int(inside.sum())
    return Bands(edges, floors, np.asarray(threshold, np.float64), sizes)


class CollectionBands:
    """The bands of an attached collection, built on first use, and its band rounds
    (:meth:`tighten`). :meth:`of` gives None where the store cannot search a band: a store whose
    sidecar records no payload field written (``--write-payload``), or one without a filter."""

    def __init__(self, sidecar, source, fields: tuple[str, ...] | None, key) -> None:
        self.sidecar, self.source, self.fields, self.key = sidecar, source, fields, key
        self._bands: Bands | None = None
        self._built = False

    @classmethod
    def of(cls, collection) -> CollectionBands | None:
        payload = collection.sidecar.info.get("payload") or {}
        written = field_names(payload["fields"]) if payload.get("fields") else None
        if not collection.source.searches_bands(written):
            return None
        mark = collection.sidecar_mark
        return cls(collection.sidecar, collection.source, written, (id(collection.sidecar), *(mark or ())))

    @property
    def bands(self) -> Bands | None:
        if not self._built:
            side = self.sidecar
            outside = ~np.isin(side.ids, side.reserve_ids)
            threshold = np.asarray(side.info["reserve"]["threshold"], np.float64)
            self._bands, self._built = make_bands(side.bias, outside, threshold), True
        return self._bands

    def band_filter(self, band: int) -> BandFilter:
        bands = self.bands
        assert bands is not None
        side = self.sidecar
        return BandFilter(
            tuple(float(e) for e in bands.edges[band]), self.fields, lambda: side.ids[bands.members(band, side.bias)], (*self.key, band)
        )

    def tighten(self, collection, batch, got: Round, k: int, kp: int, knobs: dict, complete: bool) -> Round:
        """``got`` (a round of the queries of ``batch``) with each query it left uncertified, whose
        store list was full, asked within bias bands at the same depth ``kp``: first its band
        (:meth:`Bands.first`), then, while still uncertified, up to :data:`BAND_ROUNDS` - 1 bands
        nested inside it (:meth:`Bands.lower`); after each, the hits so far are re-scored and
        certified with the nested bound (:meth:`Bands.bound`)."""
        bands = self.bands
        rows = np.flatnonzero(~got.certified & got.full & np.isfinite(got.last))
        if bands is None or not rows.size:
            return got
        sub = got.rows(rows)
        scale, last, w, kth = collection.scale_range, sub.last, sub.weights, sub.kth.copy()
        n, rounds = rows.size, BAND_ROUNDS
        queried, band_last = np.full((n, rounds), -1), np.full((n, rounds), np.inf)
        scores = np.full((n, rounds * kp), -np.inf, np.float32)
        ids = np.full((n, rounds * kp), -1, np.int64)
        found = np.zeros((n, rounds * kp), bool)
        open_ = np.ones(n, bool)
        for r in range(rounds):
            if r == 0:
                band = bands.first(last, w, kth, scale)
            else:
                ub = np.minimum(last, np.where(queried >= 0, band_last, np.inf).min(axis=1))
                band = bands.lower(queried[:, r - 1], ub, w, kth, scale)
                open_ &= band >= 0
            these = np.flatnonzero(open_)
            if not these.size:
                break
            cols = slice(r * kp, (r + 1) * kp)
            for j in np.unique(band[these]):  # one store search per band, for its queries
                asked = these[band[these] == j]
                hits = self.source.search_band(batch.vectors[rows[asked]], kp, self.band_filter(int(j)), **knobs)
                scores[asked, cols], ids[asked, cols], found[asked, cols] = hits.scores, hits.ids, hits.found
            returned = found[these, cols].sum(axis=1)
            at = scores[these, r * kp + np.maximum(returned - 1, 0)].astype(np.float64)
            whole = returned >= bands.sizes[band[these]]  # the band came back whole: nothing of it is left out
            band_last[these, r] = np.where(returned >= kp, at, np.where(whole, -np.inf, np.inf))
            queried[these, r] = band[these]
            width = (r + 1) * kp
            extra = Hits(scores[these, :width], ids[these, :width], found[these, :width])
            bound = bands.bound(queried[these, : r + 1], band_last[these, : r + 1], scale)
            plain = Hits(sub.plain.scores[these], sub.plain.ids[these], sub.plain.found[these])
            again = answer_round(
                collection, take_queries(batch, rows[these]), k, kp, knobs, complete, plain=plain, extra=extra, bound=bound
            )
            got.put(rows[these], again)
            kth[these] = again.kth
            open_[these] = ~again.certified
        return got
