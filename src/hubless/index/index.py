"""``hubless.Index``: serve an additive correction from a FAISS index at no query-time cost.

    index = hubless.Index.build(gallery, query_bank, method="nnn:alpha=0.75,k=16", factory="IVF1024,Flat")
    scores, ids = index.search(queries, top_k=10, alpha=0.5)     # w changes per call, no rebuild
    index.save("idx/");  index = hubless.Index.load("idx/")

The FAISS index holds [r, bias(r)] and is queried with [q, -W(q)] (see
:mod:`hubless.index.faiss_build` for how ANN structures are kept free of the bias). With
``rescore=True`` (default for every non-Flat index) the ANN returns ``rescore_factor x top_k``
candidates, which are re-scored exactly by the correction's ranking hook from the stored
gallery and biases, so approximation only affects which items become candidates. Raw-neighbour
statistics a correction asks for (the DIS/DualDIS gates' raw top-1, CSLS's r_q) come from one
extra search of the same index with w = 0.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import as_embeddings, check_positive_int, check_top_k
from hubless.corrections import AdditiveCorrection, Correction, QueryBatch, QueryStatistics, make_correction
from hubless.engine import BankStatistics, exact_search
from hubless.errors import InvalidInput, InvalidType, NotFittedError
from hubless.index import store
from hubless.index.config import IndexConfig
from hubless.index.factory import check_factory
from hubless.index.faiss_build import (
    Layout,
    append_rows,
    build_faiss,
    default_factory,
    plan_layout,
    replace_rows,
    search_knob,
    search_parameters,
    search_rows,
    stored_rows,
    with_spill,
)
from hubless.index.lock import write_lock

__all__ = ["Index", "IndexConfig", "augmented_rows"]

#: Id FAISS returns for a slot it could not fill (e.g. probed IVF lists ran dry).
MISSING = -1
#: From this many queries on, a Flat index searches with hubless's engine instead of FAISS's scan.
FLAT_ENGINE_BATCH = 8


class Index:
    """A searchable gallery corrected by one additive correction (see module docstring).

    Build with :meth:`build` (fits the correction) or ``Index(correction, factory)`` from a
    fitted correction. ``metadata``: optional per-item records (a list of dicts, or a dict of
    columns), kept aligned with the gallery through add/remove and saved as parquet.
    ``config`` holds the factory, model name and search defaults (:class:`IndexConfig`).
    ``spill``: IVF only, the share of items with the lowest bias also stored in their second
    list (default 0.3; 0 turns it off), so corrected IVF finds what plain IVF finds at the same
    ``nprobe`` (see :mod:`hubless.index.faiss_build` and docs/corrected-ann.md).
    """

    def __init__(
        self,
        correction: AdditiveCorrection,
        factory: str | None = None,
        *,
        query_bank: np.ndarray | None = None,
        gallery_bank: np.ndarray | None = None,
        metadata=None,
        model: str | None = None,
        nprobe: int = 16,
        ef_search: int = 64,
        rescore: bool | None = None,
        rescore_factor: int = 4,
        spill: float | None = None,
        _built=None,
    ) -> None:
        _check_servable(correction)
        if not correction.is_fitted:
            raise NotFittedError(f"{type(correction).__name__} is not fitted: fit it first, or use Index.build")
        factory = factory or default_factory(correction.n_gallery_)
        rescore = not _is_flat(factory) if rescore is None else rescore
        config = IndexConfig(factory, model, nprobe, ef_search, rescore, rescore_factor)
        t0 = time.perf_counter()
        if _built is None:
            faiss_index, layout = build_faiss(config.factory, correction.gallery_, augmented_rows(correction), spill=spill)
        else:  # built elsewhere (see from_faiss)
            faiss_index, layout = _built
        config.spill, config.spill_below, config.bias_offset = layout.spill, layout.spill_below, layout.bias_offset
        dim = layout.dim
        config.build_seconds = time.perf_counter() - t0
        self._setup(
            correction, config, faiss_index, dim, query_bank, gallery_bank, _as_records(metadata, correction.n_gallery_), mmap=False
        )

    @classmethod
    def from_faiss(cls, correction: AdditiveCorrection, faiss_index, factory: str, *, spill: float = 0.0, **options) -> Index:
        """An index over a FAISS index built elsewhere (by :func:`hubless.distributed.build_index`,
        say) that holds the rows of the fitted ``correction``'s gallery, in order, laid out by
        :func:`~hubless.index.faiss_build.train_empty` (IVF items spilled with ``spill``).
        ``options``: as the constructor's (banks, metadata, model, search defaults)."""
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

    def _setup(self, correction, config: IndexConfig, faiss_index, dim: int, query_bank, gallery_bank, metadata, *, mmap: bool) -> None:
        """The one place an index's state is set (by the constructor and by :meth:`load`)."""
        self.correction = correction
        self.config = config
        self.query_bank = query_bank
        self.gallery_bank = gallery_bank
        self.metadata = metadata
        self._faiss, self._dim, self._mmap = faiss_index, dim, mmap

    @property
    def _layout(self) -> Layout:
        """How the FAISS rows are laid out (see :class:`~hubless.index.faiss_build.Layout`)."""
        offset = self.correction.dim_ if self.config.bias_offset is None else self.config.bias_offset
        return Layout(self._dim, offset, self.config.spill, self.config.spill_below)

    # ------------------------------------------------------------------ construction
    @classmethod
    def build(
        cls,
        gallery,
        query_bank=None,
        method: str | Correction = "nnn",
        factory: str | None = None,
        *,
        gallery_bank=None,
        normalize: bool = True,
        keep_banks: bool = True,
        bias_search: str = "exact",
        bias_nprobe: int = 32,
        progress: bool | None = None,
        statistics: BankStatistics | None = None,
        **kwargs,
    ) -> Index:
        """Fit ``method`` (a spec such as ``"nnn:alpha=0.75,k=16"``) on the banks and index the
        gallery. ``keep_banks`` stores the banks so :meth:`add` can compute new items' biases.

        ``bias_search``: "exact" (streamed, every similarity) or "ann" / a FAISS factory string
        for the bank ("IVF2048,Flat", "HNSW32"): sublinear top-k statistics (NNN, CSLS, DN only),
        with ``bias_nprobe`` lists visited; the error on a 1,000-item sample is then in
        ``index.bias_error`` (see :mod:`hubless.index.ann_bias`). ``statistics``: bank
        statistics of these very arrays computed already (e.g. by
        :func:`hubless.corrections.fit_shared` with the bank's coverage), so the banks are not
        read again.
        """
        corr = make_correction(method)
        if isinstance(method, str):
            corr.set_params(normalize=normalize)
        _check_servable(corr)
        shape = np.shape(gallery)
        if factory is not None and len(shape) == 2:  # before the fit: a bad factory fails in a second, not after it
            check_factory(factory, shape[0], shape[1] + 1)
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
        index = cls(corr, factory, query_bank=qb, gallery_bank=gb, **kwargs)
        index.config.bias_error = bias_error
        return index

    # ------------------------------------------------------------------ description
    @property
    def ntotal(self) -> int:
        return self.correction.n_gallery_

    @property
    def factory(self) -> str:
        return self.config.factory

    @property
    def model(self) -> str | None:
        return self.config.model

    @property
    def bias_error(self) -> dict[str, float] | None:
        """Mean and max |bias_ann - bias_exact| on a sample when biases came from an ANN search."""
        return self.config.bias_error

    def info(self) -> dict[str, Any]:
        corr = self.correction
        stats = corr.statistics_  # the bank sizes the biases come from (kept banks or not: a distributed fit keeps none)
        return {
            "method": corr.spec,
            "n_items": self.ntotal,
            "dim": corr.dim_,
            "bias_columns": int(corr.bias_columns_.shape[1]),
            "normalize": bool(corr.normalize),
            "n_query_bank": int(stats.n_query_bank) if corr.needs_query_bank else None,
            "n_gallery_bank": None if stats.n_gallery_bank is None else int(stats.n_gallery_bank),
            "banks_kept": self.query_bank is not None or self.gallery_bank is not None,
            "metadata_columns": sorted({k for r in self.metadata for k in r}) if self.metadata else [],
            **self.config.to_dict(),
        }

    def __repr__(self) -> str:
        return f"Index({self.correction.spec!r}, factory={self.factory!r}, n_items={self.ntotal})"

    # ------------------------------------------------------------------ search
    def search(
        self,
        queries,
        top_k: int = 10,
        *,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rescore: bool | None = None,
        **weight,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top ``top_k`` items per query: ``(scores, ids)``, the method's own scores, best first.

        An ANN index can find fewer than ``top_k`` items for a query (the IVF lists it probed ran
        dry): the unfilled slots come last, with id ``-1`` (``hubless.index.index.MISSING``)
        and score ``-inf``; the CLI and the service leave them out.

        ``weight`` overrides the correction's weight per call (``weight=`` for every method, or
        its own name: ``alpha=`` for NNN, ``lam=`` for DN; scalar or one per query). ``nprobe``/``ef_search``/``rescore`` override the index
        defaults for this call only (other threads searching meanwhile are not affected).
        """
        corr = self.correction
        nprobe = self.config.nprobe if nprobe is None else check_positive_int(nprobe, "nprobe")
        ef_search = self.config.ef_search if ef_search is None else check_positive_int(ef_search, "ef_search")
        if _is_flat(self.factory) and (not corr.exactly_additive or np.shape(queries)[0] >= FLAT_ENGINE_BATCH):
            # exact either way; hubless's streamed GEMM engine is ~4x faster than FAISS's flat scan for
            # batches (measured: 32 queries over 100k x 512 in 45 ms vs 203 ms), and it alone ranks
            # scores that are only partly a bias (published DualDIS)
            return corr.search(queries, check_top_k(top_k, self.ntotal), **weight)
        batch = corr.queries(queries, **weight)
        top_k = check_top_k(top_k, self.ntotal)
        params = search_parameters(self._faiss, nprobe=nprobe, ef_search=ef_search)
        self._raw_statistics(batch, params)
        weights = np.ascontiguousarray(corr.weights(batch), dtype=np.float32)
        # a score only partly of bias form is always re-scored exactly (candidates from the bias form)
        do_rescore = (self.config.rescore if rescore is None else bool(rescore)) or not corr.exactly_additive
        depth = min(self.ntotal, top_k * self.config.rescore_factor) if do_rescore else top_k
        ranking, ids = self._faiss_search(batch.vectors, -weights, depth, params)
        if do_rescore:
            ranking, ids = self._rescore(batch, ids, top_k)
        found = ids != MISSING
        if found.all():
            return corr.method_scores(batch, ranking), ids
        scores = corr.method_scores(batch, np.where(found, ranking, 0).astype(np.float32))
        return np.where(found, scores, -np.inf).astype(np.float32), ids

    def search_uncorrected(
        self, queries, top_k: int = 10, *, nprobe: int | None = None, ef_search: int | None = None, rescore: bool | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The uncorrected top ``top_k``, ``(scores, ids)``: plain inner products <q, r> of the
        (normalised) queries, through the same structure as :meth:`search` (the weight-0 query
        [q, 0] on the FAISS index; a Flat index is searched exactly), so comparing costs about
        one more search of the same kind, not an exact scan of the gallery. ANN candidates are
        re-scored exactly as in :meth:`search`; unfilled slots have id -1 and score -inf."""
        corr = self.correction
        vectors = corr.queries(queries).vectors
        top_k = check_top_k(top_k, self.ntotal)
        if _is_flat(self.factory):
            return exact_search(vectors, corr.gallery_, top_k)
        nprobe = self.config.nprobe if nprobe is None else check_positive_int(nprobe, "nprobe")
        ef_search = self.config.ef_search if ef_search is None else check_positive_int(ef_search, "ef_search")
        params = search_parameters(self._faiss, nprobe=nprobe, ef_search=ef_search)
        do_rescore = self.config.rescore if rescore is None else bool(rescore)
        depth = min(self.ntotal, top_k * self.config.rescore_factor) if do_rescore else top_k
        zeros = np.zeros((vectors.shape[0], corr.bias_columns_.shape[1]), np.float32)
        scores, ids = self._faiss_search(vectors, zeros, depth, params)
        if not do_rescore:
            return np.where(ids != MISSING, scores, -np.inf).astype(np.float32), ids
        found = ids != MISSING
        sims = np.einsum("qd,qkd->qk", vectors, corr.gallery_[np.where(found, ids, 0)])
        sims = np.where(found, sims, -np.inf).astype(np.float32)
        order = np.lexsort((np.where(found, ids, np.iinfo(np.int64).max), -sims), axis=1)[:, :top_k]
        return np.take_along_axis(sims, order, axis=1), np.take_along_axis(ids, order, axis=1)

    def _raw_statistics(self, batch: QueryBatch, params) -> None:
        """Fill the raw-neighbour statistics the correction asks for from this index (w = 0);
        queries the index found too few raw neighbours for get them by exact search."""
        corr = self.correction
        request = corr.query_request
        if not request.depth:
            return
        depth = min(request.depth, self.ntotal)
        zeros = np.zeros((len(batch), corr.bias_columns_.shape[1]), np.float32)
        scores, ids = self._faiss_search(batch.vectors, zeros, depth, params)
        short = np.flatnonzero((ids == MISSING).any(axis=1))
        if short.size:
            scores[short], ids[short] = exact_search(batch.vectors[short], corr.gallery_, depth)
        batch.statistics = QueryStatistics.from_neighbours(request, scores, ids)

    def _faiss_search(self, q: np.ndarray, extra: np.ndarray, k: int, params):
        return search_rows(self._faiss, q, extra, k, params, self._layout)

    def _rescore(self, batch: QueryBatch, ids: np.ndarray, top_k: int):
        """Exact ranking scores of the candidates by the correction's ranking hook, sorted (ties
        to the lower id); missing ids (lists that ran dry) sort last."""
        corr = self.correction
        found = ids != MISSING
        safe = np.where(found, ids, 0)
        sims = np.einsum("qd,qkd->qk", batch.vectors, corr.gallery_[safe])
        ranking = corr.rank(batch, sims, columns=safe, out=sims)
        ranking = np.where(found, ranking, -np.inf).astype(np.float32)
        order = np.lexsort((np.where(found, ids, np.iinfo(np.int64).max), -ranking), axis=1)[:, :top_k]
        return np.take_along_axis(ranking, order, axis=1), np.take_along_axis(ids, order, axis=1)

    def calibrate(self, queries=None, *, target_recall: float = 0.95, top_k: int = 10, sample: int = 1000) -> dict:
        """Set ``config.nprobe`` / ``config.ef_search`` to the smallest power of two reaching
        ``target_recall`` of the exact corrected top-k on a sample of ``queries`` (default: the
        stored query bank); see :mod:`hubless.index.calibrate`. Returns the choice and the
        recall curve."""
        from hubless.index.calibrate import calibrate

        return calibrate(self, queries, target_recall=target_recall, top_k=top_k, sample=sample)

    def search_knob(self) -> tuple[str, int] | None:
        """("nprobe", n_lists) for IVF, ("ef_search", limit) for HNSW, None for Flat."""
        return search_knob(self._faiss)

    # ------------------------------------------------------------------ updates
    def copy(self) -> Index:
        """An independent copy (the FAISS structure cloned, in memory), e.g. to update while
        other threads keep searching this one (copy-on-write)."""
        import faiss

        new = copy.copy(self)
        new._faiss, new._mmap = faiss.clone_index(self._faiss), False
        new.config = dataclasses.replace(self.config)
        new.metadata = None if self.metadata is None else list(self.metadata)
        return new

    def add(self, embeddings, metadata=None, *, progress: bool | None = None) -> Index:
        """Add gallery items: their biases come from the stored banks (n_new x n_bank
        similarities; the other items' biases do not change) and they are inserted into the
        FAISS structure, whose training is kept (new items join the existing IVF lists)."""
        corr = self.correction
        new = as_embeddings(embeddings, "embeddings", normalize=corr.normalize, dim=corr.dim_)
        if corr.needs_query_bank and self.query_bank is None:
            raise InvalidInput("this index was saved without its banks (keep_banks=False): it cannot compute new biases")
        records = None
        if self.metadata is not None or metadata is not None:
            old = self.metadata if self.metadata is not None else [{} for _ in range(self.ntotal)]
            records = old + (_as_records(metadata, new.shape[0]) or [{} for _ in range(new.shape[0])])
        updated = copy.copy(corr).add_items(new, self.query_bank, self.gallery_bank, progress=progress)
        self._update_faiss(updated, append_from=corr.n_gallery_)
        self.metadata = records
        return self

    def remove(self, ids: Sequence[int], *, progress: bool | None = None) -> Index:
        """Remove gallery items by position; later items move up (positions stay 0..n-1). The
        other items' biases do not change (DIS/DualDIS recompute the activation top-k of bank
        items that lose a neighbour); the FAISS structure is refilled with its training kept."""
        ids = np.unique(np.asarray(ids, dtype=np.int64).ravel())
        updated = copy.copy(self.correction).remove_items(ids, self.query_bank, self.gallery_bank, progress=progress)
        self._update_faiss(updated)
        if self.metadata is not None:
            gone = set(ids.tolist())
            self.metadata = [r for i, r in enumerate(self.metadata) if i not in gone]
        return self

    def add_query_bank(self, queries, *, progress: bool | None = None) -> Index:
        """Add reference queries to the query bank: every item's bank statistics are merged
        with its similarities to the new queries (n_gallery x n_new, no full refit), so every
        bias changes; the FAISS structure keeps its training (an HNSW graph is kept as is)."""
        return self._add_bank_items(queries, "query", progress)

    def add_gallery_bank(self, items, *, progress: bool | None = None) -> Index:
        """Add reference items to the gallery bank (DualIS/DualDIS, DN), as :meth:`add_query_bank`."""
        return self._add_bank_items(items, "gallery", progress)

    def _add_bank_items(self, items, side: str, progress) -> Index:
        corr = self.correction
        new = as_embeddings(items, f"new {side}-bank items", normalize=corr.normalize, dim=corr.dim_)
        updated = copy.copy(corr)
        updated = updated.add_query_bank(new, progress=progress) if side == "query" else updated.add_gallery_bank(new, progress=progress)
        self._update_faiss(updated, same_items=True)
        bank = self.query_bank if side == "query" else self.gallery_bank
        if bank is not None:
            setattr(self, f"{side}_bank", np.concatenate([bank, new]))
        return self

    def _update_faiss(self, updated: AdditiveCorrection, *, append_from: int | None = None, same_items: bool = False) -> None:
        """Bring the FAISS structure in line with ``updated``, then make it the correction."""
        augmented = augmented_rows(updated)
        layout = self._layout
        if self._mmap:  # memory-mapped inverted lists are read-only: build in memory instead
            self._faiss, layout = build_faiss(self.factory, updated.gallery_, augmented, spill=layout.spill)
            self._dim, self._mmap, self.config.bias_offset = layout.dim, False, layout.bias_offset
        elif append_from is not None:
            append_rows(self._faiss, updated.gallery_, augmented, append_from, layout)
        else:
            layout = replace_rows(self._faiss, updated.gallery_, augmented, layout, same_items=same_items)
        self.config.spill_below = layout.spill_below
        self.correction = updated

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the index to the directory ``path`` as one atomic switch, under the index's
        write lock (see :mod:`hubless.index.store`). ``overwrite`` replaces an existing hubless
        index only. To change a saved index, use :meth:`update` (it locks from load to save)."""
        return self._save(path, overwrite=overwrite, locked=False)

    def _save(self, path, *, overwrite: bool, locked: bool) -> Path:
        return store.save_index(
            path,
            faiss_index=self._faiss,
            faiss_dim=self._dim,
            correction=self.correction,
            config=self.config,
            banks={"query_bank": self.query_bank, "gallery_bank": self.gallery_bank},
            metadata=self.metadata,
            overwrite=overwrite,
            locked=locked,
        )

    @classmethod
    @contextlib.contextmanager
    def update(cls, path: str | os.PathLike, *, timeout: float | None = None) -> Iterator[Index]:
        """Change a saved index safely against other writers::

            with hubless.Index.update("idx/") as index:
                index.add(new_items, metadata)

        Holds the index's write lock (:func:`hubless.index.lock.write_lock`; a second writer
        waits up to ``timeout`` s) from loading to saving, so concurrent updates are applied one
        after the other and none is lost; the new version is saved on leaving the block, and
        nothing is saved if the block raises. Readers keep loading the previous version meanwhile.
        """
        with write_lock(path, timeout=timeout):
            index = cls.load(path)
            yield index
            index._save(path, overwrite=True, locked=True)

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False) -> Index:
        """Read an index saved by :meth:`save`, verifying format version and checksums."""
        saved = store.load_index(path, mmap=mmap)
        _check_servable(saved.correction)
        index = cls.__new__(cls)
        index._setup(
            saved.correction, saved.config, saved.faiss_index, saved.faiss_dim,
            saved.banks.get("query_bank"), saved.banks.get("gallery_bank"), saved.metadata, mmap=mmap,
        )  # fmt: skip
        return index


def _is_flat(factory: str) -> bool:
    """Whether a factory string is the exact flat index."""
    return "".join(factory.split()).lower() == "flat"


def _check_servable(correction: Correction) -> None:
    if not correction.additive:
        raise InvalidType(
            f"{type(correction).__name__} is not additive (GC ranks by probes): it cannot be served from a "
            "vector index; use its exact search()"
        )


def augmented_rows(corr: AdditiveCorrection) -> np.ndarray:
    """The rows a FAISS index holds: [r, bias(r)] for every gallery item r."""
    return np.hstack([corr.gallery_, corr.bias_columns_]).astype(np.float32)


def _as_records(metadata, n: int) -> list[dict] | None:
    """Metadata as a list of n dicts (accepts a list of dicts or a dict of equal-length columns)."""
    if metadata is None:
        return None
    if isinstance(metadata, dict):
        columns = {k: list(v) for k, v in metadata.items()}
        lengths = {len(v) for v in columns.values()}
        if lengths and lengths != {n}:
            raise InvalidInput(f"metadata columns must have one value per item ({n}); got lengths {sorted(lengths)}")
        return [{k: v[i] for k, v in columns.items()} for i in range(n)]
    records = list(metadata)
    if len(records) != n or not all(isinstance(r, dict) for r in records):
        raise InvalidInput(f"metadata must be {n} dicts (one per item) or a dict of columns")
    return records
