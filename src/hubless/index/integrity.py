"""Checking a saved index as a load and a search read it (``hubless index verify``): every file
of the current version against its recorded size and sha256 (what a memory-mapped load skips),
the version loaded as a mapped load reads it, and the FAISS structure searched
(:func:`check_faiss`)."""

from __future__ import annotations

import os
from pathlib import Path

import faiss
import numpy as np

from hubless._atomic import file_sha256
from hubless.errors import Corrupt
from hubless.index.faiss_build import stored_rows
from hubless.index.live import Snapshot
from hubless.index.pointer import VERSION, check_index_dir, read_manifest
from hubless.index.reading import load, parsing

__all__ = ["check_faiss", "verify"]


def verify(path: str | os.PathLike) -> dict:
    """Check what a load and a search read: every file of the current version against its
    recorded size and sha256 (what a memory-mapped load skips), then the version loaded as a
    mapped load reads it, then the FAISS structure as a search reads it (its lists or graph in
    the file itself, every stored row's id a row of the base, a search of a few base rows
    answered with rows of the base; :func:`check_faiss`). Returns ``{"files", "bytes",
    "items", "faiss"}``. Damage is a :class:`~hubless.errors.Corrupt` naming the file and what
    is wrong with it."""
    path = check_index_dir(Path(path))
    manifest, _ = read_manifest(path)
    base = manifest["base"]
    checked = total = 0
    entries = [(f"{base['name']}/{name}", path / base["name"] / name, entry) for name, entry in base["files"].items()]
    entries += [(s["name"], path / s["name"], s) for s in manifest["segments"]]
    for label, file, entry in entries:
        if not file.is_file():
            raise Corrupt(f"{path}: {label} is missing")
        if file.stat().st_size != entry["bytes"]:
            raise Corrupt(f"{path}: {label} is truncated or altered (size differs from the manifest)")
        if file_sha256(file) != entry["sha256"]:
            raise Corrupt(f"{path}: {label} is corrupt (checksum mismatch)")
        checked += 1
        total += entry["bytes"]
    loaded = load(path, mmap=True)
    base_snap = loaded.base if loaded.base is not None else loaded.snapshot
    faiss_text = None
    if base_snap.faiss is not None:
        faiss_text = check_faiss(base_snap, path, f"{base['name']}/index.faiss")
    return {"files": checked, "bytes": total, "items": loaded.snapshot.n_alive, "format": VERSION, "faiss": faiss_text}


def check_faiss(snap: Snapshot, root: Path, label: str, *, probes: int = 8) -> str:
    """Check a base's FAISS structure as a search reads it: its data in the file itself (not
    lists of another file: ``OnDiskInvertedLists``), as many stored entries as the base needs,
    every entry's id a row of the base, and ``probes`` base rows searched (every list probed)
    answered with finite scores and rows of the base. Returns a description ("IVF: 8 lists,
    700 entries"); a Corrupt naming ``label`` (the file, under the index ``root``) and saying what
    is wrong."""
    from hubless.index.faiss_build import _hnsw, _ivf, search_parameters, search_rows, self_contained

    what = f"{root}: {label}"
    index, n = snap.faiss, snap.n_base
    expect = stored_rows(snap.bias, snap.config.spill_below)
    if not self_contained(index):
        raise Corrupt(f"{what} keeps its inverted lists in another file (OnDiskInvertedLists): a load cannot read them")
    if index.ntotal != expect:
        raise Corrupt(f"{what} holds {index.ntotal} entries; the base's {n} items need {expect}")
    ivf, text = _ivf(index), type(faiss.downcast_index(index)).__name__
    if ivf is not None:
        lists = ivf.invlists
        sizes = np.array([lists.list_size(i) for i in range(ivf.nlist)], dtype=np.int64)
        if sizes.sum() != expect:
            raise Corrupt(f"{what}: its {ivf.nlist} inverted lists hold {int(sizes.sum())} entries; the base needs {expect}")
        for i in np.flatnonzero(sizes):
            ids = faiss.rev_swig_ptr(lists.get_ids(int(i)), int(sizes[i]))
            bad = (ids < 0) | (ids >= n)
            if bad.any():
                raise Corrupt(f"{what}: inverted list {int(i)} holds id {int(ids[bad][0])}, not a row of the base's {n} items")
        text = f"IVF: {ivf.nlist} lists, {expect} entries"
    elif _hnsw(index) is not None:
        hnsw = _hnsw(index)
        if faiss.downcast_index(hnsw.storage).ntotal != index.ntotal:
            raise Corrupt(f"{what}: its HNSW graph and its stored vectors differ in size")
        text = f"HNSW: {index.ntotal} nodes"
    rows = np.linspace(0, n - 1, num=min(probes, n)).astype(np.int64)
    knob = ivf.nlist if ivf is not None else 64
    params = search_parameters(index, nprobe=knob, ef_search=knob)
    zeros = np.zeros((rows.size, snap.bias.shape[1]), np.float32)
    with parsing(root, label):
        scores, found = search_rows(index, np.ascontiguousarray(snap.gather(rows)), zeros, 1, params, snap.layout)
    hit = found[:, 0]
    if ((hit < 0) | (hit >= n)).any() or not np.isfinite(scores[:, 0]).all():
        raise Corrupt(f"{what}: a search of {rows.size} of the base's rows did not answer rows of the base")
    return text
