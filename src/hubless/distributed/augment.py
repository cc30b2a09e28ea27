"""[r, bias(r)] shards written by Ray tasks: a corrected gallery too large for one machine.

    import hubless.distributed as hd
    out = hd.write_augmented("nnn:alpha=0.75,k=16", "img_emb/", "text_emb/", "augmented/", work_dir="fit-state/")
    xq = hd.augmented_queries("augmented/", queries)        # [q, -W(q)]: rank rows by xq . row

:func:`hubless.distributed.fit` brings the gallery to the driver, since a fitted correction keeps
it for exact re-scoring (:func:`~hubless.distributed.build_index` writes an index directory
instead). Here the driver never reads it: the
bank statistics are computed tile by tile as in :func:`~hubless.distributed.fit_statistics`
(the driver holds only their merge, a few numbers per gallery item), then one task per gallery
shard reads its rows, fits the correction on them from their slice of the statistics and
writes ``part_NNNNN.npy`` = [r, bias(r)] (float32, atomically). Each item's bias depends only
on its own statistics and on the banks' global values (sizes, means), which every slice keeps,
so the parts equal the rows of a single-machine fit (tested). ``hubless.json`` beside them holds
the spec, dimensions, the shards' row ranges and the query state W(q) needs, so any
inner-product engine that ingests the parts (FAISS or autofaiss, a vector database) serves the
correction with :func:`augmented_queries`. Each part's sha256 is recorded (beside it while the
run goes on, ``part_NNNNN.npy.json``; in ``hubless.json`` once complete): a rerun after a crash
keeps the parts whose record vouches for them, and any rerun rewrites a damaged or swapped part,
saying so (:mod:`~hubless.storage.workfiles`).

Served this way: the methods whose query side is a constant weight (NNN, DN, IS, DualIS and the
baseline). DIS/DualDIS gates and CSLS's r_q need each query's raw neighbours, GC is not
additive: refused, with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hubless.corrections import Correction, make_additive, make_correction
from hubless.corrections.serving import check_servable_as_rows, query_vectors
from hubless.distributed.cluster import check_address, connect, run_tasks
from hubless.distributed.fit import _banks_for, _fit_statistics, open_sources
from hubless.distributed.plan import GALLERY_ROWS, cut_points
from hubless.engine.statistics import BankStatistics
from hubless.errors import AlreadyExists, InvalidInput
from hubless.storage.sources import EmbeddingSource
from hubless.storage.workfiles import describe, file_problem, job_id, load_arrays, read_record, recomputing, save_arrays, write_record

__all__ = ["augmented_queries", "write_augmented"]

#: Version of the output layout (hubless.json + part_NNNNN.npy).
FORMAT_VERSION = 1
INFO = "hubless.json"
#: Where a run keeps the gallery shards' per-item statistics for the part tasks (removed at the end).
ROWS = ".statistics"


def _part_name(i: int) -> str:
    return f"part_{i:05d}.npy"


def _write_part(spec: str, gallery: EmbeddingSource, start: int, stop: int, shared: dict, rows_files: list, path: str, key: dict) -> str:
    """One Ray task: rows [start, stop) as [r, bias(r)] in ``path`` (atomically), then its record
    (``key`` and sha256, :mod:`~hubless.storage.workfiles`) beside it; returns the sha256.
    ``shared``: the statistics' global values (sizes, means); ``rows_files``: the gallery shards'
    per-item statistics files holding these rows."""
    from hubless._atomic import atomic_open
    from hubless.index.live import augmented_rows

    rows = gallery.read(start, stop, normalize=make_correction(spec).normalize)
    corr = make_additive(spec).fit(rows, statistics=_rows_statistics(shared, rows_files, start, stop))
    with atomic_open(path, "wb") as fh:
        np.save(fh, augmented_rows(corr))
    return write_record(path, key)


def _fit_to_row_files(request, source, qb, gb, folder: Path, job: str, **fit_options) -> tuple[BankStatistics, Callable[[int, int], list]]:
    """The distributed fit (:func:`hubless.distributed.fit._fit_statistics`, ``fit_options`` go
    to it) with each gallery shard's per-item statistics written to a checksummed file in
    ``folder`` as the shard completes, so the driver keeps none. Returns the statistics (their
    global values only) and ``files_for(a, b)``: the files of the shards overlapping rows ``[a, b)``, as
    :func:`_rows_statistics` reads them."""
    shards: list[tuple[str, dict, int, int]] = []

    def keep(side: str, g0: int, g1: int, arrays: dict) -> None:
        path, key = folder / f"{side}-g{g0}-{g1}.npz", {"rows": [g0, g1], "side": side, "job": job}
        save_arrays(path, arrays, key)
        shards.append((str(path), key, g0, g1))

    stats = _fit_statistics(request, source, qb, gb, sink=keep, **fit_options)

    def files_for(a: int, b: int) -> list:
        return [f for f in shards if f[2] < b and f[3] > a]

    return stats, files_for


def _rows_statistics(shared: dict, rows_files: list, start: int, stop: int) -> BankStatistics:
    """The statistics of gallery rows [start, stop): their per-item arrays read from the shard
    files that hold them (each checked against its key and sha256), the global values from
    ``shared``."""
    from hubless.errors import Corrupt

    pieces: dict[str, list[np.ndarray]] = {}
    for path, key, g0, g1 in rows_files:
        arrays, why = load_arrays(path, key)
        if arrays is None:
            raise Corrupt(f"{path} {why or 'is missing'}: run the job again")
        for name, values in arrays.items():
            pieces.setdefault(name, []).append(values[max(start, g0) - g0 : min(stop, g1) - g0])
    arrays = {**shared, "sizes": np.array([stop - start, *shared["sizes"][1:]])}
    arrays.update({name: np.concatenate(parts) for name, parts in pieces.items()})
    return BankStatistics.from_arrays(arrays)


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
    ``workers``, tile sizes). A rerun checks every part already written against its recorded
    sha256 and rows, keeps the intact ones and rewrites the others, one warning line each
    (:class:`~hubless.storage.workfiles.RecomputedWarning`)."""
    from hubless._atomic import write_json
    from hubless.progress import progress_bar

    check_address(address)
    check_servable_as_rows(make_correction(method))  # refused before any work, with the rows' own reason
    corr = make_additive(method)
    sources = open_sources(gallery, *_banks_for([corr], query_bank, gallery_bank))  # headers read and checked once
    source, qb, gb = sources["gallery"], sources["query_bank"], sources["gallery_bank"]
    assert source is not None  # open_sources always opens the gallery
    corr.check_sizes(source.n_rows, *(None if s is None else s.n_rows for s in (qb, gb)))
    cuts = cut_points(source.n_rows, shard_rows, "shard_rows")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {
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
    job = job_id(info)
    kept, damaged = _kept_info(folder)
    if damaged:
        recomputing(folder / INFO, "is damaged (unreadable JSON); each part is checked against its own record")
    elif kept is None and any(p.name != INFO for p in folder.iterdir()):
        raise AlreadyExists(f"{folder} is not empty and was not written by write_augmented: pass a new or empty folder")
    if kept is not None and _without_digests(kept, info) != json.loads(json.dumps(info)):
        raise InvalidInput(f"{folder} holds parts of another fit (other data, method or shards): pass a new folder or delete {folder}")
    digests = _check_parts(folder, info["parts"], job, kept)
    if kept is not None and kept.get("complete") and len(digests) == len(info["parts"]):
        return folder  # written by an earlier run of the same fit, every part intact
    write_json(folder / INFO, _with_digests(info, digests, complete=False))  # what is verified so far survives a crash
    # each gallery shard's per-item statistics go to a file as the shard completes: the driver keeps none
    rows_dir = folder / ROWS
    shutil.rmtree(rows_dir, ignore_errors=True)
    rows_dir.mkdir()
    stats, files_for = _fit_to_row_files(
        corr.statistics_request(),
        source,
        qb,
        gb,
        rows_dir,
        job,
        normalize=corr.normalize,
        address=address,
        progress=progress,
        **fit_options,
    )
    shared = stats.to_arrays()
    todo = [(i, p) for i, p in enumerate(info["parts"]) if p["file"] not in digests]
    if todo:
        ray = connect(address)
        task = ray.remote(_write_part).options(max_retries=3)
        source_ref, shared_ref = ray.put(source), ray.put(shared)  # once in the object store, not in every task's arguments
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))

        def submit(part: dict):
            a, b = part["start"], part["stop"]
            return task.remote(corr.spec, source_ref, a, b, shared_ref, files_for(a, b), str(folder / part["file"]), _part_key(part, job))

        bar = progress_bar(None, progress, total=len(todo), desc="augmented parts", unit="parts")
        try:
            run_tasks(
                ray,
                submit,
                [p for _, p in todo],
                lambda part, digest: digests.__setitem__(part["file"], digest),
                window=2 * cpus,
                bar=bar,
                finish_running=True,  # parts in flight are written and recorded: a rerun keeps them
            )
        finally:
            bar.close()
    # W(q) reads only the banks' global values, the same in every slice: the first row's will do
    first_rows = _rows_statistics(shared, files_for(0, 1), 0, 1)
    first = make_additive(corr.spec).fit(source.read(0, 1, normalize=corr.normalize), statistics=first_rows)
    columns = int(first.bias_columns_.shape[1])
    done = _with_digests(info, digests, complete=True)
    write_json(folder / INFO, {**done, "bias_columns": columns, "query_state": first.query_state()})
    for p in info["parts"]:  # the digests are in hubless.json now
        Path(folder / f"{p['file']}.json").unlink(missing_ok=True)
    shutil.rmtree(rows_dir, ignore_errors=True)
    return folder


