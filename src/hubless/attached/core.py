"""Attach a correction to a collection the user already has, and search it with a certificate.

**Attach** (:func:`attach`): the collection's (ids, vectors) are read in bounded batches
(:mod:`hubless.attached.sources`) and each batch's bank statistics are computed against the
reference banks and turned into its bias columns at once (every bias of NNN, CSLS, IS, DN,
DualIS and DIS/DualDIS is row-local: it reads the item and the banks only, see
:meth:`~hubless.corrections.base.AdditiveCorrection.row_bias`), so one streamed pass fits the
correction with only the ids and biases kept (n x (8 + 4c) bytes). The gallery-wide statistics
(DIS/DualDIS activation sets: each bank item's k_a nearest items; the collection's mean) are
merged batch by batch (:func:`hubless.engine.merge.merge_topk_ids`). Nothing is written to the
collection: the result is a sidecar directory (:mod:`hubless.attached.sidecar`).

**Search** (:class:`AttachedCollection`): the store's own ANN gives each query its k' >= k best
*plain* candidates (s = q . r, the store's scores), which are re-scored exactly with the
sidecar's biases through the correction's rank hook, ``ranking = s - W(q) . bias(r)``. With
``b_min[c]`` the smallest bias column c over the whole collection and ``W(q) >= 0``, any item r
outside the candidates has ``s(q, r) <= s_k'`` (the k'-th plain score: the store's plain ranking
puts r after it), hence

    ranking(q, r) = s(q, r) - sum_c W_c(q) bias_c(r) <= s_k' - sum_c W_c(q) b_min[c] =: bound(q).

The *reserve* tightens this: the sidecar keeps the vectors of the items of smallest bias (1% of
the collection by default; the items a correction promotes most), which are scored exactly on
every search next to the store's candidates, so ``b_min`` above need only bound the items
*outside* the reserve: ``t[c]``, each column's smallest bias outside it (``t = b_min`` with no
reserve). So when the k-th best corrected candidate scores strictly above
``bound(q) = s_k' - sum_c W_c(q) t[c]`` (strictly: an outside item at the bound could tie and
win on a lower id), no outside item can enter the top-k, and the answer equals exact corrected search over the collection *relative to the
store's plain ranking* (exact when the store searches exactly; for an ANN index, exact over what
its plain top-k' is). A query whose candidates cover the whole collection is certified too.
Uncertified queries are asked again with k' doubled, up to ``max_candidates``; the answer says
which queries were certified and the k' each needed. A float slack of a few float32 ulps of the
bound is kept (the ranking is computed in float32).

**Update** (:func:`update`): the collection's id set is read (ids only, in batches) and compared
with the sidecar's; only added items' vectors are read and their biases computed; removed items'
rows are dropped. Methods with gallery-wide statistics (DIS/DualDIS activation sets; DN without
a gallery bank, whose shown scores use the collection's mean, after removals) re-read the whole
collection and say so. A collection is *changed* when its count, id range or sample hash (the
vectors of 32 evenly spaced ids) differ from the sidecar's fingerprint: search refuses it until
updated (a vector replaced in place at an unsampled id is not detected: update after such writes).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hubless._validation import as_embeddings, check_positive_int
from hubless.attached.sidecar import Sidecar, array_fingerprint, read_sidecar, write_sidecar
from hubless.attached.sources import BATCH, Source, open_source, sample_hash
from hubless.engine import BankStatistics, StatisticsRequest, compute_statistics
from hubless.engine.merge import merge_topk_ids, offset_ids
from hubless.engine.topk import NO_ID
from hubless.errors import Conflict, InvalidInput, InvalidType

__all__ = ["AttachedCollection", "AttachedResult", "attach", "update"]

#: How far a collection's vector norms may be from 1 when the correction expects unit vectors.
UNIT_TOLERANCE = 1e-3
#: Default first k' (candidates per query) as a multiple of top_k.
CANDIDATE_FACTOR = 8
#: Default largest k': this many times top_k (at least 1024), at most the collection.
MAX_FACTOR = 64
#: Candidate slots (queries x (k' + reserve)) re-scored at once by a search (bounds its temporaries).
ANSWER_ELEMENTS = 1 << 22
#: Queries ranked per scan by :meth:`AttachedCollection.exact_search` (bounds its memory).
EXACT_QUERY_BLOCK = 1024
#: Default reserve: 1% of the collection, at least / at most these many items.
DEFAULT_RESERVE = (64, 16384)


def _correction(method, normalize: bool | None):
    from hubless.corrections import make_additive

    corr = make_additive(method)
    if normalize is not None:
        corr.set_params(normalize=normalize)
    else:
        corr.set_params()  # validates
    if not corr.exactly_additive:
        raise InvalidInput(
            f"{corr.spec} is not a bias on the plain score for every query (published DualDIS with a closed gate): "
            "an attached collection cannot certify it; use dualdis:ungated=exp or another method"
        )
    return corr


def _banks(corr, query_bank, gallery_bank, dim: int):
    request = corr.statistics_request()
    qb = as_embeddings(query_bank, "query_bank", normalize=corr.normalize, dim=dim) if corr.needs_query_bank else None
    if corr.needs_query_bank and qb is None:
        raise InvalidInput(f"{corr.spec} needs a query bank")
    gb = None
    if corr.gallery_bank_use == "required" and gallery_bank is None:
        raise InvalidInput(f"{corr.spec} needs a gallery bank (reference items of the collection's modality): pass gallery_bank=")
    if gallery_bank is not None and corr.gallery_bank_use != "ignored":
        gb = as_embeddings(gallery_bank, "gallery_bank", normalize=corr.normalize, dim=dim)
    return request, qb, gb


def _rows(corr, source: Source, vectors: np.ndarray, first_row: int) -> np.ndarray:
    """A batch of the collection's vectors as the correction reads them: validated float32; with
    ``normalize`` they must already be unit length (the store ranks by their raw inner product)
    unless the store's own metric is cosine."""
    if corr.normalize and not getattr(source, "cosine", False):
        norms = np.linalg.norm(np.asarray(vectors, np.float64), axis=1)
        bad = np.flatnonzero(np.abs(norms - 1.0) > UNIT_TOLERANCE)
        if bad.size:
            raise InvalidInput(
                f"{source.uri}: item {first_row + int(bad[0])} has norm {norms[bad[0]]:.4g}: the store ranks by the raw inner product, "
                f"which is not the cosine {corr.spec} corrects; normalise the collection or attach with normalize=False"
            )
    return as_embeddings(vectors, "collection vectors", normalize=corr.normalize, dim=source.dim, first_row=first_row)


