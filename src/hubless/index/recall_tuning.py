"""Choose a corrected index for a recall target: the factory and its search breadth, measured.

autofaiss picks a FAISS index and its parameters for a recall target over plain vectors; this
does it for corrected ones. For a fitted additive correction, :func:`tune_for_recall` (behind
:func:`hubless.index.tuner.tune_index` and ``Index.build(target_recall=)``)

1. lists candidates for the gallery's size ``n`` (:func:`candidate_factories`): ``Flat``
   (exact, always; it needs no structure besides the stored gallery), ``IVF<nlist>,Flat`` with
   nlist the powers of two nearest ``sqrt(n)`` and ``4 sqrt(n)`` (at least 39 items per list),
   ``HNSW32``, and, when ``max_memory`` leaves out every uncompressed structure,
   ``IVF<nlist>,PQ<m>`` with the widest codes that fit;
2. builds each candidate that fits ``max_memory`` (the FAISS structure's bytes, estimated
   before building by :func:`estimate_bytes` and measured after by :func:`structure_bytes`) and
   raises its knob (``nprobe`` 1, 2, 4, ... up to nlist; ``ef_search`` 16, 32, ... up to 4096)
   until the corrected top ``top_k`` holds ``target_recall`` of the exact corrected top
   ``top_k``, recall@k = mean over queries of |ANN top-k & exact top-k| / k, on the *choice*
   queries;
3. times each candidate at its chosen knob: p50 over single-query searches (and the batch
   time per query), through :meth:`Index.search` with its exact re-scoring;
4. keeps the fastest candidate that reaches the target (by p50); when none does, the one with
   the highest recall, with ``reached=False`` and a warning;
5. measures the chosen index once more on the *check* queries, which took no part in the
   choice: ``heldout_recall`` is what to expect on unseen queries.

Both query samples are disjoint random samples of the **query bank** (the queries the
correction was fitted on): the tuner is given nothing else, so test queries (and whatever is
given to :func:`hubless.evaluate`) can never take part. Everything measured goes to
``IndexConfig.tuning`` (shown by :meth:`Index.info` and ``hubless index info``, saved with the
index).
"""

from __future__ import annotations

import math
import re
import statistics
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from hubless._validation import as_embeddings, check_positive_int, check_target_recall
from hubless.errors import InvalidInput, InvalidType
from hubless.index.factory import POINTS_PER_CENTROID, check_factory
from hubless.index.faiss_build import DEFAULT_SPILL, plan_layout

if TYPE_CHECKING:
    from hubless.corrections import AdditiveCorrection
    from hubless.index.view import IndexView

__all__ = ["candidate_factories", "estimate_bytes", "parse_size", "structure_bytes", "tune_for_recall"]

#: The index class :func:`tune` builds its candidates with (:class:`hubless.Index`): given, so
#: the tuner depends on the read-only face of an index only.
Built = TypeVar("Built", bound="IndexView")

