"""An IVF index of a base filled shard by shard and written as one ``index.faiss``, the driver's memory bounded.

A distributed build (:func:`hubless.distributed.build_index`) writes a base's rows from many
tasks (:mod:`hubless.index.base_files`); its IVF structure is made here, from that written base:

1. :func:`train_from_base`: the empty ``factory`` index trained on the rows a single-machine
   build trains on (:func:`~hubless.index.faiss_build.training_sample`), with the spill
   threshold of all the biases (one task);
2. :func:`write_shard_lists`: rows [a, b) of the base added to copies of it (ids = gallery
   positions; primary entries and spilled copies apart, as a build on one machine adds every
   primary entry, then the spilled copies), each list's codes and ids written to a work file
   (one task per shard);
3. :func:`write_merged`: ``index.faiss`` written by the driver, streaming those files list by
   list (about :data:`LIST_BLOCK_BYTES` of lists in memory at once), in FAISS's own layout of
   array inverted lists, so ``Index.load(mmap=True)`` maps the lists.

Why not FAISS's own merging. ``faiss.contrib.ondisk.merge_ondisk`` streams shards into
``OnDiskInvertedLists``: the index file then names a separate ``.ivfdata`` file by path
(``ilod``), a different saved format that :func:`hubless.index.disk.write_base` refuses (a
directory of the index would not be self-contained, nor its files checksummed and switched
as one). ``IndexIVF.merge_from`` / ``InvertedLists.merge_from`` move every list into one
in-memory ``ArrayInvertedLists``: the driver would hold all the codes and ids (n x
(code_size + 8) bytes: 5.2 GB for 10M items of 512 bytes). Measured (FAISS 1.15.1, 400,000 items
of IVF256,Flat over 65 dimensions in 4 shards, 102 MB of lists): merging the shard indexes with
``merge_from`` and writing the result raised the driver's peak RSS by 159 MB, :func:`write_merged`
by 5 MB, for the same bytes written. ``add_preassigned`` on the driver needs the rows
themselves (the driver never reads the gallery). FAISS serialises inverted lists
only as ``ArrayInvertedLists`` (``ilar``, written inline) or through a registered I/O hook
(``OnDiskInvertedLists``, block lists); its stacked views (``HStackInvertedLists``,
``VStackInvertedLists``, ``SliceInvertedLists``) have no hook. So :func:`write_merged` writes
the ``ilar`` layout itself, after checking that this FAISS version writes the empty trained
index's lists as expected (else it refuses, rather than writing a file FAISS cannot read).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from hubless.errors import InvalidInput
from hubless.index import disk
from hubless.index.faiss_build import (
    Layout,
    _add_preassigned,
    _nearest_lists,
    _promotion,
    _rows,
    train_empty,
    training_sample,
    with_spill,
)

__all__ = ["LIST_BLOCK_BYTES", "train_from_base", "write_merged", "write_shard_lists"]

#: Bytes of inverted lists the driver holds at once while it writes ``index.faiss``.
LIST_BLOCK_BYTES = 4 << 20
#: What FAISS writes for empty array inverted lists ("ilar", nlist, code_size, "sprs", no entries).
_EMPTY_LISTS = struct.Struct("<4sQQ4sQ")


def _base_rows(folder: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """The written base's gallery and bias columns, memory-mapped."""
    return np.load(Path(folder) / "gallery.npy", mmap_mode="r"), np.load(Path(folder) / "bias.npy", mmap_mode="r")


def train_from_base(factory: str, folder: str | os.PathLike, train_size: int, seed: int, spill: float | None):
    """The empty ``factory`` index trained on the rows a single-machine build trains on, read
    from the base written in ``folder``, and its layout with the spill threshold of all the
    biases: ``(serialised index, layout, training warnings)``."""
    import warnings

    import faiss

    gallery, bias = _base_rows(folder)
    n = gallery.shape[0]
    sample = training_sample(n, train_size, seed)
    unit = np.ascontiguousarray(gallery[sample])
    with warnings.catch_warnings(record=True) as caught:  # said again by the driver, to the user
        warnings.simplefilter("always")
        empty, layout = train_empty(factory, n, unit, np.hstack([unit, bias[sample]]), seed=seed)
    layout = with_spill(empty, layout, np.asarray(bias), spill)
    return faiss.serialize_index(empty), layout, [str(w.message) for w in caught]


def write_shard_lists(empty: np.ndarray, folder: str | os.PathLike, start: int, stop: int, layout: Layout, out: str) -> dict:
    """Rows [start, stop) of the base written in ``folder`` added to copies of the trained
    ``empty`` index (ids = gallery positions), primary lists and spilled copies apart; each
    kind's lists go to ``out.<kind>`` (per list: its codes, then its ids) and
    ``out.<kind>.sizes.npy``. Returns ``{kind: (lists file, sizes file)}``."""
    import faiss

    gallery, bias = _base_rows(folder)
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


def write_merged(path: Path, empty_index, parts: list[tuple[str, str]], ntotal: int) -> dict:
    """Write ``path``: the trained ``empty_index`` holding ``ntotal`` entries whose lists are the
    concatenation, list by list, of ``parts`` (lists files and their sizes, in order, from
    :func:`write_shard_lists`), in FAISS's layout of array inverted lists ("ilar", "full" sizes,
    then each non-empty list's codes and ids). Streamed: at most ~:data:`LIST_BLOCK_BYTES` of
    lists in memory. Returns the file's manifest entry ``{"sha256", "bytes"}``."""
    import faiss

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

    return disk._write_file(path, write)