@dataclass
class _Fitted:
    ids: np.ndarray
    bias: np.ndarray
    gallery_sum: np.ndarray
    activation: dict  # side -> (scores, rows in stream order)
    reserve_ids: np.ndarray  # the reserve's ids and vectors (see _keep_reserve)
    reserve_vectors: np.ndarray


def _keep_reserve(kept: tuple[np.ndarray, np.ndarray, np.ndarray], ids, rows, bias, size: int, below) -> tuple:
    """The reserve after one more batch: the ``size`` items of smallest summed bias so far, or
    (``below`` given: an update) every new item with a bias column under its threshold."""
    if below is not None:
        take = np.flatnonzero((bias < np.asarray(below, np.float32)[None, :]).any(axis=1))
    else:
        take = np.arange(ids.size)
    keys = np.concatenate([kept[2], bias[take].sum(axis=1, dtype=np.float64)])
    all_ids = np.concatenate([kept[0], ids[take]])
    all_rows = np.concatenate([kept[1], rows[take]])
    if below is None and keys.size > size:
        pick = np.argpartition(keys, size - 1)[:size] if size else np.zeros(0, np.int64)
        return all_ids[pick], all_rows[pick], keys[pick]
    return all_ids, all_rows, keys


def _fit_stream(
    corr, source: Source, batches, request: StatisticsRequest, qb, gb, n_total: int, progress, *, reserve: int = 0, below=None
) -> _Fitted:
    """Biases of every (ids, vectors) batch, the merged gallery-wide statistics and the reserve."""
    from hubless.progress import progress_bar

    means = (
        np.zeros(source.dim) if qb is None else qb.mean(axis=0, dtype=np.float64),
        None if gb is None else gb.mean(axis=0, dtype=np.float64),
    )
    id_parts, bias_parts = [], []
    total = np.zeros(source.dim, np.float64)
    activation: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    seen = 0
    kept = (np.zeros(0, np.int64), np.zeros((0, source.dim), np.float32), np.zeros(0, np.float64))
    bar = progress_bar(None, progress, total=n_total, desc="attach", unit="item") if n_total else None
    for ids, vectors in batches:
        rows = _rows(corr, source, vectors, seen)
        part = compute_statistics(rows, qb, gb, request, bank_means=means)
        bias = corr.row_bias(rows, part)
        bias_parts.append(bias)
        id_parts.append(np.asarray(ids, np.int64))
        kept = _keep_reserve(kept, id_parts[-1], rows, bias, reserve, below)
        total += rows.sum(axis=0, dtype=np.float64)
        for side, k in (("query", request.query_activation_k), ("gallery", request.gallery_activation_k)):
            if not k:
                continue
            local = (getattr(part, f"{side}_activation_scores"), offset_ids(getattr(part, f"{side}_activation"), seen))
            acc = activation.get(side)
            if acc is None:
                n_bank = local[0].shape[0]
                acc = (np.zeros((n_bank, 0), np.float32), np.zeros((n_bank, 0), np.int64))
            activation[side] = merge_topk_ids(acc, local, k)
        seen += rows.shape[0]
        if bar is not None:
            bar.update(rows.shape[0])
    if bar is not None:
        bar.close()
    ids = np.concatenate(id_parts) if id_parts else np.zeros(0, np.int64)
    width = bias_parts[0].shape[1] if bias_parts else 1
    bias = np.concatenate(bias_parts) if bias_parts else np.zeros((0, width), np.float32)
    return _Fitted(ids, bias, total, activation, kept[0], kept[1])


