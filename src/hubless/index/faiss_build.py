"""FAISS structures over the augmented gallery [r, bias(r)] without letting the bias distort them.

The corrected score is an inner product of augmented vectors, [q, -w] . [r, bias(r)], so any
inner-product index can serve it. But an ANN structure built on the augmented vectors would
cluster (IVF) or link (HNSW) items partly by their bias, which is not how queries see them. So
the geometry is built on the unit part only and the bias is carried exactly:

* IVF: the coarse centroids are k-means centroids of the unit vectors r, padded with zeros in
  the extra dimensions. An item's list is then chosen by r . c alone, and a query's probed lists
  by q . c alone, whatever w is; within a list the full augmented product is used (exactly for
  ``Flat`` lists; for ``PQ`` the residual codebooks are trained on the augmented vectors, and
  the exact re-scoring of :class:`~hubless.index.Index` removes the code error from the final
  ranking).
* HNSW: the graph is built from [r, 0] (pure cosine neighbourhoods), then its storage is
  replaced by [r, bias(r)] in the same order, so the search walks the cosine graph while
  scoring with the corrected product.
* Flat: exact, nothing to protect.

Dimensions are zero-padded when a quantiser needs a multiple (PQ64 on 512 + 1 dims); zeros do
not change inner products. Updates keep the training: :func:`append_rows` inserts new items
(HNSW links them over [r, 0] too) and :func:`replace_rows` refills a trained index.
"""

from __future__ import annotations

import re

import faiss
import numpy as np

from hubless.errors import InvalidInput
from hubless.index.factory import POINTS_PER_CENTROID, check_factory

__all__ = [
    "add_rows",
    "append_rows",
    "build_faiss",
    "train_empty",
    "training_sample",
    "default_factory",
    "padded_dim",
    "replace_rows",
    "search_knob",
    "search_parameters",
]


def default_factory(n_gallery: int) -> str:
    """Exact below 50k items; IVF with ~4 sqrt(n) lists up to 2M; HNSW beyond."""
    if n_gallery < 50_000:
        return "Flat"
    if n_gallery <= 2_000_000:
        nlist = int(2 ** round(np.log2(4 * np.sqrt(n_gallery))))
        return f"IVF{nlist},Flat"
    return "HNSW32"


