"""Build a corrected index on Ray straight into an index directory: the driver holds no gallery.

    import hubless.distributed as hd
    index = hd.build_index("nnn:alpha=0.75,k=16", "img_emb/", "text_emb/", "IVF4096,Flat", out="idx/")

The result is a live index directory (:mod:`hubless.index.disk`, format 5) written as one base
``b000001/`` by the tasks, and one ``CURRENT`` written by the driver:

1. The bank statistics, tile by tile (:func:`hubless.distributed.fit_statistics`); each
   finished gallery shard's per-item statistics go to a checksummed work file, so the driver
   keeps only the banks' global values (sizes, means, activation sets).
2. The driver creates the base's row files at their full size (``gallery.npy``, ``ids.npy``,
   ``bias.npy``, ``stat.NAME.npy``: plain ``.npy`` headers, sparse bodies); one task per gallery
   shard [a, b) reads its rows, computes their biases from their statistics
   (:meth:`~hubless.corrections.AdditiveCorrection.row_bias`: every bias is row-local) and
   writes rows a..b of each file in place, returning the float64 sum of its rows.
3. IVF: one task trains the empty index on the same sample a single-machine build uses
   (:func:`hubless.index.faiss_build.training_sample`, read from the written base), with the
   spill threshold of all the biases; then one task per shard fills copies of it with its rows
   (ids = gallery positions; primary lists and spilled copies apart) and writes each list's
   codes and ids to a work file. The driver writes ``index.faiss`` by streaming those files
   list by list, a few MB at a time, in FAISS's own layout of array inverted lists (each list
   holds its items in gallery order, the spilled copies after them, as one build on one
   machine adds them), so ``Index.load(mmap=True)`` maps the lists.
4. The driver hashes every file (streamed), writes ``state.npz`` (bank values and the sum of the
   shards' sums), the metadata, and commits ``CURRENT``: the directory loads and searches as
   ``Index.build`` on the same data does (same top-k ids, tested for Flat and IVF).

An HNSW graph cannot be built from shards built apart, nor a plain PQ index filled this way:
use ``Index.build`` on one machine for those (or IVF ... ,PQ beyond one machine).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import tempfile
import time
import uuid
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hubless.corrections import Correction, make_additive
from hubless.distributed.cluster import _get, check_address, connect, run_tasks
from hubless.distributed.plan import GALLERY_ROWS, cut_points
from hubless.errors import InvalidInput
from hubless.io.sources import EmbeddingSource

__all__ = ["build_index"]

#: Bytes of inverted lists the driver holds at once while it writes ``index.faiss``.
LIST_BLOCK_BYTES = 4 << 20
#: What FAISS writes for empty array inverted lists ("ilar", nlist, code_size, "sprs", no entries).
_EMPTY_LISTS = struct.Struct("<4sQQ4sQ")


# ---------------------------------------------------------------------------------- .npy in place
def _create_npy(path: Path, shape: tuple, dtype) -> int:
    """A ``.npy`` file of ``shape``/``dtype`` with its header written and its body unwritten
    (sparse); returns the offset of the body."""
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(
            fh, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
        )
        offset = fh.tell()
        fh.truncate(offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)
    return offset


def _write_rows(path: str, offset: int, start: int, values: np.ndarray) -> None:
    """Write ``values`` as rows ``start, start + 1, ...`` of the ``.npy`` at ``path`` in place, fsynced."""
    values = np.ascontiguousarray(values)
    row_bytes = values.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))
    fd = os.open(path, os.O_WRONLY)
    try:
        view, at = values.data.cast("B"), offset + start * row_bytes
        while view.nbytes:
            done = os.pwrite(fd, view, at)
            view, at = view[done:], at + done
        os.fsync(fd)
    finally:
        os.close(fd)


def _shard_rows(spec: str, gallery: EmbeddingSource, start: int, stop: int, shared: dict, rows_files: list, files: dict) -> np.ndarray:
    """One Ray task: gallery rows [start, stop) (normalised as the correction says), their ids,
    bias columns and per-item statistics written in place into the base's files (``files``:
    name -> (path, body offset)); returns the float64 sum of the rows."""
    from hubless.distributed.augment import _rows_statistics
    from hubless.index.live import split_statistics

    corr = make_additive(spec)
    rows = gallery.read(start, stop, normalize=corr.normalize)
    stats = _rows_statistics(shared, rows_files, start, stop)
    values = {"gallery.npy": rows, "ids.npy": np.arange(start, stop, dtype=np.int64), "bias.npy": corr.row_bias(rows, stats)}
    per_row, _ = split_statistics(stats.restricted(corr.statistics_request()))
    values.update({f"stat.{name}.npy": v for name, v in per_row.items()})
    for name, (path, offset) in files.items():
        _write_rows(path, offset, start, values[name])
    return rows.sum(axis=0, dtype=np.float64)


# ---------------------------------------------------------------------------------- IVF
def _train(factory: str, folder: str, train_size: int, seed: int, spill: float | None):
    """One Ray task: the empty ``factory`` index trained on the rows a single-machine build
    trains on, read from the written base, and its layout with the spill threshold of all the
    biases: ``(serialised index, layout, training warnings)``."""
    import warnings

    import faiss

    from hubless.index.faiss_build import train_empty, training_sample, with_spill

    gallery = np.load(Path(folder) / "gallery.npy", mmap_mode="r")
    bias = np.load(Path(folder) / "bias.npy", mmap_mode="r")
    n = gallery.shape[0]
    sample = training_sample(n, train_size, seed)
    unit = np.ascontiguousarray(gallery[sample])
    with warnings.catch_warnings(record=True) as caught:  # said again by the driver, to the user
        warnings.simplefilter("always")
        empty, layout = train_empty(factory, n, unit, np.hstack([unit, bias[sample]]), seed=seed)
    layout = with_spill(empty, layout, np.asarray(bias), spill)
    return faiss.serialize_index(empty), layout, [str(w.message) for w in caught]


def _fill_lists(empty: np.ndarray, folder: str, start: int, stop: int, layout, out: str) -> dict:
    """One Ray task: rows [start, stop) of the written base added to copies of the trained empty
    index (ids = gallery positions), primary lists and spilled copies apart (a build on one
    machine adds every primary entry, then the spilled copies); each kind's lists go to
    ``out.<kind>`` (per list: its codes, then its ids) and ``out.<kind>.sizes.npy``.
    Returns ``{kind: (lists file, sizes file)}``."""
    import faiss

    from hubless.index.faiss_build import _add_preassigned, _nearest_lists, _promotion, _rows

    gallery = np.load(Path(folder) / "gallery.npy", mmap_mode="r")
    bias = np.load(Path(folder) / "bias.npy", mmap_mode="r")
    unit = np.ascontiguousarray(gallery[start:stop])
    rows = _rows(unit, np.hstack([unit, bias[start:stop]]), layout)
    trained = faiss.deserialize_index(empty)  # kept referenced: the IVF inside is its object
    ivf = faiss.extract_index_ivf(trained)
    spill = layout.spill_below is not None and ivf.nlist > 1
    lists = _nearest_lists(ivf.quantizer.reconstruct_n(0, ivf.nlist), unit, 2 if spill else 1)
    ids = np.arange(start, stop, dtype=np.int64)
    kinds = {"primary": (rows, lists[:, 0], ids)}
    if spill:
        chosen = np.flatnonzero(_promotion(rows[:, layout.bias_offset :]) <= layout.spill_below)
        kinds["spill"] = (rows[chosen], lists[chosen, 1], ids[chosen])
    written = {}
    for kind, (x, assign, item_ids) in kinds.items():
        whole = faiss.deserialize_index(empty)
        part = faiss.extract_index_ivf(whole)
        if x.shape[0]:
            _add_preassigned(part, x, assign, item_ids)
        invlists = part.invlists
        sizes = np.array([invlists.list_size(i) for i in range(part.nlist)], dtype=np.int64)
        file = f"{out}.{kind}"
        with open(file, "wb") as fh:
            for i in np.flatnonzero(sizes):
                size = int(sizes[i])
                fh.write(faiss.rev_swig_ptr(invlists.get_codes(int(i)), size * invlists.code_size).tobytes())
                fh.write(faiss.rev_swig_ptr(invlists.get_ids(int(i)), size).tobytes())
            fh.flush()
            os.fsync(fh.fileno())
        np.save(f"{file}.sizes.npy", sizes)
        written[kind] = (file, f"{file}.sizes.npy")
    return written


def _write_ivf(path: Path, empty_index, parts: list[tuple[str, str]], ntotal: int) -> dict:
    """Write ``path``: the trained ``empty_index`` holding ``ntotal`` entries whose lists are the
    concatenation, list by list, of ``parts`` (lists files and their sizes, in order), in
    FAISS's layout of array inverted lists ("ilar", "full" sizes, then each non-empty list's
    codes and ids). Streamed: at most ~:data:`LIST_BLOCK_BYTES` of lists in memory. Returns the
    file's ``{"sha256", "bytes"}``."""
    import faiss

    from hubless.index.disk import _write_file

    ivf = faiss.extract_index_ivf(empty_index)
    nlist, code_size = int(ivf.nlist), int(ivf.code_size)
    ivf.ntotal = empty_index.ntotal = ntotal
    raw = faiss.serialize_index(empty_index).tobytes()
    tail = raw[-_EMPTY_LISTS.size :]
    if ivf.invlists.compute_ntotal() != 0 or tail != _EMPTY_LISTS.pack(b"ilar", nlist, code_size, b"sprs", 0):
        raise InvalidInput(f"this FAISS version writes {type(empty_index).__name__} in a layout hubless cannot fill in place")
    totals = np.zeros(nlist, dtype=np.int64)
    for _, sizes_file in parts:
        totals += np.load(sizes_file)
    entry = code_size + 8
    block = max(1, min(nlist, int(LIST_BLOCK_BYTES * nlist // max(1, int(totals.sum()) * entry))))

    def write(sink) -> None:
        sink.write(raw[: -_EMPTY_LISTS.size])
        sink.write(struct.pack("<4sQQ4sQ", b"ilar", nlist, code_size, b"full", nlist))
        sink.write(totals.astype("<u8").tobytes())
        handles = [open(file, "rb") for file, _ in parts]  # each read in order, block after block
        try:
            for l0 in range(0, nlist, block):
                l1 = min(nlist, l0 + block)
                pieces = []
                for (_, sizes_file), fh in zip(parts, handles):
                    sizes = np.load(sizes_file, mmap_mode="r")[l0:l1].astype(np.int64)
                    data = fh.read(int(sizes.sum()) * entry)
                    starts = np.concatenate([[0], np.cumsum(sizes * entry)])
                    pieces.append((sizes, data, starts))
                for j in range(l1 - l0):  # a loop over lists, not items
                    if totals[l0 + j] == 0:
                        continue
                    for sizes, data, starts in pieces:  # the codes of every part, then their ids
                        sink.write(data[starts[j] : starts[j] + sizes[j] * code_size])
                    for sizes, data, starts in pieces:
                        sink.write(data[starts[j] + sizes[j] * code_size : starts[j + 1]])
        finally:
            for fh in handles:
                fh.close()

    return _write_file(path, write)


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
    from hubless.index.config import IndexConfig
    from hubless.index.factory import check_factory
    from hubless.index.faiss_build import default_factory, plan_layout
    from hubless.index.index import _check_target, _is_flat, _next_number
    from hubless.index.live import split_statistics
    from hubless.index.lock import lock_path, write_lock
    from hubless.index.metadata import Metadata
    from hubless.io.workfiles import job_id
    from hubless.progress import progress_bar

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
    flat = _is_flat(factory)
    if not flat and not factory.startswith("IVF"):
        raise InvalidInput(f"{factory}: a distributed build writes Flat and IVF indexes; build {factory} with Index.build on one machine")
    corr.check_sizes(n, *(None if s is None else s.n_rows for s in (qb, gb)))
    meta = None if metadata is None else Metadata.from_records(metadata, n)  # counts, keys and types checked before the fit
    if out is not None:
        _check_target(Path(out), overwrite)
    path = Path(tempfile.mkdtemp(prefix="hubless-index-")) if out is None else Path(out)
    request = corr.statistics_request()
    cuts = cut_points(n, shard_rows, "shard_rows")
    with write_lock(path):
        if out is not None:
            _check_target(path, overwrite)  # another writer may have created it meanwhile
        created = out is None or not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        previous, _ = pointer.read_manifest(path) if pointer.is_index(path) else (None, None)
        version = _next_number(path, previous)
        folder = path / f"b{version:06d}"
        work = path / f".tmp-build-{uuid.uuid4().hex}"  # a leftover of a killed build is removed by the next commit
        try:
            folder.mkdir()
            work.mkdir()
            job = job_id({"spec": corr.spec, "gallery": source.fingerprint(), "build": work.name})
            from hubless.distributed.augment import _fit_to_row_files, _rows_statistics

            stats, files_for = _fit_to_row_files(
                request, source, qb, gb, work, job, normalize=corr.normalize, address=address, progress=progress, **fit_options
            )
            shared = stats.to_arrays()
            # the base's row files at full size, from what one row's statistics and bias look like

            first = _rows_statistics(shared, files_for(0, 1), 0, 1)
            first_rows = source.read(0, 1, normalize=corr.normalize)
            columns = corr.row_bias(first_rows, first).shape[1]
            per_row, _ = split_statistics(first.restricted(request))
            shapes: dict[str, tuple[tuple[int, ...], Any]] = {
                "gallery.npy": ((n, dim), np.float32),
                "ids.npy": ((n,), np.int64),
                "bias.npy": ((n, columns), np.float32),
            }
            shapes.update({f"stat.{k}.npy": ((n, *v.shape[1:]), v.dtype) for k, v in per_row.items()})
            files = {name: (str(folder / name), _create_npy(folder / name, shape, dtype)) for name, (shape, dtype) in shapes.items()}

            ray = connect(address)
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            source_ref, shared_ref = ray.put(source), ray.put(shared)  # once in the object store
            task = ray.remote(_shard_rows).options(max_retries=3)
            sums: dict[int, np.ndarray] = {}
            bar = progress_bar(None, progress, total=len(cuts) - 1, desc="index rows", unit="shards")
            try:
                run_tasks(
                    ray, lambda ab: task.remote(corr.spec, source_ref, ab[0], ab[1], shared_ref, files_for(*ab), files),
                    list(zip(cuts, cuts[1:])), lambda ab, total: sums.__setitem__(ab[0], np.array(total)), window=2 * cpus, bar=bar,
                )  # fmt: skip
            finally:
                bar.close()
            gallery_sum = np.zeros(dim, dtype=np.float64)
            for a in sorted(sums):  # in gallery order
                gallery_sum += sums[a]

            config = IndexConfig(factory, model, rescore=not flat)
            faiss_dim = 0
            entries = {}
            if not flat:
                import faiss

                empty_bytes, layout, said = _get(ray, ray.remote(_train).remote(factory, str(folder), train_size, seed, spill))
                for message in said:
                    warnings.warn(message, stacklevel=2)
                empty_ref = ray.put(empty_bytes)
                fill = ray.remote(_fill_lists).options(max_retries=3)
                lists: dict[int, dict] = {}
                bar = progress_bar(None, progress, total=len(cuts) - 1, desc="index lists", unit="shards")
                try:
                    run_tasks(
                        ray, lambda ab: fill.remote(empty_ref, str(folder), ab[0], ab[1], layout, str(work / f"lists-{ab[0]}")),
                        list(zip(cuts, cuts[1:])), lambda ab, done: lists.__setitem__(ab[0], done), window=2 * cpus, bar=bar,
                    )  # fmt: skip
                finally:
                    bar.close()
                order = sorted(lists)
                parts = [lists[a]["primary"] for a in order] + [lists[a]["spill"] for a in order if "spill" in lists[a]]
                ntotal = sum(int(np.load(sizes, mmap_mode="r").sum()) for _, sizes in parts)
                entries["index.faiss"] = _write_ivf(folder / "index.faiss", faiss.deserialize_index(empty_bytes), parts, ntotal)
                config.spill, config.spill_below, config.bias_offset = layout.spill, layout.spill_below, layout.bias_offset
                faiss_dim = layout.dim
                if plan_layout(factory, dim, columns)[1] != faiss_dim:  # pragma: no cover - train_empty lays it out so
                    raise InvalidInput(f"{factory}: the trained index has dimension {faiss_dim}")

            def digest(name: str) -> tuple[str, dict]:
                h, size = hashlib.sha256(), 0
                with open(folder / name, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                        size += len(chunk)
                return name, {"sha256": h.hexdigest(), "bytes": size}

            with ThreadPoolExecutor(min(len(files), 4)) as pool:  # hashing releases the GIL
                entries.update(pool.map(digest, files))
            state: dict[str, Any] = disk.state_arrays(stats, gallery_sum)  # the banks' values (the sink kept no per-item arrays)
            entries["state.npz"] = disk._write_file(folder / "state.npz", lambda fh: np.savez(fh, **state))
            if meta is not None and meta.schema.names:
                from hubless.errors import optional_import

                pq = optional_import("pyarrow.parquet", "saving item metadata", "index", "pyarrow")
                entries["metadata.parquet"] = disk._write_file(folder / "metadata.parquet", lambda fh: pq.write_table(meta.table, fh))
            disk._fsync_dir(folder)
            config.build_seconds = time.perf_counter() - t0
            manifest = {
                "version": version, "method": corr.spec, "normalize": bool(corr.normalize), "dim": dim, "faiss_dim": faiss_dim,
                "bias_columns": int(columns), "config": config.to_dict(), "next_id": n, "n_items": n, "n_rows": n,
                "metadata_schema": None if meta is None else meta.schema_text(),
                "base": {"name": folder.name, "rows": n, "files": {name: entries[name] for name in sorted(entries)}},
                "segments": [],
            }  # fmt: skip
            disk.commit(path, manifest, keep=pointer.names_in(previous))
        except BaseException:
            if created:  # a failed build leaves no directory behind
                shutil.rmtree(path, ignore_errors=True)
            else:
                shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    if out is not None:
        return Index.load(path, mmap=True) if load else path
    try:
        return Index.load(path).detach()  # read whole, then in memory (as Index.build gives): the directory goes
    finally:
        shutil.rmtree(path, ignore_errors=True)
        lock_path(path).unlink(missing_ok=True)
