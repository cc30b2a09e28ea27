"""``hubless.Index``: serve an additive correction at no query-time cost, and write to it live.

    index = hubless.Index.build(gallery, query_bank, method="nnn:alpha=0.75,k=16", factory="IVF1024,Flat")
    scores, ids = index.search(queries, top_k=10, weight=0.5)    # w changes per call, no rebuild
    scores, ids = index.search(queries, where={"split": "test", "year": {"gte": 2020}})
    index.save("idx/")
    live = hubless.Index.open("idx/")                              # every write is committed at once
    new_ids = live.add(rows, metadata=[...]); live.remove([3, 17]); live.upsert([5], row, [{...}])

Items have stable int64 ids (:mod:`hubless.index.ids`): given or assigned, never reused; search
results, :meth:`Index.get`, metadata and removals use them. After any sequence of writes a
search equals a fresh build over the live items (DIS/DualDIS activation sets included).

One job per module: :class:`Index` is the read-only :class:`~hubless.index.view.IndexView`
(search: :mod:`hubless.index.snapshot_search`; one version: :mod:`hubless.index.live`) plus the
writes, each a function of :mod:`hubless.index.writer` (O(batch): new items' biases come from
the stored banks, removed items are marked dead), committed to the directory it was loaded
from by :class:`~hubless.index.directory.Directory` (one segment per write, an atomic
``CURRENT`` switch: :mod:`hubless.index.disk`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import as_embeddings
from hubless.corrections import AdditiveCorrection, Correction, MethodName, make_additive
from hubless.engine import BankStatistics
from hubless.errors import Conflict, InvalidInput, NotFitted
from hubless.index import directory, writer
from hubless.index.building import check_build_arguments, kept_banks
from hubless.index.faiss_build import (
    Layout,
    plan_layout,
    stored_rows,
    with_spill,
)
from hubless.index.ids import check_ids
from hubless.index.live import Snapshot
from hubless.index.view import IndexView
from hubless.progress import stage

__all__ = ["Index"]


class Index(IndexView):
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
        banks = {"query_bank": query_bank, "gallery_bank": gallery_bank}
        self._setup(
            writer.built(
                correction,
                factory,
                ids=ids,
                metadata=metadata,
                metadata_schema=metadata_schema,
                banks=banks,
                spill=spill,
                faiss_built=_built,
                rescore=rescore,
                model=model,
                nprobe=nprobe,
                ef_search=ef_search,
                rescore_factor=rescore_factor,
            )
        )

    def _setup(self, snap: Snapshot, bound: directory.Directory | None = None, *, live: bool = False, mmap: bool = False) -> None:
        """The one place an index's state is set."""
        self._snap = snap
        self._dir = bound  # the directory it was loaded from and commits to (None: in memory)
        self._live = live  # every write committed at once (Index.open)
        self._mmap = mmap
        self._lock = threading.RLock()  # writers of this object, one at a time
        self._locked = False  # inside update(): the file lock is held, commit at the end
        self._full = False  # inside update(): compact() was called, the commit writes a new base
        #: Seconds a write waits for the index's file lock (None: HUBLESS_LOCK_TIMEOUT or 60).
        self.lock_timeout: float | None = None

    @property
    def _path(self) -> Path | None:
        """The directory this index is bound to (None: in memory)."""
        return None if self._dir is None else self._dir.path

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
            raise NotFitted(f"{type(correction).__name__} is not fitted")
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
        check_build_arguments(gallery, query_bank, factory, target_recall, max_memory, kwargs)  # before the fit
        corr = make_additive(method)
        if isinstance(method, str):
            corr.set_params(normalize=normalize)
        bias_error = None
        if bias_search == "exact":
            corr.fit(gallery, query_bank, gallery_bank, statistics=statistics, progress=progress)
        else:
            from hubless.index.ann_bias import fit_ann_bias

            bias_error = fit_ann_bias(corr, gallery, query_bank, gallery_bank, bias_search=bias_search, nprobe=bias_nprobe)
        qb, gb = kept_banks(corr, query_bank, gallery_bank) if keep_banks else (None, None)
        with stage("building the index structure" if target_recall is None else "choosing the index structure", progress):
            if target_recall is not None:
                from hubless.index.recall_tuning import tune_for_recall

                index = tune_for_recall(
                    cls,
                    corr,
                    query_bank,
                    target_recall=target_recall,
                    max_memory=max_memory,
                    factories=None if factory is None else [factory],
                    gallery_bank=gallery_bank,
                    keep_banks=keep_banks,
                    **kwargs,
                )
            else:
                index = cls(corr, factory, query_bank=qb, gallery_bank=gb, **kwargs)
        index.config.bias_error = bias_error
        return index

    def storage(self) -> dict[str, Any]:
        """How the index is held: rows in its base and written since, removed rows not yet
        compacted, and (for a saved index) its version and segments."""
        return directory.storage(self._snap, self._dir, mmap=self._mmap)

    def calibrate(self, queries=None, *, target_recall: float = 0.95, top_k: int = 10, sample: int = 1000) -> dict:
        """Set ``config.nprobe`` / ``config.ef_search`` to the smallest power of two reaching
        ``target_recall`` of the exact corrected top-k on a sample of ``queries`` (default: the
        stored query bank); see :mod:`hubless.index.calibrate`. Returns the choice and the
        recall curve (and, on an index opened live, saves the new setting)."""
        from hubless.index.calibrate import calibrate

        result = calibrate(self, queries, target_recall=target_recall, top_k=top_k, sample=sample)
        config = dataclasses.replace(self.config)
        self._write(lambda snap: (writer.with_config(snap, config), None))
        return result

    # ------------------------------------------------------------------ writes
    def add(self, embeddings, metadata=None, *, ids=None, progress: bool | None = None) -> np.ndarray:
        """Add gallery items; returns their ids (``ids`` given, or assigned from ``next_id``).
        Their biases come from the stored banks (n_new x n_bank similarities; no other item's
        bias changes). All or nothing: an id already present (see :meth:`upsert`), a metadata
        value of another type than its key's, a wrong dimension changes nothing."""
        rows = as_embeddings(embeddings, "embeddings", normalize=self._snap.normalize, dim=self._snap.dim)
        return self._write(lambda snap: writer.added(snap, rows, ids, metadata, progress=progress))

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
            return self._write(lambda snap: writer.removed_where(snap, where, progress=progress))
        ids = np.unique(check_ids(np.asarray(ids).ravel() if np.size(ids) else np.zeros(0, np.int64)))  # repeated ids refused
        self._write(lambda snap: (writer.removed(snap, ids, progress=progress), None))
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
        write it (see :func:`hubless.index.writer.with_metadata`), one segment of
        O(items changed). Like an upsert, the items move to the end of :attr:`ids` (ties in a
        ranking now fall to the items written before them)."""
        if (ids is None) == (where is None):
            raise InvalidInput("update_metadata takes ids or where (a metadata filter), one of them")
        if where is not None and values is not None and not isinstance(values, dict):
            raise InvalidInput("with where, values is one dict of keys to set on every matching item")

        def change(snap):
            rows = snap.rows_of(ids) if ids is not None else snap.matching_rows(where)
            return writer.with_metadata(snap, rows, values, unset), snap.ids[rows].copy()

        return self._write(change)

    def upsert(self, ids, embeddings, metadata=None, *, progress: bool | None = None) -> np.ndarray:
        """Set items ``ids`` to ``embeddings`` (and ``metadata``): present ones are replaced,
        new ones added; returns the ids. All or nothing."""
        rows = as_embeddings(embeddings, "embeddings", normalize=self._snap.normalize, dim=self._snap.dim)
        ids = check_ids(ids, rows.shape[0])
        self._write(lambda snap: (writer.upserted(snap, rows, ids, metadata, progress=progress), None))
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
        self._write(lambda s: (writer.with_bank_items(s, new, side, progress=progress), None))
        return self

    def compact(self) -> Index:
        """Fold the rows written since the base and drop removed rows: a new base of the live
        items (saved, for an index opened from a directory). Writes do this by themselves past
        the thresholds of :data:`hubless.index.directory.COMPACT_MIN_ROWS` / ``COMPACT_FRACTION``."""
        self._write(lambda snap: (writer.compacted(snap) if snap.n_tail or snap.n_dead else snap, None), full=True)
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
            if self._dir is None or self._locked or not self._live:  # in memory (committed later, if at all)
                new, result = change(self._snap)
                self._snap = new
                self._full = self._full or (full and self._locked)  # update() then commits a new base
                return result
            with self._dir.lock(self.lock_timeout):
                self._catch_up()
                new, result = change(self._snap)
                self._snap = self._dir.commit(new, full=full)
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
            if self._dir is not None and overwrite and directory.same_dir(self._dir.path, path):
                with self._dir.lock():
                    if self._dir.changed():
                        raise Conflict(
                            f"{path} changed since this index was loaded (another writer committed a version): saving would "
                            "replace it; load the index again (or refresh() an index without changes) and redo the changes"
                        )
                    self._snap = self._dir.commit(self._snap)
                return path
            written = directory.write_snapshot(path, self._snap, overwrite=overwrite)
            self._snap = written.snapshot
            if self._dir is not None and directory.same_dir(self._dir.path, path):
                self._dir.bind(written, written.snapshot)
            return path

    def _catch_up(self) -> bool:
        """Follow versions committed by other writers since ours (:meth:`Directory.catch_up`)."""
        assert self._dir is not None  # only an index loaded from a directory catches up
        snap = self._dir.catch_up()
        if snap is None:
            return False
        self._snap = snap
        return True

    def refresh(self) -> bool:
        """Serve the latest version of the directory this index was loaded from, if another
        process (or another index object) wrote one: a cheap check of ``CURRENT`` (one stat),
        then only what was written since is read. Never waits for a writer (returns False when
        one holds this object). Returns whether the index changed."""
        if self._dir is None or self._locked or not self._dir.changed():
            return False
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if self._snap is not self._dir.committed:
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

        Holds the index's write lock (:func:`hubless.index.directory.index_lock`; a second
        writer waits up to ``timeout`` s) from loading to saving; the changes made in the block
        are committed as one segment on leaving it, and nothing is written if the block raises.
        Readers keep loading the previous version meanwhile."""
        path = Path(path)
        with directory.index_lock(path, timeout=timeout):
            index = cls._open_locked(path, mmap=mmap)
            index._locked = True
            try:
                yield index
                assert index._dir is not None  # opened from its directory
                index._snap = index._dir.commit(index._snap, full=index._full)  # compact() in the block: a new base
            finally:
                index._locked = index._full = False

    @classmethod
    def _open_locked(cls, path: Path, *, mmap: bool = False) -> Index:
        bound = directory.Directory.load(path, mmap=mmap)
        index = cls.__new__(cls)
        index._setup(bound.committed, bound, live=True, mmap=mmap)
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
            pinned = cls.__new__(cls)
            pinned._setup(directory.load_version(path, version, mmap=mmap), mmap=mmap)
            return pinned
        bound = directory.Directory.load(path, mmap=mmap)
        index = cls.__new__(cls)
        index._setup(bound.committed, bound, live=False, mmap=mmap)
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
        items, rows, segments, base and commit time (:func:`hubless.index.versions.list_versions`).
        A kept version's files are never changed or removed while it is kept: a copy of them
        (or ``Index.load(path, version=v).save(backup)``) is a backup, while writes go on."""
        return directory.versions(path)

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
        self._write(lambda snap: (writer.with_config(snap, config), None))
        return self

    @classmethod
    def restore(cls, path: str | os.PathLike, version: int, *, timeout: float | None = None) -> int:
        """Make a kept version of the saved index at ``path`` current again, as a new version
        (under the write lock; the versions after it stay kept as retention allows). Its files
        are checked first (as a load checks them); the index keeps its ``next_id`` (an id
        assigned since is never assigned again) and its ``keep_versions``. Returns the new
        version's number."""
        return directory.restore(path, version, timeout=timeout)