def padded_dim(factory: str, dim: int) -> int:
    """Smallest dimension >= ``dim`` that every quantiser of ``factory`` accepts."""
    multiples = [int(m) for m in re.findall(r"PQ(\d+)", factory)]
    step = int(np.lcm.reduce(multiples)) if multiples else 1
    return -(-dim // step) * step


def _pad(x: np.ndarray, dim: int) -> np.ndarray:
    if x.shape[1] == dim:
        return np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros((x.shape[0], dim), dtype=np.float32)
    out[:, : x.shape[1]] = x
    return out


def build_faiss(factory: str, unit: np.ndarray, augmented: np.ndarray, *, train_size: int = 100_000, seed: int = 0):
    """Build ``factory`` (inner product) over ``augmented`` rows, with geometry from ``unit``.

    Returns ``(index, dim)`` where ``dim`` is the (possibly padded) dimension queries must have.
    """
    sample = training_sample(unit.shape[0], train_size, seed)
    index, dim = train_empty(factory, unit.shape[0], unit[sample], augmented[sample], seed=seed)
    _fill(index, _pad(unit, dim), _pad(augmented, dim))
    return index, dim


def training_sample(n: int, train_size: int = 100_000, seed: int = 0):
    """The rows an index is trained on: all of them, or ``train_size`` drawn with ``seed``."""
    if n <= train_size:
        return slice(None)
    return np.sort(np.random.default_rng(seed).choice(n, size=train_size, replace=False))


def train_empty(factory: str, n_gallery: int, unit_sample: np.ndarray, augmented_sample: np.ndarray, *, seed: int = 0):
    """An empty ``factory`` index trained on a sample (IVF centroids from the unit rows, codebooks
    from the augmented rows), ready for items to be added: ``(index, dim)``. The distributed
    build trains it once and adds gallery shards to copies of it."""
    factory = check_factory(factory, n_gallery, augmented_sample.shape[1])
    dim = padded_dim(factory, augmented_sample.shape[1])
    try:
        index = faiss.index_factory(dim, factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise InvalidInput(f"FAISS cannot build {factory!r} for dimension {dim}: {str(exc).splitlines()[-1]}") from None
    ivf = _ivf(index)
    if ivf is not None and not ivf.is_trained:
        if n_gallery < ivf.nlist:
            raise InvalidInput(
                f"{factory}: {ivf.nlist} lists need at least as many gallery items (have {n_gallery}); use fewer lists or Flat"
            )
        _warn_few_training_items(factory, unit_sample.shape[0], ivf.nlist)
        # min_points_per_centroid=1: FAISS would print its own "WARNING clustering ..." line to
        # stderr (past any Python handler); the warning above says it once, in hubless's words.
        km = faiss.Kmeans(unit_sample.shape[1], ivf.nlist, niter=20, spherical=True, seed=seed, verbose=False, min_points_per_centroid=1)
        km.train(np.ascontiguousarray(unit_sample, dtype=np.float32))
        ivf.quantizer.add(_pad(km.centroids, dim))
    if not index.is_trained:
        index.train(_pad(augmented_sample, dim))
    return index, dim


def _warn_few_training_items(factory: str, n_train: int, nlist: int) -> None:
    """Warn (a Python warning, shown once by the CLI) when k-means gets fewer than FAISS's
    recommended 39 training items per inverted list: the lists may come out uneven."""
    if n_train < POINTS_PER_CENTROID * nlist:
        import warnings

        warnings.warn(
            f"{factory}: {n_train} training items for {nlist} lists (FAISS recommends at least {POINTS_PER_CENTROID} per list, "
            f"{POINTS_PER_CENTROID * nlist}); the lists may be uneven: use fewer lists (e.g. IVF{max(1, n_train // POINTS_PER_CENTROID)},Flat) or Flat",
            stacklevel=3,
        )


def add_rows(index, unit: np.ndarray, augmented: np.ndarray) -> None:
    """Add rows to an empty trained index (padded to its dimension; HNSW links them by ``unit``)."""
    _fill(index, _pad(unit, index.d), _pad(augmented, index.d))


def _fill(index, geometry: np.ndarray, aug: np.ndarray) -> None:
    """Add padded rows to an empty trained index; HNSW links them by ``geometry``."""
    hnsw = _hnsw(index)
    if hnsw is None:
        index.add(aug)
        return
    index.add(geometry)
    _set_storage(hnsw, aug)


def _set_storage(hnsw, rows: np.ndarray) -> None:
    storage = faiss.downcast_index(hnsw.storage)
    storage.reset()
    storage.add(rows)


def append_rows(index, unit: np.ndarray, augmented: np.ndarray, start: int) -> None:
    """Add rows ``start:`` of ``unit``/``augmented`` (all rows, old and new) to a built index
    that holds rows ``:start``. Training is kept: new items join the existing IVF lists."""
    dim = index.d
    hnsw = _hnsw(index)
    if hnsw is None:
        index.add(_pad(augmented[start:], dim))
        return
    _set_storage(hnsw, _pad(unit[:start], dim))  # the graph grows over [r, 0], as when built
    index.add(_pad(unit[start:], dim))
    _set_storage(hnsw, _pad(augmented, dim))


def replace_rows(index, unit: np.ndarray, augmented: np.ndarray, *, same_items: bool = False) -> None:
    """Make a built index hold exactly these rows, keeping its training (IVF centroids, PQ
    codebooks). ``same_items``: only the biases changed, so an HNSW graph is kept as it is."""
    dim = index.d
    hnsw = _hnsw(index)
    if hnsw is not None and same_items:
        _set_storage(hnsw, _pad(augmented, dim))
        return
    index.reset()
    _fill(index, _pad(unit, dim), _pad(augmented, dim))


def _ivf(index):
    try:
        return faiss.extract_index_ivf(index)
    except RuntimeError:
        return None


def _hnsw(index):
    inner = faiss.downcast_index(index)
    return inner if isinstance(inner, faiss.IndexHNSW) else None


def search_knob(index) -> tuple[str, int] | None:
    """The breadth parameter of an index's search and its largest useful value:
    ("nprobe", n_lists) for IVF, ("ef_search", 4096) for HNSW, None for exact indexes."""
    ivf = _ivf(index)
    if ivf is not None:
        return "nprobe", int(ivf.nlist)
    return ("ef_search", 4096) if _hnsw(index) is not None else None


def search_parameters(index, *, nprobe: int, ef_search: int):
    """FAISS search parameters for one call: ``nprobe`` lists for IVF (capped at the number of
    lists; an HNSW coarse quantiser gets ``ef_search``), ``ef_search`` for HNSW, through a
    pre-transform when there is one. None for indexes without a breadth (Flat). Passing these
    per call, instead of setting the shared index's fields, keeps concurrent searches with
    different settings from interfering."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexPreTransform):
        sub = search_parameters(inner.index, nprobe=nprobe, ef_search=ef_search)
        if sub is None:
            return None
        params = faiss.SearchParametersPreTransform()
        params.index_params = sub
        params.referenced_objects = [sub]  # the SWIG proxy must outlive the search
        return params
    ivf = _ivf(inner)
    if ivf is not None:
        params = faiss.SearchParametersIVF()
        params.nprobe = int(min(nprobe, ivf.nlist))
        quantizer = _hnsw(ivf.quantizer)
        if quantizer is not None:
            sub = faiss.SearchParametersHNSW()
            sub.efSearch = int(ef_search)
            params.quantizer_params = sub
            params.referenced_objects = [sub]
        return params
    if _hnsw(inner) is not None:
        params = faiss.SearchParametersHNSW()
        params.efSearch = int(ef_search)
        return params
    return None
