"""The state of a live index in memory: a base and later rows, changed in O(batch) per write.

A :class:`Snapshot` is one version of an index. Its rows are in *physical* order: the base's
rows (built, loaded or compacted; the gallery may be a memory map), then the rows each later
write appended (in :class:`~hubless.index.rows.Growable` buffers). A removal only marks rows
dead (``alive``); compaction (:func:`hubless.index.writer.compacted`) folds the live rows into a
new base. Physical order is the order items were added, so ties (broken by the lower row
everywhere) fall as in a fresh build over the live items in that order.

Every per-item quantity is row-local (see :meth:`hubless.corrections.base.AdditiveCorrection.row_bias`):
an added row's bank statistics and bias are computed from the banks alone (n_new x n_bank
similarities) and never change while the banks stay the same. The only state shared by all
rows is kept exact across writes:

* the activation sets of DIS/DualDIS: each bank item's ``k_activation`` nearest live rows
  (``statistics.query_activation`` / ``gallery_activation``, physical rows). An add merges the
  bank's nearest new rows in (exact top-k merge); a removal recomputes the lists that lost a
  row, over the live rows (only those bank items);
* the gallery mean (DN without a gallery bank shows scores with it): a running float64 sum of
  the live rows.

So after any sequence of writes, searching a snapshot equals a fresh build over its live items
(tested against a dict model in ``tests/index/test_live_index.py``). Snapshots are never
changed: a write (:mod:`hubless.index.writer`) returns a new one sharing what did not change, so
a search holding a snapshot sees one consistent version while writes go on.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from hubless._validation import MISSING  # the row (and id) of a search slot that could not be filled
from hubless.corrections import AdditiveCorrection, QueryBatch, make_additive, make_correction
from hubless.engine import BankStatistics, StatisticsRequest, TopK, stream_reduce
from hubless.engine.topk import NO_ID
from hubless.errors import InvalidInput, NotFound
from hubless.index.config import IndexConfig
from hubless.index.ids import IdMap, check_ids, first_few
from hubless.index.metadata import Metadata
from hubless.index.rows import Growable

__all__ = ["MISSING", "Snapshot", "row_statistics_names", "split_statistics"]

#: Elements of candidate rows gathered at a time by :meth:`Snapshot.candidate_sims` (1 MB of float32).
CANDIDATE_CHUNK = 1 << 18
SIDES = ("query", "gallery")
#: Products of at most this many multiply-adds (a filtered search over its few matching rows)
#: run on one BLAS thread: waking a thread team took 30 ms on a loaded 2-core machine, the
#: product itself (100 queries x 100 rows x 128) 0.05 ms.
SMALL_PRODUCT = 1 << 24


def row_statistics_names(request: StatisticsRequest) -> list[str]:
    """The names of the per-row statistics arrays ``request`` keeps (as in ``BankStatistics.to_arrays``)."""
    names = ["query_topk"] if request.query_topk else []
    names += [f"query_lse@{b!r}" for b in sorted(request.query_betas)]
    names += [f"gallery_lse@{b!r}" for b in sorted(request.gallery_betas)]
    return names + (["query_probes"] if request.query_probes else [])


def _get_row_array(stats: BankStatistics, name: str) -> np.ndarray:
    if "@" in name:
        kind, beta = name.split("@")
        return getattr(stats, kind)[float(beta)]
    return getattr(stats, name)


def split_statistics(stats: BankStatistics) -> tuple[dict[str, np.ndarray], BankStatistics]:
    """(per-row arrays by name, the global part: sizes, means and activation sets)."""
    rows = {name: _get_row_array(stats, name) for name in row_statistics_names(stats.request)}
    return rows, replace(stats, query_topk=None, query_probes=None, query_lse={}, gallery_lse={})


def _with_rows(globals_: BankStatistics, rows: dict[str, np.ndarray], n: int) -> BankStatistics:
    """Global statistics with per-row arrays ``rows`` of ``n`` rows."""
    out = replace(globals_, n_gallery=n, query_lse={}, gallery_lse={})
    for name, values in rows.items():
        if "@" in name:
            kind, beta = name.split("@")
            getattr(out, kind)[float(beta)] = values
        else:
            setattr(out, name, values)
    return out


@dataclass(frozen=True)
class Snapshot:
    """One version of a live index (see the module docstring). Build with :meth:`from_correction`."""

    spec: str
    normalize: bool
    request: StatisticsRequest
    config: IndexConfig
    base_rows: np.ndarray  # (n_base, d), may be a read-only memory map
    tail: Growable | None  # rows appended since the base
    n_rows: int  # physical rows: n_base + tail rows
    bias_buf: Growable  # (n_rows, n_columns) float32, base and tail
    ids_buf: Growable  # (n_rows,) int64
    alive: np.ndarray  # (n_rows,) bool, this snapshot's own
    stats_base: dict[str, np.ndarray]  # per-row statistics of the base rows
    stats_tail: dict[str, Growable]
    bank: BankStatistics  # global part: bank sizes and means, activation sets over physical rows
    gallery_sum: np.ndarray  # float64 sum of the live rows
    id_map: IdMap
    next_id: int
    banks: dict[str, np.ndarray | None]
    metadata: Metadata | None
    faiss: Any = None  # over the base rows, ids = their rows (None: exact search, the Flat factory)
    faiss_dim: int = 0  # its (padded) dimension; the rest of its layout is in ``config``
    #: the files of a memory-mapped load this snapshot's data came from, not checksummed yet
    #: (:class:`hubless.index.reading.MappedFiles`; None: every byte was verified or computed)
    mapped: Any = field(default=None, compare=False, repr=False)
    #: ``alive``'s buffer when ``alive`` is its first ``n_rows`` (an add appends to it in
    #: O(batch)); None after a load or a removal (a removal copies ``alive``: the older
    #: snapshots keep theirs)
    alive_buf: Growable | None = field(default=None, compare=False, repr=False)
    n_dead_rows: int = 0  # rows of ``alive`` that are False (kept, so a write never counts them)
    extra: dict = field(default_factory=dict, compare=False)  # caches of this snapshot (filters)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_arrays(
        cls,
        *,
        spec: str,
        normalize: bool,
        config: IndexConfig,
        gallery: np.ndarray,
        bias: np.ndarray,
        ids: np.ndarray,
        stats: dict[str, np.ndarray],
        bank: BankStatistics,
        gallery_sum: np.ndarray,
        banks: dict | None = None,
        metadata: Metadata | None = None,
        faiss=None,
        faiss_dim: int = 0,
        next_id: int | None = None,
        mapped=None,
    ) -> Snapshot:
        """A snapshot made of a base alone: ``gallery`` rows (item ``i`` has ``ids[i]``), their
        bias columns and per-row statistics, the banks' global statistics (``bank``: activation
        sets over these rows), a FAISS structure over them (None: exact search)."""
        n = gallery.shape[0]
        ids = np.asarray(ids, dtype=np.int64)
        alive_buf = Growable(np.ones(n, dtype=bool))
        return cls(
            spec=spec,
            normalize=bool(normalize),
            request=make_correction(spec).statistics_request(),
            config=config,
            base_rows=gallery,
            tail=None,
            n_rows=n,
            bias_buf=Growable(bias),
            ids_buf=Growable(ids),
            alive=alive_buf.view(),
            alive_buf=alive_buf,
            stats_base=dict(stats),
            stats_tail={},
            bank=replace(bank, n_gallery=n),
            gallery_sum=np.asarray(gallery_sum, dtype=np.float64),
            id_map=IdMap(ids),
            next_id=int(ids.max(initial=-1)) + 1 if next_id is None else max(int(next_id), int(ids.max(initial=-1)) + 1),
            banks=dict(banks or {}),
            metadata=metadata,
            faiss=faiss,
            faiss_dim=int(faiss_dim),
            mapped=mapped,
        )

    @classmethod
    def from_correction(
        cls,
        corr: AdditiveCorrection,
        config: IndexConfig,
        *,
        ids: np.ndarray,
        faiss=None,
        faiss_dim: int = 0,
        banks: dict | None = None,
        metadata: Metadata | None = None,
        next_id: int | None = None,
        mapped=None,
    ) -> Snapshot:
        """A snapshot whose base is a fitted correction's gallery (item ``i`` has ``ids[i]``);
        ``mapped``: the unverified files its values were derived from (see :attr:`mapped`)."""
        gallery = corr.gallery_
        rows, bank = split_statistics(corr.statistics_)
        snap = cls.from_arrays(
            spec=corr.spec,
            normalize=corr.normalize,
            config=config,
            gallery=gallery,
            bias=corr.bias_columns_,
            ids=ids,
            stats=rows,
            bank=bank,
            gallery_sum=gallery.sum(axis=0, dtype=np.float64),
            banks=banks,
            metadata=metadata,
            faiss=faiss,
            faiss_dim=faiss_dim,
            next_id=next_id,
            mapped=mapped,
        )
        snap.__dict__["correction"] = copy.copy(corr)  # the live items are the base: it is their fit
        return snap

    # ------------------------------------------------------------------ description
    @property
    def layout(self):
        """Where the FAISS rows keep what (:class:`hubless.index.faiss_build.Layout`)."""
        from hubless.index.faiss_build import Layout

        offset = self.dim if self.config.bias_offset is None else self.config.bias_offset
        return Layout(self.faiss_dim, offset, self.config.spill, self.config.spill_below)

    @property
    def n_base(self) -> int:
        return self.base_rows.shape[0]

    @property
    def dim(self) -> int:
        return self.base_rows.shape[1]

    @property
    def n_tail(self) -> int:
        return self.n_rows - self.n_base

    @property
    def n_alive(self) -> int:
        return self.n_rows - self.n_dead_rows

    @property
    def n_dead(self) -> int:
        return self.n_dead_rows

    @property
    def tail_rows(self) -> np.ndarray:
        return np.zeros((0, self.dim), np.float32) if self.tail is None else self.tail.view(self.n_tail)

    @property
    def bias(self) -> np.ndarray:
        return self.bias_buf.view(self.n_rows)

    @property
    def ids(self) -> np.ndarray:
        """Every physical row's id (dead rows included)."""
        return self.ids_buf.view(self.n_rows)

    @cached_property
    def live_rows(self) -> np.ndarray:
        """The physical rows of the live items, in order."""
        return np.flatnonzero(self.alive)

    @cached_property
    def live_ids(self) -> np.ndarray:
        return self.ids[self.live_rows]

    def killed_since(self, old: Snapshot) -> np.ndarray:
        """The rows of ``old`` (an earlier version of this index) that were live there and are
        dead here. O(batch) after adds: when this ``alive`` extends ``old``'s in the same buffer
        (rows below a buffer's length are never written again), none was removed and nothing is
        compared; else the two are compared (O(n) bits: after a removal)."""
        start = old.n_rows
        if old.alive.size == 0 or (
            self.alive.size >= start and self.alive.__array_interface__["data"][0] == old.alive.__array_interface__["data"][0]
        ):
            return np.zeros(0, dtype=np.int64)
        return np.flatnonzero(old.alive & ~self.alive[:start])

    def row_statistics(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(base part, tail part) of one per-row statistics array."""
        base = self.stats_base[name]
        tail = self.stats_tail.get(name)
        return base, (base[:0] if tail is None else tail.view(self.n_tail))

    @cached_property
    def serving(self) -> AdditiveCorrection:
        """The correction that ranks this snapshot's physical rows: their bias columns, the gates
        of the live rows' activation sets, the banks' query state (no rows kept: see
        :meth:`~hubless.corrections.base.AdditiveCorrection.for_rows`)."""
        corr = make_additive(self.spec).set_params(normalize=self.normalize)
        return corr.for_rows(self.bias, self._statistics_for(0))

    def _statistics_for(self, n: int) -> BankStatistics:
        """The global statistics with empty per-row arrays (and the live gallery mean)."""
        empty = {name: np.zeros((0, *self.stats_base[name].shape[1:]), self.stats_base[name].dtype) for name in self.stats_base}
        mean = self.gallery_sum / max(self.n_alive, 1)
        return replace(_with_rows(self.bank, empty, self.n_rows), gallery_mean=mean)

    # ------------------------------------------------------------------ rows
    def gather(self, rows: np.ndarray) -> np.ndarray:
        """Embeddings of physical ``rows`` (any shape of int array), float32."""
        rows = np.asarray(rows, dtype=np.int64)
        flat = rows.ravel()
        out = np.empty((flat.size, self.dim), dtype=np.float32)
        in_base = flat < self.n_base
        if in_base.all():
            out[:] = self.base_rows[flat]
        else:
            out[in_base] = self.base_rows[flat[in_base]]
            out[~in_base] = self.tail_rows[flat[~in_base] - self.n_base]
        return out.reshape(*rows.shape, self.dim)

    def candidate_sims(self, vectors: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """``sims[q, j] = vectors[q] . row(rows[q, j])`` (float32, (n_queries, k)) for physical
        ``rows`` (every entry a valid row): the similarities of each query's candidates. The rows
        are gathered for :data:`CANDIDATE_CHUNK` elements' worth of queries at a time, so they are
        still in cache when multiplied (the same per-query products as one gather of every
        candidate, which moves each row through memory twice: 2,000 x 40 candidates of 512
        dimensions are a 164 MB temporary)."""
        nq, k = rows.shape
        out = np.empty((nq, k), dtype=np.float32)
        step = max(1, CANDIDATE_CHUNK // max(1, k * self.dim))
        for start in range(0, nq, step):
            stop = min(nq, start + step)
            np.einsum("qd,qkd->qk", vectors[start:stop], self.gather(rows[start:stop]), out=out[start:stop])
        return out

    def rows_of(self, ids, *, name: str = "ids") -> np.ndarray:
        """Physical rows of the live items ``ids`` (int64 array); unknown or removed ids are a
        :class:`~hubless.errors.NotFound` naming the first of them."""
        ids = check_ids(ids, name=name)
        rows = self.id_map.rows(ids, self.n_rows)
        missing = (rows < 0) | ~self.alive[np.maximum(rows, 0)]
        if missing.any():
            raise NotFound(f"no item with id {first_few(ids[missing])} in this index")
        return rows

    # ------------------------------------------------------------------ writes
    def _banks_for_update(self, *, required: bool):
        request = self.request
        needs_query = bool(request.query_topk or request.query_betas or request.query_activation_k or request.query_probes)
        qb, gb = self.banks.get("query_bank"), self.banks.get("gallery_bank")
        if required and ((needs_query and qb is None) or (request.needs_gallery_bank and gb is None)):
            raise InvalidInput("this index was saved without its banks (keep_banks=False): it cannot compute new items' biases")
        return (qb if needs_query else None), (gb if request.needs_gallery_bank else None)

    def verify_mapped(self, names=None) -> None:
        """Checksum the mapped files ``names`` (None: all) a write is about to compute from, if a
        memory-mapped load has not yet (:class:`hubless.index.reading.MappedFiles`): a damaged
        file is a Corrupt naming it, before anything is computed or written."""
        if self.mapped is not None:
            self.mapped.verify(names)

    # ------------------------------------------------------------------ compaction
    def logical(self) -> tuple[np.ndarray, BankStatistics]:
        """The live items' gallery and bank statistics, in order, as a fresh fit on them has
        them (activation lists renumbered to the live rows; the gallery mean recomputed)."""
        live = self.live_rows
        gallery = self.gather(live)
        rows = {}
        for name in self.stats_base:
            base, tail = self.row_statistics(name)
            rows[name] = np.concatenate([base, tail])[live] if tail.shape[0] else np.asarray(base)[live]
        bank = self.bank
        renumber = np.cumsum(self.alive) - 1
        for side in SIDES:
            lists = getattr(bank, f"{side}_activation")
            if lists is not None:
                renumbered: dict[str, Any] = {
                    f"{side}_activation": np.where(lists == NO_ID, NO_ID, renumber[np.minimum(lists, self.n_rows - 1)])
                }
                bank = replace(bank, **renumbered)
        bank = replace(bank, gallery_mean=gallery.mean(axis=0, dtype=np.float64))
        return gallery, _with_rows(bank, rows, live.size)

    @cached_property
    def correction(self) -> AdditiveCorrection:
        """A correction fitted on the live items exactly as a fresh fit would be (from the kept
        statistics: no bank is read); item ``i`` is :attr:`live_ids` ``[i]``. Built on first use
        (O(n)) and kept for this snapshot."""
        gallery, stats = self.logical()
        corr = make_additive(self.spec).set_params(normalize=self.normalize)
        return corr.fit(gallery, statistics=stats)

    # ------------------------------------------------------------------ search primitives
    def allowed(self, where) -> np.ndarray | None:
        """The rows a search may return: live, and matching ``where`` (None: every row is)."""
        if where is None:
            return None if self.n_dead == 0 else self.alive
        if self.metadata is None or not self.metadata.schema.names:
            raise InvalidInput("where: this index has no item metadata to filter on")
        import json

        key = json.dumps(where, sort_keys=True, default=str)
        cache = self.extra.setdefault("masks", {})
        if key not in cache:
            if len(cache) > 64:
                cache.clear()
            cache[key] = self.metadata.mask(where) & self.alive
        return cache[key]

    def stream_topk(self, vectors: np.ndarray, k: int, allowed: np.ndarray | None, transform=None, *, rows: str = "all"):
        """Top-``k`` (values, physical rows) of ``vectors . row`` (after ``transform(sims, r0,
        r1, c0, c1)`` with physical columns) over the rows ``allowed`` (None: all), streamed
        block by block (engine :func:`~hubless.engine.stream_reduce`; ties to the lower row).
        Slots with no allowed row left get row ``MISSING`` and -inf. ``rows``: "all" or "tail"."""
        parts = [(0, self.base_rows)] if rows == "all" else []
        parts.append((self.n_base, self.tail_rows))
        nq = vectors.shape[0]
        result = None
        for offset, block_rows in parts:
            if block_rows.shape[0] == 0:
                continue

            def block(sims, r0, r1, c0, c1, offset=offset):
                if transform is not None:
                    transform(sims, r0, r1, offset + c0, offset + c1)
                if allowed is not None:
                    dead = ~allowed[offset + c0 : offset + c1]
                    if dead.any():
                        sims[:, dead] = -np.inf

            top = TopK(nq, k, with_ids=True, initial=result, id_offset=offset)
            stream_reduce(vectors, block_rows, [top], transform=block)
            result = (top.values, top.ids_)
        if result is None:
            return np.full((nq, k), -np.inf, np.float32), np.full((nq, k), MISSING, np.int64)
        values, found = result
        ok = found != NO_ID
        if allowed is not None:
            ok &= allowed[np.where(ok, found, 0)]
        return np.where(ok, values, -np.inf).astype(np.float32), np.where(ok, found, MISSING)

    def subset_topk(self, batch: QueryBatch, k: int, rows: np.ndarray):
        """Exact corrected top-``k`` among physical ``rows`` (sorted), by gathering them: for
        selective filters, where this is cheaper than a pass over every row."""
        nq = len(batch)
        if rows.size == 0:
            return np.full((nq, k), -np.inf, np.float32), np.full((nq, k), MISSING, np.int64)
        gathered = self.gather(rows)
        if nq * rows.size * self.dim <= SMALL_PRODUCT:  # a thread team's wake-up would cost more than the product
            from hubless.engine.parallel import one_blas_thread

            with one_blas_thread():
                sims = batch.vectors @ gathered.T
        else:
            sims = batch.vectors @ gathered.T
        ranking = self.serving.rank(batch, sims, columns=np.broadcast_to(rows, sims.shape), out=sims)
        return _best(ranking, np.broadcast_to(rows, ranking.shape), k)

    def nearest_live(self, vectors: np.ndarray, k: int, *, progress: bool | None = None):
        """The ``k`` nearest live rows of each vector by raw similarity: (scores, rows)."""
        return self._nearest(vectors, k, self.alive if self.n_dead else None, progress=progress)

    def _nearest(self, vectors, k, allowed, *, progress=None):
        values, found = self.stream_topk(vectors, k, allowed)
        return values, np.where(found == MISSING, NO_ID, found)

    # ------------------------------------------------------------------ writes by filter, metadata-only writes
    def matching_rows(self, where) -> np.ndarray:
        """The physical rows of the live items matching ``where`` (a metadata filter), in order."""
        if where is None:
            raise InvalidInput("where: a metadata filter is needed here")
        allowed = self.allowed(where)
        assert allowed is not None  # a filter always gives a mask
        return np.flatnonzero(allowed)


def _best(ranking: np.ndarray, rows: np.ndarray, k: int):
    """Top-``k`` of each row of ``ranking`` over candidate ``rows`` (MISSING and -inf last;
    ties to the lower row), padded with MISSING."""
    nq, m = ranking.shape
    rows = np.asarray(rows)
    valid = rows != MISSING
    key_rows = np.where(valid, rows, np.iinfo(np.int64).max)
    ranked = np.where(valid, ranking, -np.inf)
    order = np.lexsort((key_rows, ~valid, -ranked), axis=1)[:, :k]
    values = np.take_along_axis(ranked, order, axis=1).astype(np.float32)
    chosen = np.where(np.take_along_axis(valid, order, axis=1), np.take_along_axis(rows, order, axis=1), MISSING)
    if m < k:
        values = np.pad(values, ((0, 0), (0, k - m)), constant_values=-np.inf)
        chosen = np.pad(chosen, ((0, 0), (0, k - m)), constant_values=MISSING)
    return values, chosen


def augmented_rows(corr: AdditiveCorrection) -> np.ndarray:
    """The rows a FAISS index holds: [r, bias(r)] for every gallery item r."""
    return np.hstack([corr.gallery_, corr.bias_columns_]).astype(np.float32)
