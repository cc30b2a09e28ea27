"""``hubless.Index``: serve an additive correction at no query-time cost, and write to it live.

    index = hubless.Index.build(gallery, query_bank, method="nnn:alpha=0.75,k=16", factory="IVF1024,Flat")
    scores, ids = index.search(queries, top_k=10, alpha=0.5)     # w changes per call, no rebuild
    scores, ids = index.search(queries, where={"split": "test", "year": {"gte": 2020}})
    index.save("idx/")
    live = hubless.Index.open("idx/")                              # every write is committed at once
    new_ids = live.add(rows, metadata=[...]); live.remove([3, 17]); live.upsert([5], row, [{...}])

Items have stable int64 ids (:mod:`hubless.index.ids`): given or assigned, never reused; search
results, :meth:`Index.get`, metadata and removals use them. A write costs O(batch): new items'
biases come from the stored banks, their rows are appended, removed items are marked dead
(:mod:`hubless.index.live`), and on disk one segment file is added per write, committed by an
atomic ``CURRENT`` switch (:mod:`hubless.index.disk`). After any sequence of writes a search
equals a fresh build over the live items (DIS/DualDIS activation sets included).

Search: the FAISS structure (none for Flat, which is searched exactly by the streamed engine)
holds the base's [r, bias(r)] and is queried with [q, -W(q)]; rows written since the base are
searched exactly and merged in; dead rows and rows a ``where`` filter excludes are left out
(FAISS ``IDSelector``; a selective filter is searched exactly over its rows). With
``rescore=True`` (default for every ANN index) ``rescore_factor x top_k`` candidates are
re-scored exactly by the correction's ranking hook, so approximation only decides which items
become candidates. Raw-neighbour statistics (the DIS/DualDIS gates' raw top-1, CSLS's r_q)
come from one extra search of the same index with w = 0, over every live item.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import as_embeddings, check_positive_int, check_target_recall
from hubless.corrections import AdditiveCorrection, Correction, MethodName, make_additive
from hubless.corrections.serving import check_additive
from hubless.engine import BankStatistics
from hubless.errors import AlreadyExists, Conflict, InvalidInput, NotFittedError
from hubless.index import disk, searching
from hubless.index.config import IndexConfig
from hubless.index.factory import check_factory
from hubless.index.faiss_build import (
    Layout,
    build_faiss,
    default_factory,
    plan_layout,
    search_knob,
    stored_rows,
    with_spill,
)
from hubless.index.ids import check_ids
from hubless.index.info import IndexInfo
from hubless.index.live import MISSING, Snapshot, augmented_rows
from hubless.index.lock import write_lock
from hubless.index.metadata import Metadata, check_keys

__all__ = [
    "COMPACT_FRACTION",
    "COMPACT_MIN_BYTES",
    "COMPACT_MIN_ROWS",
    "Index",
    "IndexConfig",
    "ItemColumn",
    "Items",
    "MAX_SEGMENTS",
    "MISSING",
    "augmented_rows",
]

#: A write folds every segment into one when the index would otherwise hold more than this many.
MAX_SEGMENTS = 64
#: A write compacts the index (a new base of the live items) once the rows written since the
#: base, or the removed rows, exceed COMPACT_MIN_ROWS + COMPACT_FRACTION x the base's rows; or
#: once its segments' bytes exceed COMPACT_MIN_BYTES + COMPACT_FRACTION x the base's bytes (writes
#: whose segments are large for their rows: long metadata, recomputed activation lists), so
#: folding the segments at MAX_SEGMENTS never rewrites more than a share of what compaction would.
COMPACT_MIN_ROWS = 1000
COMPACT_FRACTION = 0.1
COMPACT_MIN_BYTES = 16 << 20


@dataclass
class Items:
    """What :meth:`Index.get` returns: ``ids`` (int64), their ``embeddings`` (float32, as
    stored: normalised when the index normalises) and ``metadata`` (one dict per item with every
    key of the schema, or None for an index without metadata)."""

    ids: np.ndarray
    embeddings: np.ndarray
    metadata: list[dict] | None


class ItemColumn(Mapping):
    """One metadata column of an index's items, looked up by id (``column[id]``): what a
    reranker reads for each candidate (e.g. the ``path`` or ``text`` of an item). Reads the
    version the index had when this was made."""

    def __init__(self, index: Index, column: str) -> None:
        snap = index._snap
        if snap.metadata is None or column not in snap.metadata.schema.names:
            raise InvalidInput(f"the index's metadata has no column {column!r}")
        self._snap, self.column = snap, column

    def __getitem__(self, item_id):
        rows = self._snap.rows_of([int(item_id)])
        assert self._snap.metadata is not None  # checked when the column was chosen
        return self._snap.metadata.table.column(self.column)[int(rows[0])].as_py()

    def __iter__(self):
        return iter(self._snap.live_ids.tolist())

    def __len__(self) -> int:
        return self._snap.n_alive


class Index:
    """A searchable gallery corrected by one additive correction (see the module docstring).

    Build with :meth:`build` (fits the correction) or ``Index(correction, factory)`` from a
    fitted correction. ``ids``: one int64 id >= 0 per gallery item (default 0, 1, ...).
    ``metadata``: per-item records (a list of dicts, a dict of columns, or a pyarrow Table),
    typed by ``metadata_schema`` (a pyarrow Schema) where it names a key and inferred otherwise
    (see :mod:`hubless.index.metadata`). ``config`` holds the factory, model name and search
    defaults (:class:`IndexConfig`). ``spill``: IVF only, the share of items with the lowest bias
    also stored in their second list (default 0.3; 0 turns it off), so corrected IVF finds what
    plain IVF finds at the same ``nprobe`` (see :mod:`hubless.index.faiss_build`).
    """

    def __init__(
        self,
        correction: AdditiveCorrection,
        factory: str | None = None,
        *,
        query_bank: np.ndarray | None = None,
        gallery_bank: np.ndarray | None = None,
        metadata=None,
        metadata_schema=None,
        ids=None,
        model: str | None = None,
        nprobe: int = 16,
        ef_search: int = 64,
        rescore: bool | None = None,
        rescore_factor: int = 4,
        spill: float | None = None,
        _built=None,
    ) -> None:
        check_additive(correction)
        if not correction.is_fitted:
            raise NotFittedError(f"{type(correction).__name__} is not fitted: fit it first, or use Index.build")
        n = correction.n_gallery_
        factory = factory or default_factory(n)
        rescore = not _is_flat(factory) if rescore is None else rescore
        config = IndexConfig(factory, model, nprobe, ef_search, rescore, rescore_factor)
        ids = np.arange(n, dtype=np.int64) if ids is None else check_ids(ids, n)
        meta = None
        if metadata is not None or metadata_schema is not None:
            meta = Metadata.from_records(metadata, n, metadata_schema) if metadata is not None else Metadata.empty(n, metadata_schema)
        t0 = time.perf_counter()
        faiss_index, dim = None, 0
        if not _is_flat(config.factory):  # Flat needs no FAISS structure: it is searched exactly
            if _built is not None:  # built elsewhere (see from_faiss)
                faiss_index, layout = _built
            else:
                faiss_index, layout = build_faiss(config.factory, correction.gallery_, augmented_rows(correction), spill=spill)
            config.spill, config.spill_below, config.bias_offset = layout.spill, layout.spill_below, layout.bias_offset
            dim = layout.dim
        config.build_seconds = time.perf_counter() - t0
        banks = {"query_bank": query_bank, "gallery_bank": gallery_bank}
        snap = Snapshot.from_correction(correction, config, ids=ids, faiss=faiss_index, faiss_dim=dim, banks=banks, metadata=meta)
        self._setup(snap)

    def _setup(
        self, snap: Snapshot, *, path: Path | None = None, loaded: disk.Loaded | None = None, live: bool = False, mmap: bool = False
    ):
        """The one place an index's state is set."""
        self._snap = snap
        self._path = path
        self._live = live
        self._mmap = mmap
        self._lock = threading.RLock()  # writers of this object, one at a time
        self._committed = snap if loaded is not None else None  # what the directory holds
        self._base = getattr(loaded, "base", None)  # the base alone, for folding segments
        self._manifest = None if loaded is None else loaded.manifest
        self._stamp = () if loaded is None else loaded.stamp
        self._locked = False  # inside update(): the file lock is held, commit at the end
        self._full = False  # inside update(): compact() was called, the commit writes a new base
        #: Seconds a write waits for the index's file lock (None: HUBLESS_LOCK_TIMEOUT or 60).
        self.lock_timeout: float | None = None

    def detach(self) -> Index:
        """Forget the directory this index was loaded from: it becomes an in-memory index, as
        :meth:`build` gives (written only by :meth:`save`). Returns the index itself. Only for an
        index read whole (not with ``mmap=True``: its arrays would still be the directory's files)."""
        if self._mmap:
            raise InvalidInput("an index loaded with mmap=True maps its directory's files: load it without mmap to detach it")
        self._setup(self._snap)
        return self

    @classmethod
    def from_faiss(cls, correction: AdditiveCorrection, faiss_index, factory: str, *, spill: float = 0.0, **options) -> Index:
        """An index over a FAISS index built elsewhere (by :func:`hubless.distributed.build_index`,
        say) that holds the rows of the fitted ``correction``'s gallery, in order, laid out by
        :func:`~hubless.index.faiss_build.train_empty` (IVF items spilled with ``spill``).
        ``options``: as the constructor's (banks, metadata, ids, model, search defaults)."""
        if not correction.is_fitted:
            raise NotFittedError(f"{type(correction).__name__} is not fitted")
        bias = correction.bias_columns_
        _, dim, offset = plan_layout(factory, correction.dim_, bias.shape[1])
        layout = with_spill(faiss_index, Layout(dim, offset), bias, spill)
        if faiss_index.ntotal != stored_rows(bias, layout.spill_below):
            raise InvalidInput(
                f"the FAISS index holds {faiss_index.ntotal} rows but the correction's gallery has {correction.n_gallery_} items"
            )
        if faiss_index.d != dim:
            raise InvalidInput(f"the FAISS index has dimension {faiss_index.d}; {factory!r} over this correction needs {dim}")
        return cls(correction, factory, _built=(faiss_index, layout), **options)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        gallery,
        query_bank=None,
        method: MethodName | str | Correction = "nnn",
        factory: str | None = None,
        *,
        gallery_bank=None,
        normalize: bool = True,
        keep_banks: bool = True,
        bias_search: str = "exact",
        bias_nprobe: int = 32,
        progress: bool | None = None,
        statistics: BankStatistics | None = None,
        target_recall: float | None = None,
        max_memory: int | str | None = None,
        **kwargs,
    ) -> Index:
        """Fit ``method`` (a spec such as ``"nnn:alpha=0.75,k=16"``) on the banks and index the
        gallery. ``keep_banks`` stores the banks so :meth:`add` can compute new items' biases.
        ``kwargs``: the constructor's (``ids``, ``metadata``, ``metadata_schema``, ``model``,
        search defaults).

        ``bias_search``: "exact" (streamed, every similarity) or "ann" / a FAISS factory string
        for the bank ("IVF2048,Flat", "HNSW32"): sublinear top-k statistics (NNN, CSLS, DN only),
        with ``bias_nprobe`` lists visited; the error on a 1,000-item sample is then in
        ``index.bias_error`` (see :mod:`hubless.index.ann_bias`). ``statistics``: bank
        statistics of these very arrays computed already (e.g. by
        :func:`hubless.corrections.fit_shared` with the bank's coverage), so the banks are not
        read again.

        ``target_recall`` (in (0, 1]): choose the factory and its ``nprobe``/``ef_search`` for
        this recall@10 of the exact corrected top 10, measured on held-out samples of the query
        bank only, within ``max_memory`` (bytes of the FAISS structure: an int or "2GB"); a
        ``factory`` given is the only candidate (its knob is chosen). What was tried and
        measured is in ``index.config.tuning`` (see :mod:`hubless.index.tuner`).
        """
        if target_recall is None and max_memory is not None:
            raise InvalidInput("max_memory bounds what the tuner may choose: pass target_recall too (e.g. target_recall=0.95)")
        if target_recall is not None:
            from hubless.index.tuner import parse_size

            check_target_recall(target_recall)  # before the fit: bad arguments fail in a second
            parse_size(max_memory)
            if query_bank is None:
                raise InvalidInput("target_recall is measured on the query bank: pass query_bank")
        corr = make_additive(method)
        if isinstance(method, str):
            corr.set_params(normalize=normalize)
        shape = np.shape(gallery)
        if factory is not None and len(shape) == 2:  # before the fit: a bad factory fails in a second, not after it
            check_factory(factory, shape[0], shape[1] + 1)
        if kwargs.get("ids") is not None and len(shape) == 2:
            check_ids(kwargs["ids"], shape[0])
        if kwargs.get("metadata") is not None or kwargs.get("metadata_schema") is not None:
            check_keys(kwargs.get("metadata"), kwargs.get("metadata_schema"))  # before the fit
        bias_error = None
        if bias_search == "exact":
            corr.fit(gallery, query_bank, gallery_bank, statistics=statistics, progress=progress)
        else:
            from hubless.index.ann_bias import fit_ann_bias

            bias_error = fit_ann_bias(corr, gallery, query_bank, gallery_bank, bias_search=bias_search, nprobe=bias_nprobe)
        dim = corr.dim_
        qb = None if query_bank is None or not keep_banks else as_embeddings(query_bank, "query_bank", normalize=corr.normalize, dim=dim)
        gb = (
            None
            if gallery_bank is None or not keep_banks
            else as_embeddings(gallery_bank, "gallery_bank", normalize=corr.normalize, dim=dim)
        )
        if target_recall is not None:
            from hubless.index.tuner import tune_index

            index = tune_index(corr, query_bank, target_recall=target_recall, max_memory=max_memory,
                               factories=None if factory is None else [factory], gallery_bank=gallery_bank,
                               keep_banks=keep_banks, **kwargs)  # fmt: skip
        else:
            index = cls(corr, factory, query_bank=qb, gallery_bank=gb, **kwargs)
        index.config.bias_error = bias_error
        return index

    # ------------------------------------------------------------------ description
    @property
    def ntotal(self) -> int:
        """The number of items."""
        return self._snap.n_alive

    @property
    def method(self) -> str:
        """The correction's spec, e.g. ``"nnn:alpha=0.75,k=16"``."""
        return self._snap.spec

    @property
    def ids(self) -> np.ndarray:
        """The items' ids, in the index's order (the order of :attr:`correction`'s gallery)."""
        return self._snap.live_ids

    @property
    def correction(self) -> AdditiveCorrection:
        """The correction fitted on the items, as a fresh fit on them would be (gallery row ``i``
        is item :attr:`ids` ``[i]``). After writes it is derived from the kept statistics on
        first use (O(n), once per version)."""
        return self._snap.correction

    @property
    def config(self) -> IndexConfig:
        return self._snap.config

    @property
    def factory(self) -> str:
        return self.config.factory

    @property
    def model(self) -> str | None:
        return self.config.model

    @property
    def query_bank(self) -> np.ndarray | None:
        return self._snap.banks.get("query_bank")

    @property
    def gallery_bank(self) -> np.ndarray | None:
        return self._snap.banks.get("gallery_bank")

    @property
    def weight_param(self) -> str | None:
        """The name of the correction's query-time weight (``alpha`` for NNN, ``lam`` for DN;
        None when it has none); any search takes it as ``weight=`` too."""
        return self._snap.serving.weight_param

    @property
    def weight(self) -> float:
        """The correction's weight (NNN's alpha, DN's lambda; 1 or 0 for methods without one)."""
        return float(self._snap.serving.weight())

    @property
    def bias_error(self) -> dict[str, float] | None:
        """Mean and max |bias_ann - bias_exact| on a sample when biases came from an ANN search."""
        return self.config.bias_error

    @property
    def metadata_schema(self):
        """The pyarrow schema of the item metadata (None: the index has no metadata)."""
        meta = self._snap.metadata
        return None if meta is None else meta.schema

    @property
    def metadata(self) -> list[dict] | None:
        """Every item's metadata record, in the index's order (None without metadata). For a
        few items use :meth:`records` or :meth:`get`; for all of them as a typed table,
        :meth:`metadata_table`."""
        snap = self._snap
        if snap.metadata is None:
            return None
        if "records" not in snap.extra:
            snap.extra["records"] = snap.metadata.take(snap.live_rows)
        return snap.extra["records"]

    def metadata_table(self):
        """The items' metadata as a pyarrow Table (one row per item, in the index's order), with
        their ids as the first column ``id``; None for an index without metadata."""
        snap = self._snap
        if snap.metadata is None:
            return None
        import pyarrow as pa

        if "id" in snap.metadata.schema.names:  # written before the key was reserved
            raise InvalidInput(
                "this index's metadata has a key 'id' (written before hubless reserved it), which would repeat the ids "
                "column: read index.metadata or records(ids) instead"
            )
        table = snap.metadata.table.take(snap.live_rows) if snap.metadata.schema.names else pa.table({})
        return table.add_column(0, pa.field("id", pa.int64(), nullable=False), pa.array(snap.live_ids))

    def records(self, ids) -> list[dict]:
        """The metadata records of items ``ids`` (every schema key, None where unset; ``{}``
        for an index without metadata); an unknown id is a NotFound."""
        snap = self._snap
        rows = snap.rows_of(ids)
        return [{} for _ in rows] if snap.metadata is None else snap.metadata.take(rows)

    def get(self, ids) -> Items:
        """Items ``ids``: their embeddings and metadata (:class:`Items`); an unknown id is a NotFound."""
        snap = self._snap
        rows = snap.rows_of(ids)
        meta = None if snap.metadata is None else snap.metadata.take(rows)
        return Items(snap.ids[rows].copy(), snap.gather(rows), meta)

    def positions(self, ids) -> np.ndarray:
        """The positions of items ``ids`` in the index's order (in :attr:`ids`, and the rows of
        :attr:`correction`'s gallery); -1 for an id that is not in the index."""
        snap = self._snap
        ids = np.asarray(ids, dtype=np.int64).ravel()
        rows = snap.id_map.rows(ids, snap.n_rows)
        present = (rows >= 0) & snap.alive[np.maximum(rows, 0)]
        if "rank" not in snap.extra:
            snap.extra["rank"] = np.cumsum(snap.alive) - 1
        return np.where(present, snap.extra["rank"][np.maximum(rows, 0)], -1)

    def __contains__(self, item_id) -> bool:
        snap = self._snap
        row = snap.id_map.rows(np.asarray([item_id], dtype=np.int64), snap.n_rows)[0]
        return bool(row >= 0 and snap.alive[row])

    def info(self) -> IndexInfo:
        """The index's description (:class:`hubless.index.info.IndexInfo`: typed fields that
        also read as the dict they were, ``info()["dim"]``; ``.to_dict()`` for the plain dict)."""
        return IndexInfo.from_dict(self._info())

    def _info(self) -> dict[str, Any]:
        snap = self._snap
        corr = snap.serving
        bank = snap.bank
        return {
            "method": snap.spec,
            "n_items": snap.n_alive,
            "dim": snap.dim,
            "bias_columns": int(snap.bias.shape[1]),
            "normalize": bool(snap.normalize),
            "n_query_bank": int(bank.n_query_bank) if corr.needs_query_bank else None,
            "n_gallery_bank": None if bank.n_gallery_bank is None else int(bank.n_gallery_bank),
            "banks_kept": any(v is not None for v in snap.banks.values()),
            "metadata_columns": [] if snap.metadata is None else list(snap.metadata.schema.names),
            "next_id": int(snap.next_id),
            **self.config.to_dict(),
        }

    def storage(self) -> dict[str, Any]:
        """How the index is held: rows in its base and written since, removed rows not yet
        compacted, and (for a saved index) its version and segments."""
        snap, manifest = self._snap, self._manifest
        return {
            "path": None if self._path is None else str(self._path),
            "format_version": disk.VERSION,
            "version": None if manifest is None else manifest["version"],
            "base_rows": snap.n_base,
            "rows_since_base": snap.n_tail,
            "removed_rows": snap.n_dead,
            "segments": 0 if manifest is None else len(manifest["segments"]),
            "memory_mapped": self._mmap,
        }

    def __repr__(self) -> str:
        return f"Index({self._snap.spec!r}, factory={self.factory!r}, n_items={self.ntotal})"

    # ------------------------------------------------------------------ search
    def search(
        self,
        queries,
        top_k: int = 10,
        *,
        where: dict | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rescore: bool | None = None,
        **weight,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``top_k`` items per query: ``(scores, ids)``, the method's own scores, best first;
        ids are the items' ids.

        ``where``: a metadata filter (``{"split": "test", "year": {"gte": 2020}}``; see
        :mod:`hubless.index.metadata`): the results are the corrected ranking restricted to the
        items that match (the correction itself, its gates included, is the index's). Slots that
        cannot be filled (fewer matching items than ``top_k``, or IVF lists probed that ran dry)
        come last, with id ``-1`` (``MISSING``) and score ``-inf``; the CLI and the service
        leave them out.

        ``weight`` overrides the correction's weight per call (``weight=`` for every method, or
        its own name: ``alpha=`` for NNN, ``lam=`` for DN; scalar or one per query). ``nprobe``/``ef_search``/``rescore`` override the index
        defaults for this call only (other threads searching meanwhile are not affected).
        """
        # one version for the whole call, whatever writes happen meanwhile
        return searching.search(self._snap, queries, top_k, where=where, nprobe=nprobe, ef_search=ef_search, rescore=rescore, **weight)

    def search_uncorrected(
        self,
        queries,
        top_k: int = 10,
        *,
        where: dict | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rescore: bool | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The uncorrected top ``top_k``, ``(scores, ids)``: plain inner products <q, r> of the
        (normalised) queries, through the same structure as :meth:`search` (the weight-0 query
        [q, 0] on the FAISS index, the rows written since the base exactly; a Flat index is
        searched exactly), so comparing costs about one more search of the same kind. ANN
        candidates are re-scored exactly as in :meth:`search`; ``where`` filters as there;
        unfilled slots have id -1 and score -inf."""
        return searching.search_uncorrected(self._snap, queries, top_k, where=where, nprobe=nprobe, ef_search=ef_search, rescore=rescore)

    def calibrate(self, queries=None, *, target_recall: float = 0.95, top_k: int = 10, sample: int = 1000) -> dict:
        """Set ``config.nprobe`` / ``config.ef_search`` to the smallest power of two reaching
        ``target_recall`` of the exact corrected top-k on a sample of ``queries`` (default: the
        stored query bank); see :mod:`hubless.index.calibrate`. Returns the choice and the
        recall curve (and, on an index opened live, saves the new setting)."""
        from hubless.index.calibrate import calibrate

        result = calibrate(self, queries, target_recall=target_recall, top_k=top_k, sample=sample)
        config = dataclasses.replace(self.config)
        self._write(lambda snap: (snap.with_config(config), None))
        return result

    def search_knob(self) -> tuple[str, int] | None:
        """("nprobe", n_lists) for IVF, ("ef_search", limit) for HNSW, None for Flat."""
        return None if self._snap.faiss is None else search_knob(self._snap.faiss)

    # ------------------------------------------------------------------ writes
    def add(self, embeddings, metadata=None, *, ids=None, progress: bool | None = None) -> np.ndarray:
        """Add gallery items; returns their ids (``ids`` given, or assigned from ``next_id``).
        Their biases come from the stored banks (n_new x n_bank similarities; no other item's
        bias changes). All or nothing: an id already present (see :meth:`upsert`), a metadata
        value of another type than its key's, a wrong dimension changes nothing."""
        rows = as_embeddings(embeddings, "embeddings", normalize=self._snap.normalize, dim=self._snap.dim)
        return self._write(lambda snap: snap.added(rows, ids, metadata, progress=progress))

    def remove(self, ids=None, *, where: dict | None = None, progress: bool | None = None) -> np.ndarray:
        """Remove items by id; returns the ids removed. An unknown id is a NotFound naming it,
        and nothing is removed. The other items' biases do not change (DIS/DualDIS recompute
        the activation lists of bank items that lose a nearest item).

        ``where`` (instead of ids): remove every item matching this metadata filter (the
        syntax of :meth:`search`; evaluated on the version the write commits over), as one
        write that marks their rows dead (O(matches) written, no rewrite); returns their ids,
        sorted (none when nothing matches)."""
        if where is not None or ids is None:
            if ids is not None or where is None:
                raise InvalidInput("remove takes ids or where (a metadata filter), one of them")
            return self._write(lambda snap: snap.removed_where(where, progress=progress))
        ids = np.unique(check_ids(np.unique(np.asarray(ids).ravel()) if np.size(ids) else np.zeros(0, np.int64)))
        self._write(lambda snap: (snap.removed(ids, progress=progress), None))
        return ids

    def update_metadata(self, ids=None, *, where: dict | None = None, values=None, unset=None) -> np.ndarray:
        """Change the metadata of items without sending their embeddings again: the items
        ``ids`` (an unknown id is a NotFound, nothing changed) or every item matching ``where``
        (a metadata filter, as :meth:`search`'s). ``values``: a dict of keys to set on every
        item (a new key adds a column), or with ``ids`` a list of dicts, one per id, each
        setting only its own keys; ``unset``: keys set to null. Types are checked as on
        :meth:`add` (a value of another type than its key's changes nothing). Returns the ids
        changed (in the order given, or the index's order for ``where``).

        Embeddings, biases and bank statistics are kept, so no similarity is computed: each item
        is written again at the end of the index as an upsert with the same embedding would
        write it (see :meth:`hubless.index.live.Snapshot.with_metadata`), one segment of
        O(items changed). Like an upsert, the items move to the end of :attr:`ids` (ties in a
        ranking now fall to the items written before them)."""
        if (ids is None) == (where is None):
            raise InvalidInput("update_metadata takes ids or where (a metadata filter), one of them")
        if where is not None and values is not None and not isinstance(values, dict):
            raise InvalidInput("with where, values is one dict of keys to set on every matching item")

        def change(snap):
            rows = snap.rows_of(ids) if ids is not None else snap.matching_rows(where)
            return snap.with_metadata(rows, values, unset), snap.ids[rows].copy()

        return self._write(change)

    def upsert(self, ids, embeddings, metadata=None, *, progress: bool | None = None) -> np.ndarray:
        """Set items ``ids`` to ``embeddings`` (and ``metadata``): present ones are replaced,
        new ones added; returns the ids. All or nothing."""
        rows = as_embeddings(embeddings, "embeddings", normalize=self._snap.normalize, dim=self._snap.dim)
        ids = check_ids(ids, rows.shape[0])
        self._write(lambda snap: (snap.upserted(rows, ids, metadata, progress=progress), None))
        return ids

    def add_query_bank(self, queries, *, progress: bool | None = None) -> Index:
        """Add reference queries to the query bank: every item's bank statistics are merged
        with its similarities to the new queries (n_items x n_new, no full refit), so every
        bias changes (a new base is written); the FAISS structure keeps its training (an HNSW
        graph is kept as is)."""
        return self._add_bank_items(queries, "query", progress)

    def add_gallery_bank(self, items, *, progress: bool | None = None) -> Index:
        """Add reference items to the gallery bank (DualIS/DualDIS, DN), as :meth:`add_query_bank`."""
        return self._add_bank_items(items, "gallery", progress)

    def _add_bank_items(self, items, side: str, progress) -> Index:
        snap = self._snap
        new = as_embeddings(items, f"new {side}-bank items", normalize=snap.normalize, dim=snap.dim)
        self._write(lambda s: (s.with_bank_items(new, side, progress=progress), None))
        return self

    def compact(self) -> Index:
        """Fold the rows written since the base and drop removed rows: a new base of the live
        items (saved, for an index opened from a directory). Writes do this by themselves past
        the thresholds of :data:`COMPACT_MIN_ROWS` / :data:`COMPACT_FRACTION`."""
        self._write(lambda snap: (snap.compacted() if snap.n_tail or snap.n_dead else snap, None), full=True)
        return self

    def copy(self) -> Index:
        """An independent in-memory copy (cheap: versions are never changed in place)."""
        new = object.__new__(Index)
        new._setup(self._snap)
        return new

    def snapshot(self) -> Index:
        """This index's current version, which later writes (here or elsewhere) do not change:
        the searches, record lookups and metadata of one request agree. The same object for the
        same version (cheap: nothing is copied)."""
        snap = self._snap
        pinned = snap.extra.get("pinned")
        if pinned is None:
            pinned = snap.extra["pinned"] = self.copy()
        return pinned

    def _write(self, change, *, full: bool = False):
        """Apply ``change(snapshot) -> (new snapshot, result)``; an index opened live commits it
        at once under its write lock, after catching up with versions written elsewhere."""
        with self._lock:
            if self._path is None or self._locked or not self._live:  # in memory (committed later, if at all)
                new, result = change(self._snap)
                self._snap = new
                self._full = self._full or (full and self._locked)  # update() then commits a new base
                return result
            with write_lock(self._path, timeout=self.lock_timeout):
                self._catch_up()
                new, result = change(self._snap)
                self._commit(new, full=full)
            return result

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the index to the directory ``path`` as one atomic switch, under the index's
        write lock (see :mod:`hubless.index.disk`). ``overwrite`` replaces an existing hubless
        index only. Saving an index back to the directory it was loaded from writes only what
        changed (one segment); when another writer committed there since this index was loaded
        (or last refreshed), the save is a :class:`~hubless.errors.Conflict` and nothing is
        written (it would replace their writes): :meth:`refresh` first (without changes of
        its own), or load the index again."""
        path = Path(path)
        with self._lock:
            if self._path is not None and overwrite and _same_dir(self._path, path):
                with write_lock(path):
                    if disk.pointer_stamp(path) != self._stamp:
                        raise Conflict(
                            f"{path} changed since this index was loaded (another writer committed a version): saving would "
                            "replace it; load the index again (or refresh() an index without changes) and redo the changes"
                        )
                    self._commit(self._snap)
                return path
            _check_target(path, overwrite)
            with write_lock(path):
                _check_target(path, overwrite)  # another writer may have created it meanwhile
                self._save_fresh(path, locked=True)
            return path

    def _save_fresh(self, path: Path, *, locked: bool) -> None:
        """``path`` made to hold this index as a new base (whatever it held before)."""
        snap = self._snap.compacted() if self._snap.n_tail or self._snap.n_dead else self._snap
        created = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        previous = None
        try:
            previous, _ = disk.read_manifest(path) if disk.is_index(path) else (None, None)
        except ValueError:
            previous = None
        version = _next_number(path, previous)
        try:
            base = disk.write_base(path, snap, version)
            disk.commit(path, disk.manifest_for(snap, version, base, []), keep=disk.names_in(previous))
        except BaseException:
            if created:  # a failed first save leaves no directory behind
                shutil.rmtree(path, ignore_errors=True)
            raise
        self._snap = snap
        if self._path is not None and _same_dir(self._path, path):
            self._bind(path, disk.Loaded(snap, disk.manifest_for(snap, version, base, []), disk.pointer_stamp(path)), snap)

    def _bind(self, path: Path, loaded: disk.Loaded, base: Snapshot | None) -> None:
        self._path = path
        self._committed = loaded.snapshot
        self._manifest = loaded.manifest
        self._stamp = loaded.stamp
        self._base = base

    def _commit(self, new: Snapshot, *, full: bool = False) -> None:
        """Write what ``new`` changed since the committed version (the file lock is held): one
        segment; all segments folded into one past :data:`MAX_SEGMENTS`; a new base when the
        base changed, or past the compaction thresholds."""
        path, old, manifest = self._path, self._committed, self._manifest
        assert path is not None  # bound to a directory (a commit needs one)
        version = _next_number(path, manifest)
        grown = max(new.n_tail, new.n_dead) > COMPACT_MIN_ROWS + COMPACT_FRACTION * new.n_base or _segments_grown(manifest)
        same_base = manifest is not None and old is not None and new.base_rows is old.base_rows and new.faiss is old.faiss
        unsynced: list[Path] = []  # the segment written here: fsynced together with CURRENT
        if full or grown or not same_base:
            snap = new.compacted() if new.n_tail or new.n_dead else new
            base_entry = disk.write_base(path, snap, version)
            segments, base = [], snap
        else:
            assert manifest is not None and old is not None and self._base is not None  # same_base
            snap, base_entry, base = new, manifest["base"], self._base
            changed = new.n_rows != old.n_rows or new.killed_since(old).size > 0 or _lists_changed(old, new)
            segments = list(manifest["segments"])
            if changed and len(segments) + 1 > MAX_SEGMENTS:
                segments = [disk.write_delta(path, base, new, version, sync=False)]
            elif changed:
                segments.append(disk.write_delta(path, old, new, version, sync=False))
            if changed:
                unsynced = [path / segments[-1]["name"]]
            elif new.config.to_dict() == IndexConfig.from_dict(manifest["config"]).to_dict() and new.next_id == manifest["next_id"]:
                self._snap = new
                return  # nothing to write
        body = disk.manifest_for(snap, version, base_entry, segments)
        disk.commit(path, body, keep=disk.names_in(manifest), unsynced=unsynced)
        self._snap = snap
        self._bind(path, disk.Loaded(snap, body, disk.pointer_stamp(path)), base)

    def _catch_up(self) -> bool:
        """Follow versions committed by other writers since ours: their segments are replayed
        when they extend our version (O(what they wrote)), else the index is loaded anew."""
        path = self._path
        assert path is not None  # only an index loaded from a directory catches up
        stamp = disk.pointer_stamp(path)
        if stamp == self._stamp and self._committed is not None:
            return False
        manifest, _ = disk.read_manifest(path)
        old = self._manifest
        if manifest is not None and old is not None and self._committed is not None and manifest["base"] == old["base"]:
            k = len(old["segments"])
            try:
                if manifest["segments"][:k] == old["segments"]:  # later writes appended segments: read those
                    snap = disk.replay(path, self._committed, manifest, manifest["segments"][k:])
                else:  # segments were folded into one: replay them over our base
                    assert self._base is not None  # bound with the loaded base
                    snap = disk.replay(path, self._base, manifest, manifest["segments"])
            except disk.Gone:
                snap = None  # compacted again meanwhile: load anew
            if snap is not None:
                snap = snap.with_config(IndexConfig.from_dict(manifest["config"]))
                self._snap = snap
                self._bind(path, disk.Loaded(snap, manifest, stamp), self._base)
                return True
        loaded, base = _load(path, self._mmap)
        self._snap = loaded.snapshot
        self._bind(path, loaded, base)
        return True

    def refresh(self) -> bool:
        """Serve the latest version of the directory this index was loaded from, if another
        process (or another index object) wrote one: a cheap check of ``CURRENT`` (one stat),
        then only what was written since is read. Never waits for a writer (returns False when
        one holds this object). Returns whether the index changed."""
        if self._path is None or self._locked:
            return False
        if disk.pointer_stamp(self._path) == self._stamp:
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._snap is not self._committed:
                raise Conflict("this index has changes not saved yet: save them (or reload) before refreshing")
            return self._catch_up()
        finally:
            self._lock.release()

    @classmethod
    @contextlib.contextmanager
    def update(cls, path: str | os.PathLike, *, timeout: float | None = None, mmap: bool = False) -> Iterator[Index]:
        """Change a saved index safely against other writers::

            with hubless.Index.update("idx/") as index:
                index.add(new_items, metadata)

        Holds the index's write lock (:func:`hubless.index.lock.write_lock`; a second writer
        waits up to ``timeout`` s) from loading to saving; the changes made in the block are
        committed as one segment on leaving it, and nothing is written if the block raises.
        Readers keep loading the previous version meanwhile."""
        path = Path(path)
        with write_lock(path, timeout=timeout):
            index = cls._open_locked(path, mmap=mmap)
            index._locked = True
            try:
                yield index
                index._commit(index._snap, full=index._full)  # compact() in the block: a new base
            finally:
                index._locked = index._full = False

    @classmethod
    def _open_locked(cls, path: Path, *, mmap: bool = False) -> Index:
        loaded, base = _load(path, mmap)
        index = cls.__new__(cls)
        index._setup(loaded.snapshot, path=path, loaded=loaded, live=True, mmap=mmap)
        index._base = base
        return index

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False, version: int | None = None) -> Index:
        """Read an index saved by :meth:`save` (see :mod:`hubless.index.disk` for what is
        verified; an index of an earlier format is a :class:`~hubless.errors.Corrupt` saying to
        rebuild it). ``mmap=True`` maps the gallery, statistics, banks and IVF lists
        instead of reading them. Writes to the loaded index stay in memory until :meth:`save`;
        use :meth:`open` to commit each write at once.

        ``version``: that version, as it was committed (one the index keeps: see
        :meth:`versions`), as an in-memory index not bound to the directory (``save`` it
        elsewhere for a copy of that version, or :meth:`restore` it)."""
        if version is not None:
            loaded_version = disk.load_version(Path(path), check_positive_int(version, "version"), mmap=mmap)
            pinned = cls.__new__(cls)
            pinned._setup(loaded_version.snapshot, mmap=mmap)
            return pinned
        path = Path(path)
        loaded, base = _load(path, mmap)
        index = cls.__new__(cls)
        index._setup(loaded.snapshot, path=path, loaded=loaded, live=False, mmap=mmap)
        index._base = base
        return index

    @classmethod
    def open(cls, path: str | os.PathLike, *, mmap: bool = False) -> Index:
        """An index bound to its directory: every write (:meth:`add`, :meth:`remove`,
        :meth:`upsert`, bank updates, :meth:`compact`, :meth:`calibrate`) is committed at once,
        under the index's write lock (after catching up with what other processes wrote), at
        a cost proportional to the batch; :meth:`refresh` picks up versions written elsewhere."""
        index = cls.load(path, mmap=mmap)
        index._live = True
        return index

    # ------------------------------------------------------------------ versions
    @staticmethod
    def versions(path: str | os.PathLike) -> list[dict]:
        """The versions of the saved index at ``path`` that can be read, oldest first: the current
        one and those kept by ``keep_versions`` (:meth:`set_keep_versions`), each with its number,
        items, rows, segments, base and commit time (:func:`hubless.index.disk.list_versions`).
        A kept version's files are never changed or removed while it is kept: a copy of them
        (or ``Index.load(path, version=v).save(backup)``) is a backup, while writes go on."""
        return disk.list_versions(Path(path))

    @property
    def keep_versions(self) -> int:
        """How many versions the saved index keeps (the current one included; 0: none besides it)."""
        return self.config.keep_versions

    def set_keep_versions(self, n: int) -> Index:
        """Keep the ``n`` most recent versions of this index (the current one included) when it
        is saved or written: their manifests in ``versions/`` and every file they name, so each
        can be searched (``Index.load(path, version=v)``, ``hubless search --as-of``) and
        restored (:meth:`restore`); older ones are removed by the next write. 0 keeps none."""
        config = dataclasses.replace(self.config, keep_versions=n)  # validated by IndexConfig
        self._write(lambda snap: (snap.with_config(config), None))
        return self

    @classmethod
    def restore(cls, path: str | os.PathLike, version: int, *, timeout: float | None = None) -> int:
        """Make a kept version of the saved index at ``path`` current again, as a new version
        (under the write lock; the versions after it stay kept as retention allows). Its files
        are checked first (as a load checks them); the index keeps its ``next_id`` (an id
        assigned since is never assigned again) and its ``keep_versions``. Returns the new
        version's number."""
        path = Path(path)
        version = check_positive_int(version, "version")
        with write_lock(path, timeout=timeout):
            current, _ = disk.read_manifest(path)
            disk.load_version(path, version, mmap=True)  # every file there and readable
            target = disk.read_version(path, version)
            config = dict(target["config"])
            keep = int(current["config"].get("keep_versions") or 0)
            config.pop("keep_versions", None)
            if keep:
                config["keep_versions"] = keep
            number = _next_number(path, current)
            body = {**target, "version": number, "config": config, "next_id": max(int(target["next_id"]), int(current["next_id"]))}
            disk.commit(path, body, keep=disk.names_in(current))
        return number