def _global_statistics(request: StatisticsRequest, n: int, qb, gb, gallery_mean, activation: dict) -> BankStatistics:
    """The gallery-wide statistics with empty per-row arrays (what the query side reads)."""
    dim = gallery_mean.shape[0]
    stats = BankStatistics(
        n_gallery=n,
        n_query_bank=0 if qb is None else qb.shape[0],
        n_gallery_bank=None if gb is None else gb.shape[0],
        query_bank_mean=np.zeros(dim) if qb is None else qb.mean(axis=0, dtype=np.float64),
        gallery_mean=np.asarray(gallery_mean, np.float64),
        gallery_bank_mean=None if gb is None else gb.mean(axis=0, dtype=np.float64),
    )
    if request.query_topk:
        stats.query_topk = np.zeros((0, request.query_topk), np.float32)
    stats.query_lse = {b: np.zeros(0, np.float64) for b in request.query_betas}
    stats.gallery_lse = {b: np.zeros(0, np.float64) for b in request.gallery_betas}
    for side, (scores, rows) in activation.items():
        setattr(stats, f"{side}_activation_scores", scores)
        setattr(stats, f"{side}_activation", rows)
    return stats


def _sorted(fitted: _Fitted, uri: str) -> tuple[np.ndarray, np.ndarray, dict]:
    order = np.argsort(fitted.ids, kind="stable")
    ids = fitted.ids[order]
    dup = np.flatnonzero(ids[1:] == ids[:-1])
    if dup.size:
        raise InvalidInput(f"{uri} holds id {int(ids[dup[0]])} more than once: attach needs unique ids")
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    activation = {side: (s, np.where(r == NO_ID, NO_ID, inverse[np.maximum(r, 0)])) for side, (s, r) in fitted.activation.items()}
    return ids, fitted.bias[order], activation


def _fingerprint(source: Source, ids: np.ndarray) -> dict:
    sample, digest = sample_hash(source, ids)
    return {
        "count": int(ids.size),
        "id_min": int(ids[0]) if ids.size else None,
        "id_max": int(ids[-1]) if ids.size else None,
        "sample_ids": sample,
        "sample_sha256": digest,
    }


def attach(
    source,
    query_bank,
    method="nnn:alpha=0.75,k=16",
    *,
    out,
    gallery_bank=None,
    normalize: bool | None = None,
    reserve: int | None = None,
    batch: int = BATCH,
    progress: bool | None = None,
    **source_options,
) -> AttachedCollection:
    """Fit ``method`` on the collection ``source`` (a FAISS index file or ``faiss.Index``, or a
    store URI: ``lancedb://``, ``qdrant://``, ``qdrant+http://``, ``postgresql://``, ``chroma://``,
    ``milvus://``; see :mod:`hubless.attached.sources`) against ``query_bank`` (and
    ``gallery_bank`` for DualIS/DualDIS) in one streamed pass of ``batch`` items, and save the
    sidecar to ``out`` (atomically; an existing sidecar there is replaced). The collection is
    only read. Returns the :class:`AttachedCollection`, ready to search.

    ``source_options``: the source's own (``id_field``, ``vector_field``, ``metric``, ``shard``,
    ``client``);
    ``normalize``: the correction's (default: the method's, True: unit vectors expected);
    ``reserve``: how many lowest-bias items the sidecar keeps the vectors of, to score them
    exactly on every search and tighten the certificate (default 1% of the collection, at
    least 64, at most 16,384; 0: none, the bound then uses the collection's smallest bias).
    """
    from hubless.index.lock import write_lock

    if out is None or not isinstance(out, (str, Path)):
        raise InvalidType(f"out must be a directory path for the sidecar; got {out!r}")
    with write_lock(Path(out)):  # one attach or update of a sidecar at a time
        return _attach(source, query_bank, method, out, gallery_bank, normalize, reserve, batch, progress, source_options)


