"""[r, bias(r)] shards written by Ray tasks: a corrected gallery too large for one machine.

    import hubless.distributed as hd
    out = hd.write_augmented("nnn:alpha=0.75,k=16", "img_emb/", "text_emb/", "augmented/", work_dir="fit-state/")
    xq = hd.augmented_queries("augmented/", queries)        # [q, -W(q)]: rank rows by xq . row

:func:`hubless.distributed.fit` brings the gallery to the driver, since a fitted correction (and
an :class:`~hubless.Index`) keeps it for exact re-scoring. Here the driver never reads it: the
bank statistics are computed tile by tile as in :func:`~hubless.distributed.fit_statistics`
(the driver holds only their merge, a few numbers per gallery item), then one task per gallery
shard reads its rows, fits the correction on them from their slice of the statistics and
writes ``part_NNNNN.npy`` = [r, bias(r)] (float32, atomically). Each item's bias depends only
on its own statistics and on the banks' global values (sizes, means), which every slice keeps,
so the parts equal the rows of a single-machine fit (tested). ``hubless.json`` beside them holds
the spec, dimensions, the shards' row ranges and the query state W(q) needs, so any
inner-product engine that ingests the parts (FAISS or autofaiss, a vector database) serves the
correction with :func:`augmented_queries`. Rerun after a crash, finished parts are kept.

Served this way: the methods whose query side is a constant weight (NNN, DN, IS, DualIS and the
baseline). DIS/DualDIS gates and CSLS's r_q need each query's raw neighbours, GC is not
additive: refused, with the reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hubless.corrections import Correction, make_correction
from hubless.distributed.fit import _banks_for, _get, connect, fit_statistics, open_sources
from hubless.distributed.plan import GALLERY_ROWS, cut_points
from hubless.distributed.sources import EmbeddingSource
from hubless.engine.statistics import BankStatistics
from hubless.engine.updates import gallery_rows
from hubless.errors import AlreadyExists, InvalidInput
from hubless.export.query import check_servable, query_vectors

__all__ = ["augmented_queries", "write_augmented"]

#: Version of the output layout (hubless.json + part_NNNNN.npy).
FORMAT_VERSION = 1
INFO = "hubless.json"


def _part_name(i: int) -> str:
    return f"part_{i:05d}.npy"


def _write_part(spec: str, gallery: EmbeddingSource, start: int, stop: int, arrays: dict, path: str) -> None:
    """One Ray task: rows [start, stop) as [r, bias(r)] in ``path``."""
    from hubless._io import atomic_open
    from hubless.index.index import augmented_rows

    rows = gallery.read(start, stop, normalize=make_correction(spec).normalize)
    corr = make_correction(spec).fit_from_statistics(rows, BankStatistics.from_arrays(arrays))
    with atomic_open(path, "wb") as fh:
        np.save(fh, augmented_rows(corr))


def write_augmented(
    method: Correction | str,
    gallery,
    query_bank=None,
    gallery_bank=None,
    out: str | os.PathLike = "augmented",
    *,
    shard_rows: int | Sequence[int] = GALLERY_ROWS,
    address: str | None = None,
    progress: bool | None = None,
    **fit_options,
) -> Path:
    """Write the gallery's [r, bias(r)] rows as ``.npy`` parts in ``out`` (see the module
    docstring) and return ``out``. ``shard_rows``: rows per part (or cut points);
    ``fit_options`` go to :func:`~hubless.distributed.fit_statistics` (``work_dir``,
    ``workers``, tile sizes). Parts already written by an earlier run of the same fit are kept."""
    from hubless._io import write_json
    from hubless.progress import progress_bar

    corr = make_correction(method)
    check_servable(corr)
    sources = open_sources(gallery, *_banks_for([corr], query_bank, gallery_bank))  # headers read and checked once
    source, qb, gb = sources["gallery"], sources["query_bank"], sources["gallery_bank"]
    corr.check_sizes(source.n_rows, *(None if s is None else s.n_rows for s in (qb, gb)))
    cuts = cut_points(source.n_rows, shard_rows, "shard_rows")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    info = {
        "format_version": FORMAT_VERSION,
        "spec": corr.spec,
        "metric": "dot",
        "dim": source.dim,
        "n_items": source.n_rows,
        "parts": [{"file": _part_name(i), "start": a, "stop": b} for i, (a, b) in enumerate(zip(cuts, cuts[1:]))],
        "inputs": {  # what the parts come from: a rerun on other data or banks must not reuse them
            "normalize": bool(corr.normalize),
            **{name: None if s is None else s.fingerprint() for name, s in (("gallery", source), ("query_bank", qb), ("gallery_bank", gb))},
        },
    }
    kept = _kept_info(folder)
    if kept is None and any(folder.iterdir()):
        raise AlreadyExists(f"{folder} is not empty and was not written by write_augmented: pass a new or empty folder")
    if kept is not None and {k: kept.get(k) for k in info} != json.loads(json.dumps(info)):
        raise InvalidInput(f"{folder} holds parts of another fit (other data, method or shards): pass a new folder or delete {folder}")
    if kept is not None and kept.get("complete"):
        return folder  # written by an earlier run of the same fit
    write_json(folder / INFO, {**info, "complete": False})
    stats = fit_statistics(
        corr.statistics_request(), source, qb, gb, normalize=corr.normalize, address=address, progress=progress, **fit_options
    )
    todo = [(i, a, b) for i, (a, b) in enumerate(zip(cuts, cuts[1:])) if not _part_is_done(folder / _part_name(i), b - a, source.dim)]
    if todo:
        ray = connect(address)
        job = ray.remote(_write_part).options(max_retries=3)
        refs = [job.remote(corr.spec, source, a, b, gallery_rows(stats, a, b).to_arrays(), str(folder / _part_name(i))) for i, a, b in todo]
        for ref in progress_bar(refs, progress, desc="augmented parts", unit="parts"):
            _get(ray, ref)
    # W(q) reads only the banks' global values, the same in every slice: the first row's will do
    first = make_correction(corr.spec).fit_from_statistics(source.read(0, 1, normalize=corr.normalize), gallery_rows(stats, 0, 1))
    columns = int(first.bias_columns_.shape[1])
    write_json(folder / INFO, {**info, "bias_columns": columns, "query_state": first.query_state(), "complete": True})
    return folder


def _kept_info(folder: Path) -> dict | None:
    try:
        return json.loads((folder / INFO).read_text())
    except (OSError, ValueError):
        return None


def _part_is_done(path: Path, rows: int, dim: int) -> bool:
    try:
        arr = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    return arr.ndim == 2 and arr.shape[0] == rows and arr.shape[1] > dim and arr.dtype == np.float32


def augmented_queries(out: str | os.PathLike, queries, **weight) -> np.ndarray:
    """[q, -W(q)] for parts written by :func:`write_augmented`: ranking rows by ``xq . row``
    ranks the gallery by the correction's score; ``weight`` (``alpha=``, ``lam=``) may change
    the method's weight per call."""
    folder = Path(out)
    info = _kept_info(folder)
    if info is None or not info.get("complete"):
        raise InvalidInput(f"{folder} holds no complete output of write_augmented (no finished {INFO})")
    corr = make_correction(info["spec"]).for_queries(info["query_state"], int(info["dim"]), int(info["bias_columns"]))
    return query_vectors(corr, queries, **weight)