#: Galleries up to this size are served exactly (Flat): a scan is as fast as any ANN structure.
FLAT_ONLY_BELOW = 5_000
#: HNSW's links per node in the candidates.
HNSW_M = 32
#: ef_search values tried for HNSW (powers of two from 16) and its largest.
EF_START, EF_LIMIT = 16, 4096
_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(size: int | str | None) -> int | None:
    """Bytes from ``size``: an int, or text such as ``"2GB"``, ``"1.5 GiB"``, ``"500M"``,
    ``"4096"`` (k/M/G/T are powers of 1000, KiB/MiB/GiB/TiB of 1024). None passes through."""
    if size is None:
        return None
    if isinstance(size, bool):
        raise InvalidType(f"max_memory must be a size such as '2GB' or a number of bytes; got {size!r}")
    if isinstance(size, (int, np.integer)):
        value = float(size)
    elif isinstance(size, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", size)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise InvalidInput(f"max_memory must be a size such as '2GB', '512MiB' or a number of bytes; got {size!r}")
        value = float(match.group(1)) * _UNITS[unit]
    else:
        raise InvalidType(f"max_memory must be a size such as '2GB' or a number of bytes; got {size!r}")
    if not value >= 1:
        raise InvalidInput(f"max_memory must be at least 1 byte; got {size!r}")
    return int(value)


def _pow2(x: float) -> int:
    return int(2 ** round(math.log2(max(1.0, x))))


def _ivf_lists(n: int) -> list[int]:
    """nlist choices for ``n`` items: the powers of two nearest sqrt(n) and 4 sqrt(n), with at
    least :data:`POINTS_PER_CENTROID` items per list."""
    cap = 2 ** int(math.log2(max(1, n // POINTS_PER_CENTROID)))
    return sorted({min(_pow2(f * math.sqrt(n)), cap) for f in (1, 4)})


def estimate_bytes(factory: str, n: int, dim: int, n_bias: int = 1, *, spill: float = DEFAULT_SPILL) -> int:
    """Bytes of the FAISS structure ``factory`` over ``n`` items of ``dim`` + ``n_bias`` columns
    (the gallery rows themselves, n x dim float32, are kept by every index for exact re-scoring
    and can be memory-mapped: not counted). IVF stores ``n (1 + spill)`` rows (the spilled copies)
    of 4 D bytes (Flat) or ceil(m' bits / 8) bytes (PQ, m' = m + the bias sub-vectors) plus an
    8-byte id each, and nlist centroids of D floats; HNSW<M> stores n rows of 4 D bytes and
    about 2.1 M int32 links per node (2 M at level 0, a few more above); Flat needs none (0)."""
    text = check_factory(factory, max(n, 1), dim + n_bias)
    faiss_factory, d, _ = plan_layout(text, dim, n_bias)
    if text == "Flat":
        return 0
    hnsw = re.fullmatch(r"HNSW(\d+)(?:,Flat)?", text)
    if hnsw:
        m = int(hnsw.group(1))
        return int(n * (4 * d + 4 * 2.1 * m + 16))
    ivf = re.match(r"IVF(\d+),", text)
    rows = n * (1 + spill) if ivf else n
    code = 4 * d
    pq = re.search(r"PQ(\d+)(?:x(\d+))?", faiss_factory)
    if pq:
        code = math.ceil(int(pq.group(1)) * int(pq.group(2) or 8) / 8)
    elif "SQ" in text:
        code = {"SQ4": d // 2 + 1, "SQ6": (6 * d + 7) // 8, "SQ8": d, "SQfp16": 2 * d}[text.split(",")[1]]
    centroids = int(ivf.group(1)) * d * 4 if ivf else 0
    return int(rows * (code + (8 if ivf else 0)) + centroids)


def structure_bytes(faiss_index) -> int:
    """Bytes a built FAISS structure holds: IVF codes + ids of every stored row and the
    centroids; HNSW rows and links; other indexes their codes (0 for None: Flat)."""
    if faiss_index is None:
        return 0
    import faiss

    try:
        ivf = faiss.extract_index_ivf(faiss_index)
    except RuntimeError:
        ivf = None
    if ivf is not None:
        return int(ivf.ntotal * (ivf.code_size + 8) + ivf.quantizer.ntotal * ivf.quantizer.d * 4)
    inner = faiss.downcast_index(faiss_index)
    if isinstance(inner, faiss.IndexHNSW):
        storage = faiss.downcast_index(inner.storage)
        return int(storage.ntotal * storage.code_size + inner.hnsw.neighbors.size() * 4 + inner.hnsw.levels.size() * 4)
    code_size = getattr(inner, "code_size", 4 * inner.d)
    return int(inner.ntotal * code_size)


def candidate_factories(n: int, dim: int, n_bias: int = 1, max_memory: int | None = None) -> list[tuple[str, int]]:
    """``[(factory, estimated bytes)]`` worth trying for ``n`` items (see the module docstring):
    Flat always; IVF nlist ~ sqrt(n) and ~ 4 sqrt(n); HNSW32; IVF-PQ only when ``max_memory``
    rules out every uncompressed structure (m = dim/4, dim/8, dim/16, dim/32: the widest that
    fits; 4-bit codes below 39 x 256 items, the fewest 8-bit codes train on). Candidates over ``max_memory`` are still listed
    (the tuner records them as skipped)."""
    out: list[tuple[str, int]] = [("Flat", 0)]
    if n < FLAT_ONLY_BELOW:
        return out
    lists = _ivf_lists(n)
    plain = [f"IVF{nlist},Flat" for nlist in lists] + [f"HNSW{HNSW_M}"]
    out += [(f, estimate_bytes(f, n, dim, n_bias)) for f in plain]
    if max_memory is not None and all(b > max_memory for _, b in out[1:]):
        bits = "" if n >= POINTS_PER_CENTROID * 256 else "x4"  # 4-bit codes below 39 x 256 training items
        widths = sorted({max(1, dim // s) for s in (4, 8, 16, 32)}, reverse=True)
        pq = [f"IVF{lists[-1]},PQ{m}{bits}" for m in widths]
        fits = [f for f in pq if estimate_bytes(f, n, dim, n_bias) <= max_memory]
        factory = fits[0] if fits else pq[-1]
        out.append((factory, estimate_bytes(factory, n, dim, n_bias)))
    return out


def _recall(found: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Per query |found & exact| / k (ids; -1 never matches an exact id)."""
    hits = (found[:, :, None] == exact[:, None, :]).any(axis=2).sum(axis=1)
    return hits / exact.shape[1]


def _knob_values(param: str | None, limit: int) -> list[int | None]:
    if param is None:
        return [None]
    values = [1 if param == "nprobe" else EF_START]
    while values[-1] < limit:
        values.append(min(2 * values[-1], limit))
    return list(values)


def _search(index: IndexView, queries: np.ndarray, top_k: int, param: str | None, value: int | None) -> np.ndarray:
    """The ids of ``index``'s top ``top_k`` with its knob ``param`` (nprobe / ef_search) at ``value``."""
    nprobe = value if param == "nprobe" else None
    ef_search = value if param == "ef_search" else None
    return index.search(queries, top_k, nprobe=nprobe, ef_search=ef_search)[1]


def _latency(index: IndexView, queries: np.ndarray, top_k: int, param: str | None, value: int | None, n_single: int) -> tuple[float, float]:
    """(p50 ms of single-query searches, ms per query of one batch search)."""
    times = []
    for i in range(min(n_single, queries.shape[0])):
        t0 = time.perf_counter()
        _search(index, queries[i : i + 1], top_k, param, value)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    _search(index, queries, top_k, param, value)
    batch = (time.perf_counter() - t0) / queries.shape[0]
    return 1000 * statistics.median(times), 1000 * batch


def tune_for_recall(
    make: Callable[..., Built],
    correction: AdditiveCorrection,
    query_bank,
    *,
    target_recall: float = 0.95,
    max_memory: int | str | None = None,
    factories: list[str] | None = None,
    top_k: int = 10,
    sample: int = 500,
    latency_queries: int = 50,
    seed: int = 0,
    gallery_bank=None,
    keep_banks: bool = True,
    **options: Any,
) -> Built:
    """An :class:`~hubless.index.Index` over the fitted ``correction`` with the factory and knob
    chosen for ``target_recall`` (see the module docstring), ``config.tuning`` recording the choice.

    ``query_bank``: the queries the correction was fitted on; up to ``sample`` of them choose,
    up to ``sample`` others check (at least 10 each). ``max_memory``: bytes of the FAISS
    structure (int or text, :func:`parse_size`). ``factories``: the candidates to try instead of
    :func:`candidate_factories` (e.g. one factory: only its knob is chosen). ``keep_banks``: the
    index keeps ``query_bank`` and ``gallery_bank`` (for :meth:`Index.add`). ``options``: the
    :class:`Index` constructor's (ids, metadata, model, rescore, rescore_factor, spill).
    ``make``: the index class (:class:`hubless.Index`), called as its constructor for every
    candidate and the index returned (so the tuner itself depends on no index class).
    """
    target = check_target_recall(target_recall)
    budget = parse_size(max_memory)
    top_k = min(check_positive_int(top_k, "top_k"), correction.n_gallery_)
    check_positive_int(sample, "sample")
    check_positive_int(latency_queries, "latency_queries")
    if query_bank is None:
        raise InvalidInput("tuning an index needs the query bank (its queries are the only ones measured on): pass query_bank")
    bank = as_embeddings(query_bank, "query_bank", normalize=correction.normalize, dim=correction.dim_)
    if bank.shape[0] < 20:
        raise InvalidInput(f"tuning needs at least 20 query-bank queries (10 to choose, 10 to check); the bank has {bank.shape[0]}")
    per = min(sample, bank.shape[0] // 2)
    pick = np.random.default_rng(seed).choice(bank.shape[0], 2 * per, replace=False)
    choose, check = bank[np.sort(pick[:per])], bank[np.sort(pick[per:])]

    n, dim, n_bias = correction.n_gallery_, correction.dim_, correction.bias_columns_.shape[1]
    if factories is None:
        listed = candidate_factories(n, dim, n_bias, budget)
    else:
        if isinstance(factories, str) or not factories:
            raise InvalidInput(f"factories must be a non-empty list of factory strings; got {factories!r}")
        listed = [(f, estimate_bytes(f, n, dim, n_bias)) for f in (check_factory(f, n, dim + n_bias) for f in factories)]

    t0 = time.perf_counter()
    exact_choose = correction.search(choose, top_k)[1]
    exact_seconds = (time.perf_counter() - t0) / choose.shape[0]
    exact_check = correction.search(check, top_k)[1]
    build_opts = {k: options[k] for k in ("rescore", "rescore_factor", "spill") if k in options}

    tried: list[dict[str, Any]] = []
    best: tuple[tuple, Built, dict[str, Any]] | None = None
    for factory, estimate in listed:
        entry: dict[str, Any] = {"factory": factory, "estimated_bytes": estimate}
        tried.append(entry)
        if budget is not None and estimate > budget:
            entry["skipped"] = f"needs ~{estimate:,} bytes > max_memory {budget:,}"
            continue
        t1 = time.perf_counter()
        candidate = make(correction, factory, **build_opts)
        entry["build_seconds"] = round(time.perf_counter() - t1, 3)
        entry["bytes"] = structure_bytes(candidate._snap.faiss)
        if budget is not None and entry["bytes"] > budget:
            entry["skipped"] = f"holds {entry['bytes']:,} bytes > max_memory {budget:,}"
            continue
        knob = candidate.search_knob()
        param = None if knob is None else knob[0]
        curve: list[tuple[int | None, float]] = []
        for value in _knob_values(param, 0 if knob is None else knob[1]):
            curve.append((value, float(_recall(_search(candidate, choose, top_k, param, value), exact_choose).mean())))
            if curve[-1][1] >= target:
                break
        value, recall = curve[-1]
        p50, batch = _latency(candidate, choose, top_k, param, value, latency_queries)
        entry.update(
            param=param,
            value=value,
            recall=round(recall, 4),
            p50_ms=round(p50, 4),
            batch_ms_per_query=round(batch, 4),
            reached=recall >= target,
            curve=[[v, round(r, 4)] for v, r in curve] if param else [],
        )
        rank = (0, p50) if recall >= target else (1, -recall, p50)
        if best is None or rank < best[0]:
            best = (rank, candidate, entry)
        del candidate
    if best is None:
        raise InvalidInput(
            f"max_memory {budget:,} bytes leaves no candidate: every structure needs more ({', '.join(e['skipped'] for e in tried)})"
        )
    _, chosen, entry = best
    heldout = float(_recall(_search(chosen, check, top_k, entry["param"], entry["value"]), exact_check).mean())
    reached = bool(entry["reached"])
    flat_p50 = next((e["p50_ms"] for e in tried if e["factory"] == "Flat" and "p50_ms" in e), None)
    tuning = {
        "target_recall": target,
        "max_memory": budget,
        "top_k": top_k,
        "factory": entry["factory"],
        "param": entry["param"],
        "value": entry["value"],
        "recall": entry["recall"],
        "heldout_recall": round(heldout, 4),
        "reached": reached,
        "p50_ms": entry["p50_ms"],
        "batch_ms_per_query": entry["batch_ms_per_query"],
        "exact_ms_per_query": round(1000 * exact_seconds, 4),
        "speedup_vs_flat_p50": None if not flat_p50 or not entry["p50_ms"] else round(flat_p50 / entry["p50_ms"], 2),
        "bytes": entry["bytes"],
        "queries": {"source": "query bank", "choose": int(choose.shape[0]), "check": int(check.shape[0]), "seed": seed},
        "candidates": tried,
    }
    if not reached:
        warnings.warn(
            f"no candidate index reached recall@{top_k} {target} on the query bank; kept the best: {entry['factory']} "
            f"{entry['param'] or ''}={entry['value']} with recall {entry['recall']:.3f} (held-out {heldout:.3f}). "
            "Allow more memory, more re-scoring (rescore_factor) or a lower target.",
            stacklevel=2,
        )
    final = dict(options)
    if keep_banks:
        final["query_bank"] = bank
        if gallery_bank is not None:
            final["gallery_bank"] = as_embeddings(gallery_bank, "gallery_bank", normalize=correction.normalize, dim=correction.dim_)
    if entry["param"] is not None:
        final[entry["param"]] = entry["value"]
    index = make(correction, entry["factory"], _built=_built_of(chosen), **final)
    index.config.build_seconds = float(entry["build_seconds"])
    index.config.tuning = tuning
    return index


def _built_of(index: IndexView):
    snap = index._snap
    return None if snap.faiss is None else (snap.faiss, snap.layout)
