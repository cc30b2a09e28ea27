"""The state of a live index in memory: a base and later rows, changed in O(batch) per write.

A :class:`Snapshot` is one version of an index. Its rows are in *physical* order: the base's
rows (built, loaded or compacted; the gallery may be a memory map), then the rows each later
write appended (in :class:`~hubless.index.rows.Growable` buffers). A removal only marks rows
dead (``alive``); compaction (:meth:`Snapshot.compacted`) folds the live rows into a new base.
Physical order is the order items were added, so ties (broken by the lower row everywhere)
fall as in a fresh build over the live items in that order.

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
(tested against a dict model in ``tests/index/test_live_index.py``). Snapshots are never changed: a
write returns a new one sharing what did not change, so a search holding a snapshot sees one
consistent version while writes go on.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import numpy as np

from hubless._validation import as_embeddings
from hubless.corrections import AdditiveCorrection, QueryBatch, make_additive, make_correction
from hubless.engine import BankStatistics, StatisticsRequest, TopK, compute_statistics, stream_reduce
from hubless.engine.merge import merge_topk_ids
from hubless.engine.topk import NO_ID
from hubless.errors import AlreadyExists, Corrupt, InvalidInput, NotFound
from hubless.index.config import IndexConfig
from hubless.index.ids import IdMap, assigned_ids, check_ids, first_few
from hubless.index.metadata import Metadata
from hubless.index.rows import Growable

__all__ = ["MISSING", "Snapshot", "row_statistics_names", "split_statistics"]

#: Row returned for a search slot that could not be filled.
MISSING = -1
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
    #: (:class:`hubless.index.disk.MappedFiles`; None: every byte was verified or computed)
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
            spec=corr.spec, normalize=corr.normalize, config=config, gallery=gallery, bias=corr.bias_columns_, ids=ids, stats=rows,
            bank=bank, gallery_sum=gallery.sum(axis=0, dtype=np.float64), banks=banks, metadata=metadata, faiss=faiss,
            faiss_dim=faiss_dim, next_id=next_id, mapped=mapped,
        )  # fmt: skip
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
    def added(self, rows: np.ndarray, ids=None, metadata=None, *, progress: bool | None = None) -> tuple[Snapshot, np.ndarray]:
        """This snapshot with ``rows`` (validated float32) added as new items; returns it and
        their ids. Ids given must be new (not live here); ``None`` assigns ``next_id, ...``.
        Everything is checked before anything is computed; nothing here is changed."""
        n = rows.shape[0]
        if ids is None:
            ids = assigned_ids(self.next_id, n)
        else:
            ids = check_ids(ids, n)
            present = self.id_map.rows(ids, self.n_rows)
            taken = (present >= 0) & self.alive[np.maximum(present, 0)]
            if taken.any():
                raise AlreadyExists(f"ids already in the index: {first_few(ids[taken])} (use upsert to replace items)")
        meta = self.metadata
        if metadata is not None or meta is not None:
            meta = (meta if meta is not None else Metadata.empty(self.n_rows)).appended(metadata, n)
        corr = self.serving
        corr.check_sizes(self.n_alive + n, self.bank.n_query_bank if corr.needs_query_bank else None, self.bank.n_gallery_bank)
        query_bank, gallery_bank = self._banks_for_update(required=True)
        self._verify_mapped(["query_bank.npy", "gallery_bank.npy"])  # the new rows' statistics come from them
        means = (self.bank.query_bank_mean, self.bank.gallery_bank_mean)  # the banks did not change
        part = compute_statistics(rows, query_bank, gallery_bank, self.request, progress=progress, bank_means=means)
        part = replace(
            part,
            n_query_bank=self.bank.n_query_bank,
            n_gallery_bank=self.bank.n_gallery_bank,
            query_bank_mean=self.bank.query_bank_mean,
            gallery_bank_mean=self.bank.gallery_bank_mean,
        )
        part_rows, _ = split_statistics(part)
        bias = corr.row_bias(rows, _with_rows(self._statistics_for(n), part_rows, n))
        bank = self.bank
        for side in SIDES:
            lists = getattr(bank, f"{side}_activation")
            if lists is None:
                continue
            local = getattr(part, f"{side}_activation")
            merged_scores, merged = merge_topk_ids(
                (getattr(bank, f"{side}_activation_scores"), lists),
                (getattr(part, f"{side}_activation_scores"), np.where(local == NO_ID, NO_ID, local + self.n_rows)),
            )
            bank = replace(bank, **{f"{side}_activation": merged, f"{side}_activation_scores": merged_scores})
        snap = self._appended(rows, bias, ids, part_rows, meta)
        return replace(snap, bank=bank, gallery_sum=snap.gallery_sum + rows.sum(axis=0, dtype=np.float64)), ids

    def _appended(self, rows, bias, ids, part_rows: dict, meta) -> Snapshot:
        """Rows, their bias, ids and per-row statistics appended, alive (no other change)."""
        n0, t0 = self.n_rows, self.n_tail
        if self.tail is None:
            tail = Growable(rows)
        else:
            tail, _ = self.tail.extended(t0, rows)
        bias_buf, _ = self.bias_buf.extended(n0, bias)
        ids_buf, _ = self.ids_buf.extended(n0, ids)
        alive_buf = self.alive_buf if self.alive_buf is not None else Growable(self.alive)  # a copy once after a removal
        alive_buf, alive = alive_buf.extended(n0, np.ones(rows.shape[0], dtype=bool))
        stats_tail = {}
        for name in self.stats_base:
            buffer = self.stats_tail.get(name)
            stats_tail[name] = Growable(part_rows[name]) if buffer is None else buffer.extended(t0, part_rows[name])[0]
        return replace(
            self,
            tail=tail,
            n_rows=n0 + rows.shape[0],
            bias_buf=bias_buf,
            ids_buf=ids_buf,
            alive=alive,
            alive_buf=alive_buf,
            stats_tail=stats_tail,
            id_map=self.id_map.extended(n0, ids),
            next_id=max(self.next_id, int(ids.max(initial=-1)) + 1),
            metadata=meta,
            extra={},
        )

    def removed(self, ids, *, progress: bool | None = None) -> Snapshot:
        """This snapshot without the items ``ids`` (all must be live: else NotFound, nothing
        changed). Their rows are marked dead; activation lists that held one are recomputed
        over the live rows."""
        ids = np.unique(np.asarray(ids).ravel()) if np.size(ids) else np.zeros(0, np.int64)
        rows = self.rows_of(ids)
        return self._without_rows(rows, progress=progress)

    def _without_rows(self, rows: np.ndarray, *, progress: bool | None = None, check: bool = True) -> Snapshot:
        """Rows marked dead. ``check=False`` (an upsert, which adds items back at once) lets the
        index hold fewer items than the correction needs for a moment."""
        if rows.size == 0:
            return self
        left = self.n_alive - rows.size
        if check and left < 1:
            raise InvalidInput("cannot remove every item of an index")
        corr = self.serving
        if check:
            corr.check_sizes(left, self.bank.n_query_bank if corr.needs_query_bank else None, self.bank.n_gallery_bank)
        alive = self.alive.copy()
        alive[rows] = False
        bank = self.bank
        for side in SIDES:
            lists = getattr(bank, f"{side}_activation")
            if lists is None:
                continue
            lost = np.isin(lists, rows).any(axis=1)
            if not lost.any():
                continue
            bank_rows = self.banks.get(f"{side}_bank")
            if bank_rows is None:
                raise InvalidInput(f"removing these items changes the {side}-bank activation sets, which needs the {side} bank")
            self._verify_mapped(["gallery.npy", f"{side}_bank.npy"])  # the lists are recomputed from them
            lists = lists.copy()
            scores = getattr(bank, f"{side}_activation_scores").copy()
            scores[lost], lists[lost] = self._nearest(np.ascontiguousarray(bank_rows[lost]), lists.shape[1], alive, progress=progress)
            bank = replace(bank, **{f"{side}_activation": lists, f"{side}_activation_scores": scores})
        gone = self.gather(rows).sum(axis=0, dtype=np.float64)
        return replace(
            self, alive=alive, alive_buf=None, n_dead_rows=self.n_dead_rows + np.unique(rows).size, bank=bank, gallery_sum=self.gallery_sum - gone,
            extra={},
        )  # fmt: skip

    def upserted(self, rows: np.ndarray, ids, metadata=None, *, progress: bool | None = None) -> Snapshot:
        """Items ``ids`` set to ``rows`` (and ``metadata``): the present ones are removed, then
        every one is added (at the end, as a fresh build over the new items would have them)."""
        ids = check_ids(ids, rows.shape[0])
        present = self.id_map.rows(ids, self.n_rows)
        present = present[(present >= 0) & self.alive[np.maximum(present, 0)]]
        snap = self._without_rows(present, check=False) if present.size else self
        return snap.added(rows, ids, metadata, progress=progress)[0]

    def _banks_for_update(self, *, required: bool):
        request = self.request
        needs_query = bool(request.query_topk or request.query_betas or request.query_activation_k or request.query_probes)
        qb, gb = self.banks.get("query_bank"), self.banks.get("gallery_bank")
        if required and ((needs_query and qb is None) or (request.needs_gallery_bank and gb is None)):
            raise InvalidInput("this index was saved without its banks (keep_banks=False): it cannot compute new items' biases")
        return (qb if needs_query else None), (gb if request.needs_gallery_bank else None)

    def _verify_mapped(self, names=None) -> None:
        """Checksum the mapped files ``names`` (None: all) a write is about to compute from, if a
        memory-mapped load has not yet (:class:`hubless.index.disk.MappedFiles`): a damaged
        file is a Corrupt naming it, before anything is computed or written."""
        if self.mapped is not None:
            self.mapped.verify(names)

    def with_config(self, config: IndexConfig) -> Snapshot:
        return replace(self, config=config, extra={})

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
        return corr.fit_from_statistics(gallery, stats)

    def compacted(self) -> Snapshot:
        """The live items as a new base, in order (dead rows dropped, the FAISS structure refilled
        with its training kept; an HNSW graph rebuilt)."""
        from hubless.index.faiss_build import refill_faiss

        self._verify_mapped()
        corr = self.correction
        faiss_index, config = None, self.config
        if self.faiss is not None:
            faiss_index, layout = refill_faiss(self.faiss, config.factory, corr.gallery_, augmented_rows(corr), self.layout)
            config = _with_layout(config, layout)
        meta = None if self.metadata is None else self.metadata.select(self.live_rows)
        return Snapshot.from_correction(
            corr, config, ids=self.live_ids, faiss=faiss_index, faiss_dim=self.faiss_dim, banks=self.banks,
            metadata=meta, next_id=self.next_id, mapped=self.mapped,
        )  # fmt: skip

    def with_bank_items(self, items: np.ndarray, side: str, *, progress: bool | None = None) -> Snapshot:
        """The banks' ``side`` grown by ``items``: every item's statistics merge the new bank
        items in (n_items x n_new), so every bias changes: a new base."""
        from hubless.index.faiss_build import refill_faiss

        self._verify_mapped()
        corr = copy.copy(self.correction)
        corr = corr.add_query_bank(items, progress=progress) if side == "query" else corr.add_gallery_bank(items, progress=progress)
        faiss_index, config = None, self.config
        if self.faiss is not None:
            same = self.n_dead == 0 and self.n_tail == 0
            faiss_index, layout = refill_faiss(
                self.faiss, config.factory, corr.gallery_, augmented_rows(corr), self.layout, same_items=same
            )
            config = _with_layout(config, layout)
        banks = dict(self.banks)
        if banks.get(f"{side}_bank") is not None:
            banks[f"{side}_bank"] = np.concatenate([banks[f"{side}_bank"], items])
        meta = None if self.metadata is None else self.metadata.select(self.live_rows)
        return Snapshot.from_correction(
            corr, config, ids=self.live_ids, faiss=faiss_index, faiss_dim=self.faiss_dim, banks=banks, metadata=meta,
            next_id=self.next_id, mapped=self.mapped,
        )  # fmt: skip

    # ------------------------------------------------------------------ replaying a write
    def replayed(self, part: dict) -> Snapshot:
        """This snapshot with one saved write applied (see :mod:`hubless.index.disk`): rows
        appended (their ids, bias, statistics, metadata), rows marked dead, activation lists
        merged (rows' own nearest lists) or replaced (recomputed at the write)."""
        start = part.get("start")
        if start is not None and start != self.n_rows:
            raise Corrupt(f"{part['name']} was written after row {start}; the index has {self.n_rows} rows before it")
        rows = part["rows"]
        first_row = self.n_rows
        dead = part["dead"]
        if dead.size and (dead.min() < 0 or dead.max() >= first_row + rows.shape[0]):
            raise Corrupt(f"{part['name']} removes rows the index does not have")
        snap = self._killed(dead[dead < first_row], part)  # removals first: an upsert adds an id it removes
        if rows.shape[0]:
            ids = part["ids"]
            taken = snap.id_map.rows(ids, snap.n_rows)
            if ((taken >= 0) & snap.alive[np.maximum(taken, 0)]).any():
                raise Corrupt(f"{part['name']} adds ids the index holds already")
            stats = {name: part["statistics"][name] for name in self.stats_base}
            snap = snap._appended(rows, part["bias"], ids, stats, part["metadata"])
            snap = replace(snap, gallery_sum=snap.gallery_sum + rows.sum(axis=0, dtype=np.float64))
        snap = snap._killed(dead[dead >= first_row], part)
        bank = snap.bank
        for side in SIDES:
            lists = getattr(bank, f"{side}_activation")
            merge, replaced = part["activation"].get(f"{side}.merge"), part["activation"].get(f"{side}.replace")
            if lists is None:
                if merge is not None or replaced is not None:
                    raise Corrupt(f"{part['name']} holds {side}-bank activation sets this correction does not use")
                continue
            scores = getattr(bank, f"{side}_activation_scores")
            for kind, record in (("merge", merge), ("replace", replaced)):
                if record is None:
                    continue
                which, new_ids, new_scores = record
                if which.size and (which.min() < 0 or which.max() >= lists.shape[0]) or new_ids.shape != (which.size, lists.shape[1]):
                    raise Corrupt(f"{part['name']}: its {side}-bank activation lists do not fit the bank")
                lists, scores = lists.copy(), scores.copy()
                if kind == "merge":
                    offset = np.where(new_ids == NO_ID, NO_ID, new_ids + first_row)
                    scores[which], lists[which] = merge_topk_ids((scores[which], lists[which]), (new_scores, offset))
                else:
                    lists[which], scores[which] = new_ids, new_scores
            valid = lists[lists != NO_ID]
            if valid.size and (valid.max() >= snap.n_rows or not snap.alive[valid].all()):
                raise Corrupt(f"{part['name']}: its {side}-bank activation lists name rows that are not live")
            bank = replace(bank, **{f"{side}_activation": lists, f"{side}_activation_scores": scores})
        return replace(snap, bank=bank, next_id=max(snap.next_id, part.get("next_id", 0)), extra={})

    def _killed(self, dead: np.ndarray, part: dict) -> Snapshot:
        if not dead.size:
            return self
        if not self.alive[dead].all():
            raise Corrupt(f"{part['name']} removes rows that are not live rows of the index")
        alive = self.alive.copy()
        alive[dead] = False
        gone = self.gather(dead).sum(axis=0, dtype=np.float64)
        return replace(
            self,
            alive=alive,
            alive_buf=None,
            n_dead_rows=self.n_dead_rows + np.unique(dead).size,
            gallery_sum=self.gallery_sum - gone,
            extra={},
        )

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

    def removed_where(self, where, *, progress: bool | None = None) -> tuple[Snapshot, np.ndarray]:
        """This snapshot without the live items matching ``where``, and their ids (sorted): a
        removal as :meth:`removed` (rows marked dead: O(matches) written), none when nothing
        matches."""
        rows = self.matching_rows(where)
        return self._without_rows(rows, progress=progress), np.sort(self.ids[rows])

    def with_metadata(self, rows: np.ndarray, values=None, unset=None) -> Snapshot:
        """Live physical ``rows`` (distinct) with their metadata changed and nothing else: keys of
        ``values`` set (a dict: the same values for every row; a list of dicts: one per row,
        changing only the keys it names), keys of ``unset`` set to null, the other keys kept.
        Values are typed as an add's (:meth:`Metadata.appended`: a value of another type than its
        key's is refused, changing nothing; a new key adds a column).

        The embeddings, biases and bank statistics are kept (an item's bias depends only on its
        row and the banks): each item is written again at the end of the index, as an upsert
        with the same row would write it (its old row marked dead, the activation lists that
        named it renamed to its new row), so a write costs O(rows changed) and a saved index
        holds it as one segment; only the order of ties moves (the item was written last)."""
        from hubless.index.arrow import pyarrow
        from hubless.index.metadata import as_columns

        rows = np.asarray(rows, dtype=np.int64)
        n = rows.size
        unset = [] if unset is None else list(unset)
        if values is None and not unset:
            raise InvalidInput("a metadata update needs values to set and/or keys to unset")
        if isinstance(unset, str) or any(not isinstance(k, str) for k in unset):
            raise InvalidInput(f"unset takes a list of metadata keys; got {unset!r}")
        meta = self.metadata if self.metadata is not None else Metadata.empty(self.n_rows)
        known = meta.schema.names
        missing = [k for k in unset if k not in known]
        if missing:
            raise InvalidInput(f"unset: no metadata key {missing[0]!r} in this index (keys: {', '.join(known) or 'none'})")
        if n == 0:
            return self
        current = meta.table.take(pyarrow().array(rows)).to_pydict() if known else {}
        if values is None:
            updates: dict[str, list] = {}
        elif isinstance(values, dict):
            updates = {key: column * n for key, column in as_columns([values], 1).items()}
        else:
            records = list(values)
            given = as_columns(records, n)  # one record per row (checks the count and the keys)
            updates = {}
            for key, column in given.items():
                old = current.get(key, [None] * n)
                updates[key] = [v if key in (r or {}) else old[i] for i, (v, r) in enumerate(zip(column, records))]
        both = sorted(set(updates) & set(unset))
        if both:
            raise InvalidInput(f"metadata key {both[0]!r} is both set and unset")
        columns = {**current, **updates, **{key: [None] * n for key in unset}}
        new_meta = meta.appended(columns, n)  # typed as an add; raises before anything changes
        embeddings = self.gather(rows)
        stats = {}
        for name in self.stats_base:
            base, tail = self.row_statistics(name)
            out = np.empty((n, *base.shape[1:]), dtype=base.dtype)
            in_base = rows < self.n_base
            out[in_base] = base[rows[in_base]]
            out[~in_base] = tail[rows[~in_base] - self.n_base]
            stats[name] = out
        first = self.n_rows
        snap = self._killed(rows, {"name": "a metadata update"})
        snap = snap._appended(embeddings, self.bias[rows], self.ids[rows], stats, new_meta)
        snap = replace(snap, gallery_sum=snap.gallery_sum + embeddings.sum(axis=0, dtype=np.float64))
        bank = snap.bank
        order = np.argsort(rows, kind="stable")
        ordered = rows[order]
        for side in SIDES:
            lists = getattr(bank, f"{side}_activation")
            if lists is None:
                continue
            at = np.minimum(np.searchsorted(ordered, lists), n - 1)
            moved = (ordered[at] == lists) & (lists != NO_ID)
            if moved.any():
                bank = replace(bank, **{f"{side}_activation": np.where(moved, first + order[at], lists)})
        return replace(snap, bank=bank, extra={})


def _with_layout(config: IndexConfig, layout) -> IndexConfig:
    """``config`` recording a FAISS layout (spill share and threshold, bias offset)."""
    import dataclasses

    return dataclasses.replace(config, spill=layout.spill, spill_below=layout.spill_below, bias_offset=layout.bias_offset)


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


def validated_rows(snap: Snapshot, embeddings, name: str = "embeddings") -> np.ndarray:
    return as_embeddings(embeddings, name, normalize=snap.normalize, dim=snap.dim)