def _load(path: Path, mmap: bool) -> tuple[disk.Loaded, Snapshot]:
    """A loaded index and its base alone (before the segments were replayed)."""
    loaded = disk.load(path, mmap=mmap)
    base = getattr(loaded, "base", None)
    return loaded, base if base is not None else loaded.snapshot


def _segments_grown(manifest: dict | None) -> bool:
    """Whether a version's segments outgrew its base in bytes (see :data:`COMPACT_MIN_BYTES`)."""
    if manifest is None or not manifest["segments"]:
        return False
    written = sum(s["bytes"] for s in manifest["segments"])
    base = sum(f["bytes"] for f in manifest["base"]["files"].values())
    return written > COMPACT_MIN_BYTES + COMPACT_FRACTION * base


def _lists_changed(old: Snapshot, new: Snapshot) -> bool:
    for side in ("query", "gallery"):
        a, b = getattr(old.bank, f"{side}_activation"), getattr(new.bank, f"{side}_activation")
        if a is not None and (a is not b) and not np.array_equal(a, b):
            return True
    return False


_VERSIONED = re.compile(r"[bs](\d{6})(?:\.seg)?")


def _next_number(path: Path, manifest: dict | None) -> int:
    """The next version number: above the current one and every base or segment on disk (a
    leftover of an interrupted write is never reused)."""
    numbers = [int(m.group(1)) for name in os.listdir(path) if (m := _VERSIONED.fullmatch(name))]
    return max([0 if manifest is None else manifest["version"], *numbers]) + 1


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def _is_flat(factory: str) -> bool:
    """Whether a factory string is the exact flat index."""
    return "".join(factory.split()).lower() == "flat"


def _check_target(path: Path, overwrite: bool) -> None:
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_dir():
        raise AlreadyExists(f"{path} exists and is not a directory; an index is saved as a directory")
    if disk.is_index(path):
        if not overwrite:
            raise AlreadyExists(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
    elif any(path.iterdir()):
        raise AlreadyExists(f"{path} is a directory that is not a hubless index; refusing to write into it, even with overwrite")
