"""``hubless.Index``: serve an additive correction from a FAISS index at no query-time cost.

    index = hubless.Index.build(gallery, query_bank, method="nnn:alpha=0.75,k=16", factory="IVF1024,Flat")
    scores, ids = index.search(queries, top_k=10, alpha=0.5)     # w changes per call, no rebuild
    index.save("idx/");  index = hubless.Index.load("idx/")

The FAISS index holds [r, bias(r)] and is queried with [q, -w] (see
:mod:`hubless.index.faiss_build` for how ANN structures are kept free of the bias). With
``rescore=True`` (default for every non-Flat index) the ANN returns ``rescore_factor x top_k``
candidates, which are re-scored exactly from the stored gallery and biases, so approximation
only affects which items become candidates. DIS/DualDIS gates use one extra raw top-1 lookup on
the same index (w = 0).
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import as_embeddings, check_positive_int, check_top_k
from hubless.corrections import AdditiveCorrection, Correction, make_correction
from hubless.index.faiss_build import append_rows, build_faiss, default_factory, replace_rows, set_search_params

__all__ = ["Index"]


class Index:
    """A searchable gallery corrected by one additive correction (see module docstring).

    Build with :meth:`build` (fits the correction) or ``Index(correction, factory)`` from a
    fitted correction.
    ``metadata``: optional per-item records (a list of dicts, or a dict of columns), kept aligned
    with the gallery through add/remove and saved as parquet.
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
    ) -> None:
        if not isinstance(correction, AdditiveCorrection):
            raise TypeError(
                f"{type(correction).__name__} is not additive (GC ranks by probes): it cannot be served from a "
                "vector index; use its exact search()"
            )
        correction._check_fitted()
        self.correction = correction
        self.factory = factory or default_factory(correction.n_gallery_)
        self.query_bank = query_bank
        self.gallery_bank = gallery_bank
        self.model = model
        self.nprobe = check_positive_int(nprobe, "nprobe")
        self.ef_search = check_positive_int(ef_search, "ef_search")
        self.rescore = (self.factory.strip().lower() != "flat") if rescore is None else bool(rescore)
        self.rescore_factor = check_positive_int(rescore_factor, "rescore_factor")
        self.metadata = _as_records(metadata, correction.n_gallery_)
        t0 = time.perf_counter()
        self._faiss, self._dim = build_faiss(self.factory, correction.gallery_, augmented_rows(correction))
        self.build_seconds = time.perf_counter() - t0
        self.bias_error = None
        self._mmap = False

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
        **kwargs,
    ) -> Index:
        """Fit ``method`` (a spec such as ``"nnn:alpha=0.75,k=16"``) on the banks and index the
        gallery. ``keep_banks`` stores the banks so :meth:`add` can compute new items' biases.

        ``bias_search``: "exact" (streamed, every similarity) or "ann" / a FAISS factory string
        for the bank ("IVF2048,Flat", "HNSW32"): sublinear top-k statistics (NNN, CSLS, DN only),
        with ``bias_nprobe`` lists visited; the error on a 1,000-item sample is then in
        ``index.bias_error`` (see :mod:`hubless.engine.ann`).
        """
        corr = make_correction(method)
        if isinstance(method, str):
            corr.set_params(normalize=normalize)
        bias_error = None
        if bias_search == "exact":
            corr.fit(gallery, query_bank, gallery_bank, progress=progress)
        else:
            from hubless.corrections.base import validate_fit_inputs
            from hubless.engine.ann import ann_statistics, bias_error as measure

            g, qb, gb = validate_fit_inputs([corr], gallery, query_bank, gallery_bank)
            factory_ann = None if bias_search == "ann" else bias_search
            stats = ann_statistics(g, qb, gb, corr.statistics_request(), factory=factory_ann, nprobe=bias_nprobe)
            corr.fit(g, qb, gb, statistics=stats)
            bias_error = measure(corr, g, qb, gb)
        dim = corr.dim_
        qb = None if query_bank is None or not keep_banks else as_embeddings(query_bank, "query_bank", normalize=corr.normalize, dim=dim)
        gb = None if gallery_bank is None or not keep_banks else as_embeddings(gallery_bank, "gallery_bank", normalize=corr.normalize, dim=dim)
        index = cls(corr, factory, query_bank=qb, gallery_bank=gb, **kwargs)
        index.bias_error = bias_error
        return index

    # ------------------------------------------------------------------ search
    @property
    def ntotal(self) -> int:
        return self.correction.n_gallery_

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

        ``weight`` overrides the correction's weight per call (``alpha=`` for NNN, ``lam=`` for
        DN; scalar or one per query). ``nprobe``/``ef_search``/``rescore`` override the index
        defaults for this call.
        """
        corr = self.correction
        q = corr._queries(queries)
        top_k = check_top_k(top_k, self.ntotal)
        override = corr._weight_override(weight, q.shape[0])
        set_search_params(self._faiss, nprobe=nprobe or self.nprobe, ef_search=ef_search or self.ef_search)
        top1 = None
        if getattr(corr, "k_activation", None) is not None:  # gated (DIS, DualDIS): raw top-1 first
            top1 = self._faiss_search(q, np.zeros((q.shape[0], corr.bias_columns_.shape[1]), np.float32), 1)[1][:, 0]
        weights = np.ascontiguousarray(corr._query_weights(q, override, top1), dtype=np.float32)
        do_rescore = self.rescore if rescore is None else bool(rescore)
        depth = min(self.ntotal, top_k * self.rescore_factor) if do_rescore else top_k
        ranking, ids = self._faiss_search(q, -weights, depth)
        if do_rescore:
            ranking, ids = self._rescore(q, weights, ids, top_k)
        return corr.to_method_scores(ranking, q, weights), ids

    def _faiss_search(self, q: np.ndarray, extra: np.ndarray, k: int):
        xq = np.zeros((q.shape[0], self._dim), dtype=np.float32)
        xq[:, : q.shape[1]] = q
        xq[:, q.shape[1] : q.shape[1] + extra.shape[1]] = extra
        scores, ids = self._faiss.search(xq, k)
        return scores, ids.astype(np.int64)

    def _rescore(self, q: np.ndarray, weights: np.ndarray, ids: np.ndarray, top_k: int):
        """Exact ranking scores of the candidates, sorted (ties to the lower id); -1 ids (lists
        that ran dry) sort last."""
        corr = self.correction
        safe = np.where(ids < 0, 0, ids)
        exact = np.einsum("qd,qkd->qk", q, corr.gallery_[safe]) - np.einsum("qc,qkc->qk", weights, corr.bias_columns_[safe])
        exact = np.where(ids < 0, -np.inf, exact).astype(np.float32)
        order = np.lexsort((np.where(ids < 0, np.iinfo(np.int64).max, ids), -exact), axis=1)[:, :top_k]
        return np.take_along_axis(exact, order, axis=1), np.take_along_axis(ids, order, axis=1)

    def calibrate(self, queries=None, *, target_recall: float = 0.95, top_k: int = 10, sample: int = 1000) -> dict:
        """Set ``nprobe`` / ``ef_search`` to the smallest power of two reaching ``target_recall``
        of the exact corrected top-k on a sample of ``queries`` (default: the stored query
        bank); see :mod:`hubless.index.calibrate`. Returns the choice and the recall curve."""
        from hubless.index.calibrate import calibrate

        return calibrate(self, queries, target_recall=target_recall, top_k=top_k, sample=sample)

    # ------------------------------------------------------------------ updates
    def add(self, embeddings, metadata=None, *, progress: bool | None = None) -> Index:
        """Add gallery items: their biases come from the stored banks (n_new x n_bank
        similarities; the other items' biases do not change) and they are inserted into the
        FAISS structure, whose training is kept (new items join the existing IVF lists)."""
        corr = self.correction
        new = as_embeddings(embeddings, "embeddings", normalize=corr.normalize, dim=corr.dim_)
        if corr.needs_query_bank and self.query_bank is None:
            raise ValueError("this index was saved without its banks (keep_banks=False): it cannot compute new biases")
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
        if self._mmap:  # memory-mapped inverted lists are read-only: build in memory instead
            self._faiss, self._dim = build_faiss(self.factory, updated.gallery_, augmented)
            self._mmap = False
        elif append_from is not None:
            append_rows(self._faiss, updated.gallery_, augmented, append_from)
        else:
            replace_rows(self._faiss, updated.gallery_, augmented, same_items=same_items)
        self.correction = updated

    # ------------------------------------------------------------------ description / persistence
    def info(self) -> dict[str, Any]:
        corr = self.correction
        return {
            "method": corr.spec,
            "factory": self.factory,
            "n_items": self.ntotal,
            "dim": corr.dim_,
            "bias_columns": int(corr.bias_columns_.shape[1]),
            "model": self.model,
            "normalize": bool(corr.normalize),
            "n_query_bank": None if self.query_bank is None else int(self.query_bank.shape[0]),
            "n_gallery_bank": None if self.gallery_bank is None else int(self.gallery_bank.shape[0]),
            "metadata_columns": sorted({k for r in self.metadata for k in r}) if self.metadata else [],
            "nprobe": self.nprobe,
            "ef_search": self.ef_search,
            "rescore": self.rescore,
            "rescore_factor": self.rescore_factor,
            "bias_error": getattr(self, "bias_error", None),
        }

    def save(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the index to the directory ``path`` atomically (see :mod:`hubless.index.store`)."""
        from hubless.index.store import save_index

        return save_index(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False) -> Index:
        """Read an index saved by :meth:`save`, verifying format version and checksums."""
        from hubless.index.store import load_index

        return load_index(path, mmap=mmap)

    def __repr__(self) -> str:
        return f"Index({self.correction.spec!r}, factory={self.factory!r}, n_items={self.ntotal})"


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
            raise ValueError(f"metadata columns must have one value per item ({n}); got lengths {sorted(lengths)}")
        return [{k: v[i] for k, v in columns.items()} for i in range(n)]
    records = list(metadata)
    if len(records) != n or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"metadata must be {n} dicts (one per item) or a dict of columns")
    return records