def _part_key(part: dict, job: str) -> dict:
    return {"part": part["file"], "rows": [part["start"], part["stop"]], "job": job}


def _check_parts(folder: Path, parts: list[dict], job: str, kept: dict | None) -> dict[str, str]:
    """The parts already written that can be kept ({file: sha256}): intact according to the
    sha256 recorded for them (in their own record, or in ``hubless.json`` once complete) and
    recorded as this part of this job. The others are recomputed, one warning line each."""
    from concurrent.futures import ThreadPoolExecutor

    from hubless.engine.parallel import num_threads

    listed = {p["file"]: p.get("sha256") for p in (kept or {}).get("parts", [])}

    def check(part: dict) -> tuple[str, str | None, str | None]:
        path = folder / part["file"]
        record = read_record(path)
        if record is not None and record["key"] != json.loads(json.dumps(_part_key(part, job))):
            return part["file"], None, f"is recorded as {describe(record['key'])}, not {describe(_part_key(part, job))}"
        digest = record["sha256"] if record is not None else listed.get(part["file"])
        return part["file"], digest, file_problem(path, digest)

    digests: dict[str, str] = {}
    with ThreadPoolExecutor(num_threads()) as pool:  # hashing releases the GIL: parts are checked in parallel
        for file, digest, why in pool.map(check, parts):
            if why is None and digest is not None:  # (file_problem keeps only a file with a digest)
                digests[file] = digest
            elif why:
                recomputing(folder / file, why)
    return digests


