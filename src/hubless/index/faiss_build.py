"""FAISS structures over the augmented gallery [r, bias(r)] that lose no recall to the bias.

The corrected score is an inner product of augmented vectors, [q, -w] . [r, bias(r)], so any
inner-product index serves it, exactly, for every additive correction. What an ANN structure
must not do is let the bias distort its geometry, or hide the items the correction promotes
(the causes, the options tried and their measurements: docs/corrected-ann.md):

* IVF: the coarse centroids are k-means centroids of the unit vectors r, and every item joins
  its list by r . c alone. Each centroid also carries, in the bias coordinates,
  :data:`PROBE_BIAS_SHARE` of its training members' mean bias, so a query [q, -w] probes lists
  by q . c - w * bias_L / 2 (lists of promoted, low-bias items move up, lists of hubs down; at
  w = 0 exactly the plain IVF probe). Since the corrected top k reaches further from the query
  than the plain one (on MiniLM COCO its 90th-percentile item is the 32nd raw neighbour), the
  ``spill`` share of items with the lowest bias (:data:`DEFAULT_SPILL`), the ones a correction
  promotes, is also stored in its second-nearest list; a search fetches twice the depth and
  keeps each item once. Within a list the full augmented product is used: exact for ``Flat``
  lists; ``PQ`` gives the bias columns codes of their own (``PQ<m>`` is built as ``PQ<m+1>``,
  see :func:`plan_layout`) and the exact re-scoring of :class:`~hubless.index.Index` removes
  the code error from the final ranking.
* HNSW: the graph is built from [r, 0] (pure cosine neighbourhoods), then its storage is
  replaced by [r, bias(r)] in the same order, so the search walks the cosine graph while
  scoring with the exact corrected product.
* Flat: exact, nothing to protect.

Rows are laid out as a :class:`Layout` says: the unit part, zero padding, the bias columns at
``bias_offset``, zero padding to ``dim``; zeros do not change inner products. Updates keep the
training: :func:`append_rows` inserts new items (HNSW links them over [r, 0] too; IVF spills
them by the same threshold) and :func:`replace_rows` refills a trained index.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import faiss
import numpy as np

from hubless.errors import InvalidInput
from hubless.index.factory import POINTS_PER_CENTROID, check_factory

__all__ = [
    "DEFAULT_SPILL",
    "PROBE_BIAS_SHARE",
    "Layout",
    "add_rows",
    "refill_faiss",
    "packed_bits",
    "with_selection",
    "append_rows",
    "build_faiss",
    "default_factory",
    "is_ivf",
    "padded_dim",
    "plan_layout",
    "replace_rows",
    "search_knob",
    "search_parameters",
    "search_rows",
    "spill_threshold",
    "stored_rows",
    "train_empty",
    "training_sample",
    "with_spill",
]

#: Share of the items, those with the lowest bias (the ones a correction promotes), that an IVF
#: index also stores in their second-nearest list (measured in docs/corrected-ann.md).
DEFAULT_SPILL = 0.3
#: Share of a list's mean training bias its centroid carries in the bias coordinates: lists are
#: probed by q . c - PROBE_BIAS_SHARE * w * mean bias (measured: 0.5 finds what 0 finds with
#: ~6% fewer items scanned; 1.0 loses recall).
PROBE_BIAS_SHARE = 0.5


@dataclass(frozen=True)
class Layout:
    """Where things are in the rows of a FAISS index: its (padded) dimension ``dim``, the column
    the bias columns start at, the spill share asked for and the summed bias at or below which
    an IVF item is also stored in its second list (None: no item is)."""

    dim: int
    bias_offset: int
    spill: float = 0.0
    spill_below: float | None = None


def default_factory(n_gallery: int) -> str:
    """Exact below 50k items; IVF with ~4 sqrt(n) lists up to 2M; HNSW beyond."""
    if n_gallery < 50_000:
        return "Flat"
    if n_gallery <= 2_000_000:
        nlist = int(2 ** round(np.log2(4 * np.sqrt(n_gallery))))
        return f"IVF{nlist},Flat"
    return "HNSW32"


def plan_layout(factory: str, unit_dim: int, n_bias: int) -> tuple[str, int, int]:
    """``(faiss_factory, dim, bias_offset)`` for ``factory`` over ``unit_dim`` + ``n_bias``
    columns. A product quantiser gives the bias columns sub-vectors of their own: the unit part
    is padded to m sub-vectors and ``PQ<m>`` is built as ``PQ<m + extra>``, so no code mixes the
    bias with unit dimensions (its code error drops ~30x, measured); other forms keep [r, bias]."""
    match = re.search(r"PQ(\d+)", factory)
    if match is None:
        return factory, unit_dim + n_bias, unit_dim
    m = int(match.group(1))
    sub = -(-unit_dim // m)
    extra = -(-n_bias // sub)
    faiss_factory = factory[: match.start()] + f"PQ{m + extra}" + factory[match.end() :]
    return faiss_factory, sub * (m + extra), sub * m


def padded_dim(factory: str, dim: int) -> int:
    """The dimension of indexes built before :func:`plan_layout` (the augmented rows padded to
    a multiple of every PQ's m, bias right after the unit part); kept to read such indexes."""
    multiples = [int(m) for m in re.findall(r"PQ(\d+)", factory)]
    step = int(np.lcm.reduce(multiples)) if multiples else 1
    return -(-dim // step) * step


def spill_threshold(bias_columns: np.ndarray, spill: float) -> float | None:
    """The summed bias at or below which an item is spilled: the ``spill`` quantile, or None when
    nothing is to be spilled (``spill`` = 0, or every item has the same bias: none is promoted)."""
    if isinstance(spill, bool) or not isinstance(spill, (int, float)) or not 0.0 <= float(spill) < 1.0:
        raise InvalidInput(f"spill must be in [0, 1): the share of items also stored in a second IVF list; got {spill!r}")
    score = _promotion(bias_columns)
    if spill == 0 or score.size == 0 or float(score.max() - score.min()) == 0.0:
        return None
    return float(np.quantile(score, float(spill)))


def _promotion(bias_columns: np.ndarray) -> np.ndarray:
    """The summed bias columns: the lower, the more a correction promotes the item."""
    bias = np.asarray(bias_columns, dtype=np.float32)
    return bias.reshape(bias.shape[0], -1).sum(axis=1)


def stored_rows(bias_columns: np.ndarray, spill_below: float | None) -> int:
    """How many rows a FAISS index over these items holds: one per item plus the spilled copies."""
    n = len(bias_columns)
    return n if spill_below is None else n + int(np.count_nonzero(_promotion(bias_columns) <= spill_below))


def _rows(unit: np.ndarray, augmented: np.ndarray | None, layout: Layout) -> np.ndarray:
    """Rows laid out for an index: [r, 0, bias, 0] from ``augmented`` = [r, bias] (None: [r, 0])."""
    u = unit.shape[1]
    if augmented is not None and layout.bias_offset == u and augmented.shape[1] == layout.dim:
        return np.ascontiguousarray(augmented, dtype=np.float32)
    out = np.zeros((unit.shape[0], layout.dim), dtype=np.float32)
    out[:, :u] = unit
    if augmented is not None:
        bias = augmented[:, u:]
        out[:, layout.bias_offset : layout.bias_offset + bias.shape[1]] = bias
    return out


def query_rows(q: np.ndarray, extra: np.ndarray, layout: Layout) -> np.ndarray:
    """Queries [q, 0, extra, 0] (extra = -W(q)) laid out like the index's rows."""
    return _rows(q, np.hstack([q, extra]), layout)


def build_faiss(
    factory: str, unit: np.ndarray, augmented: np.ndarray, *, spill: float | None = None, train_size: int = 100_000, seed: int = 0
):
    """Build ``factory`` (inner product) over ``augmented`` rows [r, bias], with geometry from ``unit``.

    ``spill``: share of the items (lowest bias) an IVF index also stores in their second list
    (default :data:`DEFAULT_SPILL`; ignored by other indexes). Returns ``(index, layout)``.
    """
    sample = training_sample(unit.shape[0], train_size, seed)
    index, layout = train_empty(factory, unit.shape[0], unit[sample], augmented[sample], seed=seed)
    layout = with_spill(index, layout, augmented[:, unit.shape[1] :], spill)
    _fill(index, unit, augmented, layout)
    return index, layout


def with_spill(index, layout: Layout, bias_columns: np.ndarray, spill: float | None) -> Layout:
    """``layout`` with a spill share (default :data:`DEFAULT_SPILL`; always 0 for indexes that
    are not IVF) and its threshold for these biases."""
    if not is_ivf(index):
        return replace(layout, spill=0.0, spill_below=None)
    spill = DEFAULT_SPILL if spill is None else spill
    return replace(layout, spill=float(spill), spill_below=spill_threshold(bias_columns, spill))


def training_sample(n: int, train_size: int = 100_000, seed: int = 0):
    """The rows an index is trained on: all of them, or ``train_size`` drawn with ``seed``."""
    if n <= train_size:
        return slice(None)
    return np.sort(np.random.default_rng(seed).choice(n, size=train_size, replace=False))


def train_empty(factory: str, n_gallery: int, unit_sample: np.ndarray, augmented_sample: np.ndarray, *, seed: int = 0):
    """An empty ``factory`` index trained on a sample, ready for items to be added:
    ``(index, layout)`` (no spill yet: see :func:`with_spill`). IVF centroids are k-means
    centroids of the unit rows, each carrying :data:`PROBE_BIAS_SHARE` of its members' mean
    bias; codebooks are trained on the augmented rows (residuals to the list each joins by
    r . c). The distributed build trains it once and adds gallery shards to copies of it."""
    factory = check_factory(factory, n_gallery, augmented_sample.shape[1])
    u = unit_sample.shape[1]
    faiss_factory, dim, offset = plan_layout(factory, u, augmented_sample.shape[1] - u)
    layout = Layout(dim, offset)
    try:
        index = faiss.index_factory(dim, faiss_factory, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as exc:
        raise InvalidInput(f"FAISS cannot build {factory!r} for dimension {dim}: {str(exc).splitlines()[-1]}") from None
    ivf = _ivf(index)
    if ivf is not None and ivf.quantizer.ntotal == 0:
        if n_gallery < ivf.nlist:
            raise InvalidInput(
                f"{factory}: {ivf.nlist} lists need at least as many gallery items (have {n_gallery}); use fewer lists or Flat"
            )
        _warn_few_training_items(factory, unit_sample.shape[0], ivf.nlist)
        # min_points_per_centroid=1: FAISS would print its own "WARNING clustering ..." line to
        # stderr (past any Python handler); the warning above says it once, in hubless's words.
        km = faiss.Kmeans(u, ivf.nlist, niter=20, spherical=True, seed=seed, verbose=False, min_points_per_centroid=1)
        km.train(np.ascontiguousarray(unit_sample, dtype=np.float32))
        rows = _rows(unit_sample, augmented_sample, layout)
        assert km.centroids is not None  # trained just above
        assign = _nearest_lists(km.centroids, unit_sample, 1)[:, 0]
        centroids = _rows(km.centroids, None, layout)
        bias = rows[:, offset:].astype(np.float64)
        sizes = np.bincount(assign, minlength=ivf.nlist)[:, None]
        sums = np.zeros((ivf.nlist, bias.shape[1]))
        np.add.at(sums, assign, bias)
        means = np.where(sizes > 0, sums / np.maximum(sizes, 1), bias.mean(axis=0))
        centroids[:, offset:] = PROBE_BIAS_SHARE * means
        ivf.quantizer.add(centroids)
        if not ivf.is_trained:  # codebooks from residuals to the list each row joins by r . c
            x = np.ascontiguousarray(rows - centroids[assign] if ivf.by_residual else rows, dtype=np.float32)
            ivf.train_encoder(x.shape[0], faiss.swig_ptr(x), faiss.swig_ptr(np.ascontiguousarray(assign, dtype=np.int64)))
        ivf.is_trained = True
    if not index.is_trained:
        index.train(_rows(unit_sample, augmented_sample, layout))
    return index, layout


def _nearest_lists(centroids: np.ndarray, unit: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` lists whose centroids' unit parts are nearest each row by r . c, best first."""
    from hubless.engine import exact_search

    c = np.ascontiguousarray(centroids[:, : unit.shape[1]], dtype=np.float32)
    return exact_search(np.ascontiguousarray(unit, dtype=np.float32), c, k)[1]


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


def add_rows(index, unit: np.ndarray, augmented: np.ndarray, layout: Layout | None = None, *, start: int = 0) -> None:
    """Add items ``start, start + 1, ...`` to a trained index, laid out as ``layout`` (default:
    [r, bias] padded, no spill): HNSW links them by ``unit``, IVF lists are chosen by r . c."""
    _fill(index, unit, augmented, layout or Layout(index.d, unit.shape[1]), start=start)


def _fill(index, unit: np.ndarray, augmented: np.ndarray, layout: Layout, *, start: int = 0) -> None:
    """Add items: HNSW links them over [r, 0]; IVF puts each in its nearest list by r . c (whatever
    the centroids' bias coordinates say) and the spilled ones in their second list as well, with
    gallery positions as ids; other indexes append them in order."""
    rows = _rows(unit, augmented, layout)
    ivf = _ivf(index)
    if ivf is not None:
        spill = layout.spill_below is not None and ivf.nlist > 1
        lists = _nearest_lists(ivf.quantizer.reconstruct_n(0, ivf.nlist), unit, 2 if spill else 1)
        ids = np.arange(start, start + rows.shape[0], dtype=np.int64)
        _add_preassigned(ivf, rows, lists[:, 0], ids)
        if spill:
            chosen = np.flatnonzero(_promotion(rows[:, layout.bias_offset :]) <= layout.spill_below)
            if chosen.size:
                _add_preassigned(ivf, rows[chosen], lists[chosen, 1], ids[chosen])
        return
    hnsw = _hnsw(index)
    if hnsw is None:
        index.add(rows)
        return
    index.add(_rows(unit, None, layout))
    _set_storage(hnsw, rows)


def _add_preassigned(ivf, rows: np.ndarray, lists: np.ndarray, ids: np.ndarray) -> None:
    """``ivf.add_core`` with the lists chosen here. (faiss.contrib's add_preassigned drops its
    reference to the ids array before the call: a temporary array is freed under FAISS.)"""
    x = np.ascontiguousarray(rows, dtype=np.float32)
    a = np.ascontiguousarray(lists, dtype=np.int64)
    i = np.ascontiguousarray(ids, dtype=np.int64)
    ivf.add_core(x.shape[0], faiss.swig_ptr(x), faiss.swig_ptr(i), faiss.swig_ptr(a))


def _set_storage(hnsw, rows: np.ndarray) -> None:
    storage = faiss.downcast_index(hnsw.storage)
    storage.reset()
    storage.add(rows)


def append_rows(index, unit: np.ndarray, augmented: np.ndarray, start: int, layout: Layout | None = None) -> None:
    """Add rows ``start:`` of ``unit``/``augmented`` (all rows, old and new) to a built index
    that holds rows ``:start``. Training is kept: new items join the existing IVF lists (and
    are spilled by the layout's threshold)."""
    layout = layout or Layout(index.d, unit.shape[1])
    hnsw = _hnsw(index)
    if hnsw is None:
        _fill(index, unit[start:], augmented[start:], layout, start=start)
        return
    _set_storage(hnsw, _rows(unit[:start], None, layout))  # the graph grows over [r, 0], as when built
    index.add(_rows(unit[start:], None, layout))
    _set_storage(hnsw, _rows(unit, augmented, layout))


def replace_rows(index, unit: np.ndarray, augmented: np.ndarray, layout: Layout | None = None, *, same_items: bool = False) -> Layout:
    """Make a built index hold exactly these rows, keeping its training (IVF centroids, PQ
    codebooks). ``same_items``: only the biases changed, so an HNSW graph is kept as it is.
    Returns the layout with the spill threshold of the new biases."""
    layout = layout or Layout(index.d, unit.shape[1])
    if layout.spill and is_ivf(index):
        layout = replace(layout, spill_below=spill_threshold(augmented[:, unit.shape[1] :], layout.spill))
    hnsw = _hnsw(index)
    if hnsw is not None and same_items:
        _set_storage(hnsw, _rows(unit, augmented, layout))
        return layout
    index.reset()
    _fill(index, unit, augmented, layout)
    return layout


def search_rows(index, q: np.ndarray, extra: np.ndarray, k: int, params, layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """The FAISS top ``k`` of the queries [q, extra] (extra = -W(q), one column per bias column):
    ``(scores, ids)``, int64 ids, -1 in unfilled slots. An index with spilled items is searched
    twice as deep and each item kept once (its first, best-scored copy). A small batch is
    searched on the calling thread alone (:func:`hubless.engine.parallel.small_batch_threads`)."""
    from hubless.engine.parallel import small_batch_threads

    xq = query_rows(q, extra, layout)
    with small_batch_threads(xq.shape[0]):
        if layout.spill_below is None:
            scores, ids = index.search(xq, k, params=params)
            return scores, ids.astype(np.int64)
        scores, ids = index.search(xq, min(2 * k, index.ntotal), params=params)
    return _first_copies(scores, ids.astype(np.int64), k)


def _first_copies(scores: np.ndarray, ids: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of results, best first, in which ids may repeat: each id's first slot, the top ``k``."""
    order = np.argsort(ids, axis=1, kind="stable")  # the copies of an id side by side, best first
    sorted_ids = np.take_along_axis(ids, order, axis=1)
    repeat = np.zeros(ids.shape, dtype=bool)
    repeat[:, 1:] = (sorted_ids[:, 1:] == sorted_ids[:, :-1]) & (sorted_ids[:, 1:] != -1)
    dropped = np.empty_like(repeat)
    np.put_along_axis(dropped, order, repeat, axis=1)
    keep = np.argsort(dropped, axis=1, kind="stable")[:, :k]  # the kept slots first, in their order
    scores, ids = np.take_along_axis(scores, keep, axis=1), np.take_along_axis(ids, keep, axis=1)
    gone = np.take_along_axis(dropped, keep, axis=1)
    scores[gone], ids[gone] = -np.inf, -1
    if ids.shape[1] < k:
        pad = k - ids.shape[1]
        scores = np.hstack([scores, np.full((len(ids), pad), -np.inf, np.float32)])
        ids = np.hstack([ids, np.full((len(ids), pad), -1, np.int64)])
    return scores, ids


def self_contained(index) -> bool:
    """Whether ``index`` holds all its data (``write_index`` writes it whole): not an inverted
    file whose lists live in another file (``OnDiskInvertedLists``, e.g. read with FAISS's
    ``IO_FLAG_MMAP``, which ``write_index`` saves as a reference to that file)."""
    ivf = _ivf(index)
    return ivf is None or isinstance(faiss.downcast_InvertedLists(ivf.invlists), faiss.ArrayInvertedLists)


def is_ivf(index) -> bool:
    """Whether ``index`` is (or wraps) an inverted file."""
    return _ivf(index) is not None


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


# ---------------------------------------------------------------------------------- live indexes
def refill_faiss(index, factory: str, unit: np.ndarray, augmented: np.ndarray, layout: Layout, *, same_items: bool = False):
    """A new index holding exactly these rows with the training of ``index`` (IVF centroids,
    PQ codebooks), which is left unchanged (searches may still be reading it): a compaction.
    An HNSW graph is rebuilt unless ``same_items`` (only the biases changed). Returns
    ``(index, layout)`` (the spill threshold of the new biases)."""
    if _hnsw(index) is not None and not same_items:
        return build_faiss(factory, unit, augmented, spill=layout.spill)
    if not owns_data(index):  # a view of a mapped file (a clone would be one too): an owned copy
        fresh = faiss.deserialize_index(faiss.serialize_index(index))
    else:
        try:
            fresh = faiss.clone_index(index)
        except RuntimeError:  # e.g. inverted lists in another file: build anew
            return build_faiss(factory, unit, augmented, spill=layout.spill)
    return fresh, replace_rows(fresh, unit, augmented, layout, same_items=same_items)


def owns_data(index) -> bool:
    """Whether ``index``'s codes, lists and graph are its own memory, not views of a file mapped
    by FAISS (``IO_FLAG_MMAP_IFC``): a view (and a clone of it, which shares the view) cannot be
    changed (FAISS aborts the process), so a compaction refills an owned copy."""
    inner = faiss.downcast_index(index)
    if isinstance(inner, faiss.IndexPreTransform):
        return owns_data(inner.index)
    vectors = []
    ivf = _ivf(inner)
    if ivf is not None:
        lists = faiss.downcast_InvertedLists(ivf.invlists)
        if isinstance(lists, faiss.ArrayInvertedLists):  # an empty list is never a view: the first one that is not
            first = next((i for i in range(lists.nlist) if lists.list_size(i)), None)
            vectors = [] if first is None else [lists.codes.at(first)]
    elif isinstance(inner, faiss.IndexHNSW):
        vectors = [inner.hnsw.neighbors, getattr(faiss.downcast_index(inner.storage), "codes", None)]
    else:
        vectors = [getattr(inner, "codes", None)]
    return all(getattr(v, "is_owned", True) for v in vectors if v is not None)


def with_selection(index, params, allowed: np.ndarray, *, bits: np.ndarray | None = None):
    """``params`` (from :func:`search_parameters`, or None) restricted to the stored rows where
    ``allowed`` (bool, one per row) is True, through a FAISS ``IDSelectorBitmap``: returns the
    parameters and the objects to keep alive during the search, or None when this index cannot
    select (a plain PQ index: search those rows exactly instead). ``bits``: ``allowed`` packed
    already (:func:`packed_bits`), e.g. kept for a mask searched again."""
    if isinstance(faiss.downcast_index(index), faiss.IndexPQ):
        return None
    if bits is None:
        bits = packed_bits(allowed)
    selector = faiss.IDSelectorBitmap(int(allowed.size), faiss.swig_ptr(bits))
    if params is None:
        params = faiss.SearchParameters()
    params.sel = selector
    return params, (bits, selector)


def packed_bits(allowed: np.ndarray) -> np.ndarray:
    """``allowed`` (bool) as the bitmap of a FAISS ``IDSelectorBitmap`` (bit i of byte i // 8)."""
    return np.packbits(np.ascontiguousarray(allowed, dtype=bool), bitorder="little")
