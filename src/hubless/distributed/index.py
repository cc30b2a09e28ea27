"""Build a corrected index on Ray straight into an index directory: the driver holds no gallery.

    import hubless.distributed as hd
    index = hd.build_index("nnn:alpha=0.75,k=16", "img_emb/", "text_emb/", "IVF4096,Flat", out="idx/")

The result is a live index directory (:mod:`hubless.index.disk`, format 5) written as one base
``b000001/`` by the tasks, and one ``CURRENT`` written by the driver. This module writes no
format of its own: the directory is made and committed by
:func:`hubless.index.directory.new_base` (as ``Index.save`` makes one), the base's files by
:mod:`hubless.index.base_files`, the IVF structure by :mod:`hubless.index.ivf_lists`.

1. The bank statistics, tile by tile (:func:`hubless.distributed.fit_statistics`); each
   finished gallery shard's per-item statistics go to a checksummed work file, so the driver
   keeps only the banks' global values (sizes, means, activation sets).
2. The driver creates the base's row files at their full size; one task per gallery shard
   [a, b) reads its rows, computes their biases from their statistics
   (:meth:`~hubless.corrections.AdditiveCorrection.row_bias`: every bias is row-local) and
   writes rows a..b of each file in place (:func:`hubless.index.base_files.write_rows`),
   returning the float64 sum of its rows.
3. IVF: one task trains the empty index on the same sample a single-machine build uses, read
   from the written base; one task per shard fills copies of it with its rows and writes each
   list's codes and ids to a work file; the driver writes ``index.faiss`` by streaming those
   files list by list, a few MB at a time, in FAISS's own layout of array inverted lists
   (each list holds its items in gallery order, the spilled copies after them, as one build on
   one machine adds them), so ``Index.load(mmap=True)`` maps the lists. Why FAISS's
   ``merge_ondisk`` / ``merge_from`` are not used: :mod:`hubless.index.ivf_lists`.
4. The driver hashes every file (streamed), writes ``state.npz`` (bank values and the sum of the
   shards' sums), the metadata, and commits ``CURRENT``: the directory loads and searches as
   ``Index.build`` on the same data does (same top-k ids, tested for Flat and IVF).

An HNSW graph cannot be built from shards built apart, nor a plain PQ index filled this way:
use ``Index.build`` on one machine for those (or IVF ... ,PQ beyond one machine).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from hubless.corrections import Correction, make_additive
from hubless.distributed.cluster import _get, check_address, connect, run_tasks
from hubless.distributed.plan import GALLERY_ROWS, cut_points
from hubless.errors import InvalidInput
from hubless.storage.sources import EmbeddingSource

__all__ = ["build_index"]


def _shard_rows(spec: str, gallery: EmbeddingSource, start: int, stop: int, shared: dict, rows_files: list, files: dict) -> np.ndarray:
    """One Ray task: gallery rows [start, stop) (normalised as the correction says), their ids,
    bias columns and per-item statistics written in place into the base's files (``files``:
    :attr:`hubless.index.base_files.BaseFiles.files`); returns the float64 sum of the rows."""
    from hubless.distributed.augment import _rows_statistics
    from hubless.index.base_files import write_rows
    from hubless.index.live import split_statistics

    corr = make_additive(spec)
    rows = gallery.read(start, stop, normalize=corr.normalize)
    stats = _rows_statistics(shared, rows_files, start, stop)
    per_row, _ = split_statistics(stats.restricted(corr.statistics_request()))
    write_rows(files, start, rows, corr.row_bias(rows, stats), per_row)
    return rows.sum(axis=0, dtype=np.float64)


# ---------------------------------------------------------------------------------- the build
def build_index(
    method: Correction | str,
    gallery,
    query_bank=None,
    factory: str | None = None,
    *,
    gallery_bank=None,
    out: str | os.PathLike | None = None,
    overwrite: bool = False,
    load: bool = True,
    shard_rows: int | Sequence[int] = GALLERY_ROWS,
    address: str | None = None,
    train_size: int = 100_000,
    seed: int = 0,
    spill: float | None = None,
    metadata=None,
    model: str | None = None,
    progress: bool | None = None,
    **fit_options,
):
    """A :class:`hubless.Index` of ``method`` over the ``gallery`` source, fitted and written on
    Ray into the index directory ``out`` (see the module docstring); returns it loaded with
    ``mmap=True`` (which reads the ids and biases: 8 + 4 x bias columns bytes per item), or with
    ``load=False`` its path (the driver then keeps nothing per item). The driver never holds
    the gallery: it keeps the banks' global statistics and writes ``CURRENT``; the tasks write
    the base's files, so on a cluster ``out`` must be a directory every node sees (as the
    sources are).

    ``out=None`` writes to a temporary directory and returns the index read into memory (the
    driver then holds it all, as an in-memory index does), detached from any directory.
    ``overwrite``: replace an existing index at ``out`` (as one atomic switch of its
    ``CURRENT``). ``shard_rows``: rows per task. ``fit_options`` go to
    :func:`hubless.distributed.fit_statistics` (``work_dir``, ``workers``, tile sizes). The
    index keeps no banks (it was fitted from tiles): grow a bank with a new distributed fit."""
    from hubless.distributed.fit import _banks_for, open_sources
    from hubless.index import Index, disk, pointer
    from hubless.index.base_files import BaseFiles
    from hubless.index.directory import check_target, new_base
    from hubless.index.factory import check_factory, is_flat
    from hubless.index.faiss_build import default_factory
    from hubless.index.metadata import Metadata

    t0 = time.perf_counter()
    check_address(address)
    corr = make_additive(method)
    if out is None and not load:
        raise InvalidInput("load=False returns the index's directory: pass out=")
    sources = open_sources(gallery, *_banks_for([corr], query_bank, gallery_bank))  # headers read and checked once
    source, qb, gb = sources["gallery"], sources["query_bank"], sources["gallery_bank"]
    assert source is not None  # open_sources always opens the gallery
    n, dim = source.n_rows, source.dim
    # the cheap checks first: a bad factory or metadata fails now, not after the distributed fit
    factory = factory or default_factory(n)
    if "HNSW" in factory.upper():
        raise InvalidInput(
            f"{factory}: an HNSW graph cannot be merged from shards built apart; use an IVF factory or Index.build on one machine"
        )
    factory = check_factory(factory, n, dim + 1)
    flat = is_flat(factory)
    if not flat and not factory.startswith("IVF"):
        raise InvalidInput(f"{factory}: a distributed build writes Flat and IVF indexes; build {factory} with Index.build on one machine")
    corr.check_sizes(n, *(None if s is None else s.n_rows for s in (qb, gb)))
    meta = None if metadata is None else Metadata.from_records(metadata, n)  # counts, keys and types checked before the fit
    if out is not None:
        check_target(Path(out), overwrite)
    cut_points(n, shard_rows, "shard_rows")  # checked before anything is written
    scratch = None if out is not None else Path(tempfile.mkdtemp(prefix="hubless-index-"))  # out=None: removed at the end
    path = Path(out) if out is not None else Path(scratch or ".") / "index"
    try:
        with new_base(path, overwrite=overwrite, check=out is not None, remove_partial=True) as (version, previous):
            work = path / f".tmp-build-{uuid.uuid4().hex}"  # a leftover of a killed build is removed by the next commit
            try:
                base = BaseFiles(path, version)
                work.mkdir()
                manifest = _write_base(
                    base,
                    corr,
                    source,
                    qb,
                    gb,
                    factory,
                    work,
                    version,
                    t0,
                    address,
                    progress,
                    train_size,
                    seed,
                    spill,
                    meta,
                    model,
                    shard_rows,
                    fit_options,
                )
                disk.commit(path, manifest, keep=pointer.names_in(previous))
            finally:
                shutil.rmtree(work, ignore_errors=True)
        if scratch is None:
            return Index.load(path, mmap=True) if load else path
        return Index.load(path).detach()  # read whole, then in memory (as Index.build gives): the directory goes
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _write_base(
    base, corr, source, qb, gb, factory, work, version, t0, address, progress, train_size, seed, spill, meta, model, shard_rows, fit_options
) -> dict:
    """Fit the statistics on Ray, have the tasks write the base's rows (and IVF lists) into
    ``base`` (:class:`hubless.index.base_files.BaseFiles`); returns the manifest to commit."""
    from hubless.distributed.augment import _fit_to_row_files, _rows_statistics
    from hubless.index.config import IndexConfig
    from hubless.index.factory import is_flat
    from hubless.index.faiss_build import plan_layout
    from hubless.index.ivf_lists import train_from_base, write_merged, write_shard_lists
    from hubless.index.live import split_statistics
    from hubless.progress import progress_bar
    from hubless.storage.workfiles import job_id

    n, dim, flat, request = source.n_rows, source.dim, is_flat(factory), corr.statistics_request()
    cuts = cut_points(n, shard_rows, "shard_rows")
    job = job_id({"spec": corr.spec, "gallery": source.fingerprint(), "build": work.name})
    stats, files_for = _fit_to_row_files(
        request, source, qb, gb, work, job, normalize=corr.normalize, address=address, progress=progress, **fit_options
    )
    shared = stats.to_arrays()
    # the base's row files at full size, from what one row's statistics and bias look like
    first = _rows_statistics(shared, files_for(0, 1), 0, 1)
    columns = corr.row_bias(source.read(0, 1, normalize=corr.normalize), first).shape[1]
    files = base.create(n, dim, columns, split_statistics(first.restricted(request))[0])

    ray = connect(address)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    source_ref, shared_ref = ray.put(source), ray.put(shared)  # once in the object store
    task = ray.remote(_shard_rows).options(max_retries=3)
    sums: dict[int, np.ndarray] = {}
    bar = progress_bar(None, progress, total=len(cuts) - 1, desc="index rows", unit="shards")
    try:
        run_tasks(
            ray,
            lambda ab: task.remote(corr.spec, source_ref, ab[0], ab[1], shared_ref, files_for(*ab), files),
            list(zip(cuts, cuts[1:])),
            lambda ab, total: sums.__setitem__(ab[0], np.array(total)),
            window=2 * cpus,
            bar=bar,
        )
    finally:
        bar.close()
    gallery_sum = np.zeros(dim, dtype=np.float64)
    for a in sorted(sums):  # in gallery order
        gallery_sum += sums[a]

    config = IndexConfig(factory, model, rescore=not flat)
    faiss_dim = 0
    if not flat:
        import faiss

        folder = str(base.folder)
        empty_bytes, layout, said = _get(ray, ray.remote(train_from_base).remote(factory, folder, train_size, seed, spill))
        for message in said:
            warnings.warn(message, stacklevel=3)
        empty_ref = ray.put(empty_bytes)
        fill = ray.remote(write_shard_lists).options(max_retries=3)
        lists: dict[int, dict] = {}
        bar = progress_bar(None, progress, total=len(cuts) - 1, desc="index lists", unit="shards")
        try:
            run_tasks(
                ray,
                lambda ab: fill.remote(empty_ref, folder, ab[0], ab[1], layout, str(work / f"lists-{ab[0]}")),
                list(zip(cuts, cuts[1:])),
                lambda ab, done: lists.__setitem__(ab[0], done),
                window=2 * cpus,
                bar=bar,
            )
        finally:
            bar.close()
        order = sorted(lists)
        parts = [lists[a]["primary"] for a in order] + [lists[a]["spill"] for a in order if "spill" in lists[a]]
        ntotal = sum(int(np.load(sizes, mmap_mode="r").sum()) for _, sizes in parts)
        base.add_entry("index.faiss", write_merged(base.folder / "index.faiss", faiss.deserialize_index(empty_bytes), parts, ntotal))
        config.spill, config.spill_below, config.bias_offset = layout.spill, layout.spill_below, layout.bias_offset
        faiss_dim = layout.dim
        if plan_layout(factory, dim, columns)[1] != faiss_dim:  # pragma: no cover - train_empty lays it out so
            raise InvalidInput(f"{factory}: the trained index has dimension {faiss_dim}")
    base.write_state(stats, gallery_sum)  # the banks' values (the sink kept no per-item arrays)
    base.write_metadata(meta)
    config.build_seconds = time.perf_counter() - t0
    return base.manifest(
        version=version,
        spec=corr.spec,
        normalize=corr.normalize,
        dim=dim,
        faiss_dim=faiss_dim,
        bias_columns=columns,
        config=config,
        n=n,
        metadata=meta,
    )