def _attach(source, query_bank, method, out, gallery_bank, normalize, reserve, batch, progress, source_options) -> AttachedCollection:
    batch = check_positive_int(batch, "batch")
    src = open_source(source, **source_options)
    corr = _correction(method, normalize)
    request, qb, gb = _banks(corr, query_bank, gallery_bank, src.dim)
    n = src.count()
    if n == 0:
        raise InvalidInput(f"{src.uri} holds no items")
    corr.check_sizes(n, None if qb is None else qb.shape[0], None if gb is None else gb.shape[0])
    requested = reserve
    if reserve is None:
        reserve = min(n, max(DEFAULT_RESERVE[0], n // 100), DEFAULT_RESERVE[1])
    elif isinstance(reserve, bool) or not isinstance(reserve, (int, np.integer)) or reserve < 0:
        raise InvalidInput(f"reserve must be a whole number of items >= 0; got {reserve!r}")
    started, before = time.perf_counter(), src.bytes_read
    fitted = _fit_stream(corr, src, src.scan(batch), request, qb, gb, n, progress, reserve=min(int(reserve), n))
    ids, bias, activation = _sorted(fitted, src.uri)
    reserve_ids, reserve_vectors = _reserve_sorted(fitted.reserve_ids, fitted.reserve_vectors)
    info = _info(corr, src, ids, bias, qb, gb, fitted.gallery_sum, exact_mean=True)
    info["reserve"] = {"size": int(reserve_ids.size), "threshold": _thresholds(ids, bias, reserve_ids), "requested": requested}
    info["attached"] = {"seconds": round(time.perf_counter() - started, 3), "bytes_read": int(src.bytes_read - before), "items": int(n)}
    info["source"]["options"] = _recorded_options(source_options)
    stats = _global_statistics(request, ids.size, qb, gb, fitted.gallery_sum / max(ids.size, 1), activation)
    sidecar = Sidecar(ids, bias, stats, info, reserve_ids=reserve_ids, reserve_vectors=reserve_vectors)
    write_sidecar(out, sidecar)
    return AttachedCollection(src, sidecar, verify=False)


def _recorded_options(options: dict) -> dict:
    """The source options worth recording in the sidecar, so that the collection can be opened
    again from it alone (``hubless serve``): plain values (``id_field``, ``vector_field``,
    ``metric``), never an open client or shard."""
    return {k: v for k, v in options.items() if isinstance(v, (str, int, float, bool)) and v is not None}


def _reserve_sorted(ids: np.ndarray, vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(ids, kind="stable")
    return np.ascontiguousarray(ids[order]), np.ascontiguousarray(vectors[order], np.float32)


def _thresholds(ids: np.ndarray, bias: np.ndarray, reserve_ids: np.ndarray) -> list[float]:
    """Each bias column's smallest value over the items *outside* the reserve (the certificate's
    bound; the collection's smallest when everything is in the reserve)."""
    outside = ~np.isin(ids, reserve_ids)
    part = bias[outside] if outside.any() else bias
    return [float(v) for v in part.min(axis=0).astype(np.float64)]


def _info(corr, src: Source, ids, bias, qb, gb, gallery_sum, *, exact_mean: bool) -> dict:
    return {
        "spec": corr.spec,
        "normalize": bool(corr.normalize),
        "dim": int(src.dim),
        "bias_columns": int(bias.shape[1]),
        "source": {"kind": src.kind, "uri": src.uri},
        "fingerprint": _fingerprint(src, ids),
        "banks": {
            "query_bank": {"sha256": array_fingerprint(qb), "n": None if qb is None else int(qb.shape[0])},
            "gallery_bank": {"sha256": array_fingerprint(gb), "n": None if gb is None else int(gb.shape[0])},
        },
        "b_min": [float(v) for v in (bias.min(axis=0).astype(np.float64) if bias.size else np.zeros(bias.shape[1]))],
        "gallery_sum": [float(v) for v in gallery_sum],
        "gallery_mean_exact": bool(exact_mean),
    }


def update(
    out,
    source,
    query_bank,
    *,
    gallery_bank=None,
    batch: int = BATCH,
    progress: bool | None = None,
    **source_options,
) -> dict:
    """Bring the sidecar in ``out`` in step with ``source`` after items were added or removed
    there: the ids are compared (read in batches; no vector), only added items' vectors are read
    and their biases computed, removed items' rows dropped. DIS/DualDIS (activation sets over the
    whole collection) and DN without a gallery bank after removals (its shown scores use the
    collection's mean) re-read the whole collection: the report says so (``refit``).

    The banks must be the ones the sidecar was fitted on (checked by fingerprint). Returns
    ``{"added", "removed", "items", "bytes_read", "read_items", "refit"}``.
    """
    from hubless.index.lock import write_lock

    with write_lock(Path(out)):  # one attach or update of a sidecar at a time
        return _update(out, source, query_bank, gallery_bank, batch, progress, source_options)


def _update(out, source, query_bank, gallery_bank, batch, progress, source_options) -> dict:
    batch = check_positive_int(batch, "batch")
    old = read_sidecar(out)
    src = open_source(source, **source_options)
    if src.uri != old.info["source"]["uri"] and not isinstance(source, Source):
        raise Conflict(f"sidecar {out} is attached to {old.info['source']['uri']}, not {src.uri}")
    corr = _correction(old.spec, bool(old.info["normalize"]))
    request, qb, gb = _banks(corr, query_bank, gallery_bank, src.dim)
    for name, bank in (("query_bank", qb), ("gallery_bank", gb)):
        if array_fingerprint(bank) != old.info["banks"][name]["sha256"]:
            raise InvalidInput(f"{name} is not the one sidecar {out} was fitted on (fingerprint differs): attach again to change banks")
    before = src.bytes_read
    current = np.concatenate(list(src.scan_ids(batch)) or [np.zeros(0, np.int64)])
    current = np.sort(current)
    added = np.setdiff1d(current, old.ids, assume_unique=False)
    removed = np.setdiff1d(old.ids, current)
    mean_read = corr.name == "dn" and gb is None
    refit = None
    if added.size == 0 and removed.size == 0:
        fp = _fingerprint(src, old.ids)
        if fp["sample_sha256"] != old.info["fingerprint"]["sample_sha256"]:
            refit = "the sampled items' vectors changed in place (same ids): every item was re-read"
        else:
            return {
                "added": 0,
                "removed": 0,
                "items": int(old.ids.size),
                "bytes_read": int(src.bytes_read - before),
                "read_items": 0,
                "refit": None,
            }
    if request.query_activation_k or request.gallery_activation_k:
        refit = f"{corr.spec} gates by activation sets over the whole collection: every item was re-read"
    elif mean_read and removed.size:
        refit = "DN without a gallery bank shows scores with the collection's mean, which removals change: every item was re-read"
    if refit is not None:
        requested = old.info["reserve"].get("requested")
        kept = old.info["source"].get("options", {})  # recorded again (src is open: open_source ignores them)
        _attach(src, query_bank, old.spec, out, gallery_bank, bool(old.info["normalize"]), requested, batch, progress, kept)
        return {
            "added": int(added.size),
            "removed": int(removed.size),
            "items": int(current.size),
            "bytes_read": int(src.bytes_read - before),
            "read_items": int(current.size),
            "refit": refit,
        }
    if current.size == 0:
        raise InvalidInput(f"{src.uri} holds no items")
    corr.check_sizes(current.size, None if qb is None else qb.shape[0], None if gb is None else gb.shape[0])

    def new_batches():
        for lo in range(0, added.size, batch):
            ids = added[lo : lo + batch]
            yield ids, src.fetch(ids, batch)

    threshold = np.asarray(old.info["reserve"]["threshold"], np.float32)
    fitted = _fit_stream(corr, src, new_batches(), request, qb, gb, int(added.size), progress, below=threshold)
    keep_reserve = ~np.isin(old.reserve_ids, removed)  # the threshold stays a lower bound: removals only raise the minimum
    reserve_ids, reserve_vectors = _reserve_sorted(
        np.concatenate([old.reserve_ids[keep_reserve], fitted.reserve_ids]),
        np.concatenate([old.reserve_vectors[keep_reserve], fitted.reserve_vectors]),
    )
    keep = ~np.isin(old.ids, removed)
    ids = np.concatenate([old.ids[keep], fitted.ids])
    bias = np.concatenate([old.bias[keep], fitted.bias])
    order = np.argsort(ids, kind="stable")
    ids, bias = ids[order], bias[order]
    gallery_sum = np.asarray(old.info["gallery_sum"], np.float64) + fitted.gallery_sum
    exact_mean = bool(old.info.get("gallery_mean_exact", True)) and removed.size == 0
    info = _info(corr, src, ids, bias, qb, gb, gallery_sum, exact_mean=exact_mean)
    info["attached"] = old.info.get("attached")
    info["source"]["options"] = old.info["source"].get("options", {})
    info["reserve"] = {**old.info["reserve"], "size": int(reserve_ids.size), "threshold": [float(v) for v in threshold]}
    stats = _global_statistics(request, ids.size, qb, gb, gallery_sum / max(ids.size, 1), {})
    write_sidecar(out, Sidecar(ids, bias, stats, info, reserve_ids=reserve_ids, reserve_vectors=reserve_vectors))
    return {
        "added": int(added.size),
        "removed": int(removed.size),
        "items": int(ids.size),
        "bytes_read": int(src.bytes_read - before),
        "read_items": int(added.size),
        "refit": None,
    }


@dataclass
class AttachedResult:
    """An attached search: ``scores``/``ids`` (n_queries, top_k) as :meth:`hubless.Index.search`
    (the method's scores, the store's ids, best first; missing slots id -1, score -inf),
    ``certified`` (n_queries,) bool (the top-k is exact relative to the store's plain ranking,
    see the module docstring) and ``candidates`` (n_queries,) the k' each query was answered with."""

    scores: np.ndarray
    ids: np.ndarray
    certified: np.ndarray
    candidates: np.ndarray
    #: with ``metadata=True``: per query, per hit ``{"id", **the store's payload}``
    metadata: list | None = None

    def __iter__(self):  # scores, ids = result
        return iter((self.scores, self.ids))


class AttachedCollection:
    """A collection with its attached sidecar: corrected search through the store's own ANN,
    certified (see the module docstring). Open one with :meth:`open`."""

    def __init__(self, source: Source, sidecar: Sidecar, *, verify: bool = True) -> None:
        self.source = source
        self.sidecar = sidecar
        info = sidecar.info
        self.correction = _correction(info["spec"], bool(info["normalize"])).for_rows(sidecar.bias, sidecar.statistics)
        self.b_min = np.asarray(info["b_min"], np.float64)
        #: each bias column's smallest value outside the reserve: the certificate's bound
        self.threshold = np.asarray(info["reserve"]["threshold"], np.float64)
        self.reserve_ids = sidecar.reserve_ids
        self.reserve_vectors = sidecar.reserve_vectors
        self.reserve_rows = np.searchsorted(sidecar.ids, sidecar.reserve_ids)
        if verify:
            self.verify()

    @classmethod
    def open(cls, source, sidecar, **source_options) -> AttachedCollection:
        """The collection ``source`` with the sidecar directory ``sidecar``; refused
        (:class:`~hubless.errors.Conflict`) when the collection changed since the sidecar was
        written (run :func:`update`)."""
        return cls(open_source(source, **source_options), read_sidecar(sidecar))

    def __repr__(self) -> str:
        return f"AttachedCollection({self.source.uri!r}, {self.sidecar.spec!r}, n={self.ntotal})"

    @property
    def ntotal(self) -> int:
        return int(self.sidecar.ids.size)

    @property
    def spec(self) -> str:
        return self.sidecar.spec

    def verify(self) -> None:
        """Check the collection against the sidecar's fingerprint (count, then the sample hash):
        :class:`~hubless.errors.Conflict` naming what changed."""
        fp = self.sidecar.fingerprint
        self._check_count()
        try:
            _, digest = sample_hash(self.source, self.sidecar.ids)
        except KeyError:  # NotFound: a sampled id is gone
            digest = None
        if digest != fp["sample_sha256"]:
            raise Conflict(
                f"{self.source.uri} changed since it was attached (the sampled items' vectors or ids differ): "
                f"run hubless attach --update (hubless.attached.update) before searching"
            )

    def _check_count(self) -> None:
        n = self.source.count()
        if n != self.ntotal:
            raise Conflict(
                f"{self.source.uri} changed since it was attached ({self.ntotal} items then, {n} now): "
                "run hubless attach --update (hubless.attached.update) before searching"
            )

    def search(self, queries, top_k: int = 10, **options) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids) as :meth:`hubless.Index.search`; see :meth:`search_certified`."""
        result = self.search_certified(queries, top_k, **options)
        return result.scores, result.ids

    def search_certified(
        self,
        queries,
        top_k: int = 10,
        *,
        candidates: int | None = None,
        max_candidates: int | None = None,
        metadata: bool = False,
        **options,
    ) -> AttachedResult:
        """Corrected top-``top_k`` through the store's plain search (see the module docstring).

        ``candidates``: the first k' (default ``8 * top_k``); ``max_candidates``: the largest k'
        an uncertified query is widened to (default ``max(1024, 64 * top_k)``, at most the
        collection). ``options``: the correction's weight (``alpha=``, ``lam=``, ``weight=``) and
        the store's search knobs (``nprobe``, ``ef_search``, ...). ``metadata``: also read the
        hits' metadata from the store (its payload or other columns; one read for the batch).
        """
        if not isinstance(metadata, (bool, np.bool_)):
            raise InvalidType(f"metadata must be True or False; got {metadata!r}")
        corr = self.correction
        top_k = check_positive_int(top_k, "top_k")
        n = self.ntotal
        weight = {k: options.pop(k) for k in list(options) if k in (corr.weight_param, "weight")}
        batch = corr.queries(queries, **weight)
        depth = corr.query_request.depth
        k = min(top_k, n)
        first = check_positive_int(candidates, "candidates") if candidates is not None else CANDIDATE_FACTOR * k
        limit = check_positive_int(max_candidates, "max_candidates") if max_candidates is not None else max(1024, MAX_FACTOR * k)
        limit = min(max(limit, k), n)
        first = min(max(first, k, depth), limit if candidates is None else n)
        self._check_count()
        nq = len(batch)
        scores = np.full((nq, top_k), -np.inf, np.float32)
        ids = np.full((nq, top_k), -1, np.int64)
        certified = np.zeros(nq, bool)
        used = np.zeros(nq, np.int64)
        todo = np.arange(nq)
        kp = first
        while todo.size:
            ok = np.zeros(todo.size, bool)
            step = max(1, ANSWER_ELEMENTS // (kp + self.reserve_ids.size))  # queries per round: bounded temporaries
            for lo in range(0, todo.size, step):
                rows = todo[lo : lo + step]
                part = batch.rows(0, nq) if rows.size == nq else _take(batch, rows)
                s, i, ok[lo : lo + step] = self._answer(part, k, kp, options)
                scores[rows, :k], ids[rows, :k], certified[rows], used[rows] = s, i, ok[lo : lo + step], kp
            if kp >= limit:
                break
            todo = todo[~ok]
            kp = min(2 * kp, limit)
        found_meta: list | None = None
        if metadata:
            flat = iter(self.source.payloads(ids[ids >= 0]))
            found_meta = [[{"id": int(i), **next(flat)} for i in hits[hits >= 0].tolist()] for hits in ids]
        return AttachedResult(scores, ids, certified, used, found_meta)

    def evaluate(self, queries, top_k: int = 10, **options) -> dict:
        """The attached search measured against exact corrected search (:meth:`exact_search`,
        a full scan) on ``queries``: ``recall`` = mean over queries of
        |attached top-k ∩ exact top-k| / |exact top-k| (recall@k, 1.0 when every answer is the
        exact one), ``certified`` = the share of queries whose answer carries the certificate
        (exact relative to the store's plain ranking), ``candidates`` = the mean k' used, with
        ``top_k`` and ``queries`` (their count). ``options`` as :meth:`search_certified` (the
        weight applies to both searches). Reads the whole collection: for evaluation only."""
        weight = {k: options[k] for k in list(options) if k in (self.correction.weight_param, "weight")}
        result = self.search_certified(queries, top_k, **options)
        want = self.exact_search(queries, top_k, **weight)[1]
        return {
            "top_k": int(top_k),
            "queries": int(result.ids.shape[0]),
            "recall": recall_at_k(result.ids, want),
            "certified": float(result.certified.mean()) if result.certified.size else 1.0,
            "candidates": float(result.candidates.mean()) if result.candidates.size else 0.0,
        }

    def exact_search(self, queries, top_k: int = 10, *, batch: int = BATCH, **weight) -> tuple[np.ndarray, np.ndarray]:
        """Exact corrected search over every item of the collection, by brute force: the
        collection is scanned (twice for DIS/DualDIS/CSLS, whose raw top neighbours come
        first) and every item ranked ``s - W(q) . bias`` with the sidecar's biases; (scores,
        ids) as :meth:`search`. What :meth:`search` is measured against (``hubless attach
        --search Q --exact``); it reads the whole collection, so it is for evaluation, not
        serving."""
        from hubless.corrections import QueryStatistics

        corr = self.correction
        top_k = check_positive_int(top_k, "top_k")
        batch = check_positive_int(batch, "batch")
        all_queries = corr.queries(queries, **weight)
        self._check_count()
        n, nq = self.ntotal, len(all_queries)
        k = min(top_k, n)
        depth = corr.query_request.depth
        scores = np.full((nq, top_k), -np.inf, np.float32)
        ids = np.full((nq, top_k), -1, np.int64)
        for lo in range(0, nq, EXACT_QUERY_BLOCK):
            part = all_queries.rows(lo, min(nq, lo + EXACT_QUERY_BLOCK))
            if depth:
                raw, pos = self._scan_top(part, min(depth, n), batch, None)
                part.statistics = QueryStatistics.from_neighbours(corr.query_request, raw, pos)
            w = np.asarray(corr.weights(part), np.float32)
            ranking, pos = self._scan_top(part, k, batch, w)
            found = pos >= 0
            shown = corr.method_scores(part, np.where(found, ranking, 0))
            scores[lo : lo + len(part), :k] = np.where(found, shown, -np.inf)
            ids[lo : lo + len(part), :k] = np.where(found, self.sidecar.ids[np.maximum(pos, 0)], -1)
        return scores, ids

    def _scan_top(self, part, k: int, batch: int, w) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` (values, sidecar rows) of each query over a scan of the collection: raw
        similarities (``w`` None) or the ranking ``s - w . bias`` (exactly additive methods only,
        as every attached one is)."""
        from hubless.engine.merge import merge_topk_ids

        nq = len(part)
        best = (np.full((nq, 0), -np.inf, np.float32), np.zeros((nq, 0), np.int64))
        seen = 0
        for item_ids, vectors in self.source.scan(batch):
            rows = _rows(self.correction, self.source, vectors, seen)
            seen += rows.shape[0]
            pos = np.minimum(np.searchsorted(self.sidecar.ids, item_ids), self.ntotal - 1)
            if (self.sidecar.ids[pos] != item_ids).any():
                raise Conflict(f"{self.source.uri} holds ids the sidecar does not: run hubless attach --update")
            values = part.vectors @ rows.T
            if w is not None:
                values = values - w @ self.sidecar.bias[pos].T
            best = merge_topk_ids(best, (values.astype(np.float32), np.broadcast_to(pos, values.shape)), k)
        return best[0].astype(np.float32), best[1]

    def _answer(self, batch, k: int, kp: int, knobs: dict):
        """One round: the store's plain top-``kp`` plus the reserve, re-scored exactly, and the
        certificate of each query (see the module docstring)."""
        from hubless.corrections import QueryStatistics

        corr = self.correction
        nq, m = len(batch), self.reserve_ids.size
        plain, found = self.source.search(batch.vectors, kp, **knobs)
        valid = found >= 0
        pos = np.minimum(np.searchsorted(self.sidecar.ids, found), self.ntotal - 1)
        unknown = valid & (self.sidecar.ids[pos] != found)
        if unknown.any():
            raise Conflict(
                f"{self.source.uri} returned id {int(found[unknown][0])}, which the sidecar does not hold: the collection changed "
                "since it was attached; run hubless attach --update"
            )
        pos = np.where(valid, pos, 0)
        request = corr.query_request
        if request.depth:  # raw top-1 (DIS/DualDIS gates), raw top-k (CSLS's shown r_q): the store's plain ranking
            batch.statistics = QueryStatistics.from_neighbours(request, plain, pos)
        # the reserve: scored exactly for every query, except where the store returned it already
        in_store = np.zeros((nq, m), bool)
        if m:
            at = np.minimum(np.searchsorted(self.reserve_ids, found), m - 1)
            hit = valid & (self.reserve_ids[at] == found)
            in_store[np.nonzero(hit)[0], at[hit]] = True
        reserve_sims = batch.vectors @ self.reserve_vectors.T if m else np.zeros((nq, 0), np.float32)
        sims = np.hstack([np.where(valid, plain, 0), reserve_sims]).astype(np.float32)
        columns = np.hstack([pos, np.broadcast_to(self.reserve_rows, (nq, m))])
        ids = np.hstack([np.where(valid, found, -1), np.broadcast_to(self.reserve_ids, (nq, m))])
        ok_slot = np.hstack([valid, ~in_store])
        ranking = np.array(corr.rank(batch, sims, columns=columns), dtype=np.float32, copy=True)
        ranking[~ok_slot] = -np.inf
        order = np.lexsort((np.where(ok_slot, ids, np.iinfo(np.int64).max), -ranking.astype(np.float64)), axis=1)[:, :k]
        top_rank = np.take_along_axis(ranking, order, axis=1)
        top_ids = np.where(np.isfinite(top_rank), np.take_along_axis(ids, order, axis=1), -1)
        n_valid = valid.sum(axis=1)
        covered = ok_slot.sum(axis=1) >= self.ntotal
        last = np.where(n_valid > 0, plain[np.arange(nq), np.maximum(n_valid - 1, 0)], np.inf).astype(np.float64)
        w = np.asarray(corr.weights(batch), np.float64)
        bound = last - w @ self.threshold
        slack = 8 * np.finfo(np.float32).eps * (np.abs(last) + np.abs(w) @ np.abs(self.threshold) + 1.0)
        kth = top_rank[:, k - 1].astype(np.float64)
        ok = covered | (np.isfinite(kth) & (kth > bound + slack))
        shown = np.where(np.isfinite(top_rank), corr.method_scores(batch, np.where(np.isfinite(top_rank), top_rank, 0)), -np.inf)
        return shown.astype(np.float32), top_ids, ok


def recall_at_k(found: np.ndarray, exact: np.ndarray) -> float:
    """Mean over rows of |found ∩ exact| / |exact| (ids; -1 marks an empty slot), blocked in
    NumPy: the recall@k of ``found`` against the exact answers ``exact``."""
    found, exact = np.asarray(found, np.int64), np.asarray(exact, np.int64)
    if found.shape[0] == 0:
        return 1.0
    hit = (found[:, :, None] == exact[:, None, :]) & (exact[:, None, :] >= 0)
    wanted = np.maximum((exact >= 0).sum(axis=1), 1)
    return float((hit.any(axis=1).sum(axis=1) / wanted).mean())


def _take(batch, rows: np.ndarray):
    weight = batch.weight
    if weight is not None and weight.ndim == 1:
        weight = weight[rows]
    return replace(batch, vectors=batch.vectors[rows], weight=weight, statistics=None)