def _with_digests(info: dict, digests: dict[str, str], *, complete: bool) -> dict:
    parts = [{**p, "sha256": digests[p["file"]]} if p["file"] in digests else p for p in info["parts"]]
    return {**info, "parts": parts, "complete": complete}


def _without_digests(kept: dict, info: dict) -> dict:
    """The part of a kept ``hubless.json`` that describes the job (checksums dropped)."""
    out = {k: kept.get(k) for k in info}
    parts = out.get("parts")
    if isinstance(parts, list):
        out["parts"] = [{k: v for k, v in p.items() if k != "sha256"} if isinstance(p, dict) else p for p in parts]
    return out


def _kept_info(folder: Path) -> tuple[dict | None, bool]:
    """(the kept ``hubless.json``, whether one exists but cannot be read)."""
    path = folder / INFO
    if not path.exists():
        return None, False
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return None, True
    return (info, False) if isinstance(info, dict) else (None, True)


def augmented_queries(out: str | os.PathLike, queries, **weight) -> np.ndarray:
    """[q, -W(q)] for parts written by :func:`write_augmented`: ranking rows by ``xq . row``
    ranks the gallery by the correction's score; ``weight=`` may change the method's weight per
    call."""
    folder = Path(out)
    info, _ = _kept_info(folder)
    if info is None or not info.get("complete"):
        raise InvalidInput(f"{folder} holds no complete output of write_augmented (no finished {INFO})")
    corr = make_additive(info["spec"]).for_queries(info["query_state"], int(info["dim"]), int(info["bias_columns"]))
    return query_vectors(corr, queries, **weight)
