"""A base of an index directory written piece by piece, by many processes at once: :class:`BaseFiles`.

:func:`hubless.index.disk.write_base` writes a base from one snapshot held in memory; a build
spread over processes (:func:`hubless.distributed.build_index`) holds no such snapshot: the
driver never reads the gallery. It writes the same base (the files and manifest of
:mod:`hubless.index.disk`, format 5) through this module instead:

1. :meth:`BaseFiles.create`: the base's row files (``gallery.npy``, ``ids.npy``, ``bias.npy``,
   ``stat.NAME.npy``) made at their full size: plain ``.npy`` headers, sparse bodies;
2. :func:`write_rows` (in any process that sees the directory): rows [a, b) of each file
   written in place, fsynced;
3. :meth:`BaseFiles.write_state` (the banks' values and the sum of the rows),
   :meth:`BaseFiles.write_metadata` and the IVF structure (:mod:`hubless.index.ivf_lists`);
4. :meth:`BaseFiles.manifest`: every file hashed (streamed), the folder fsynced, and the
   manifest to commit (:func:`hubless.index.disk.commit`, inside
   :func:`hubless.index.directory.new_base`).
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from hubless.engine import BankStatistics
from hubless.errors import optional_import
from hubless.index import disk
from hubless.index.config import IndexConfig
from hubless.index.metadata import Metadata

__all__ = ["BaseFiles", "write_rows"]


class BaseFiles:
    """The base ``b{version}`` of the index directory ``path``, written piece by piece (see the
    module docstring). ``files``: each row file's ``(path, body offset)``, what
    :func:`write_rows` takes (plain values: it can be sent to other processes)."""

    def __init__(self, path: Path, version: int) -> None:
        self.folder = Path(path) / f"b{version:06d}"
        self.folder.mkdir()
        self.files: dict[str, tuple[str, int]] = {}
        self.entries: dict[str, dict] = {}

    def create(self, n: int, dim: int, bias_columns: int, statistics: dict[str, np.ndarray]) -> dict[str, tuple[str, int]]:
        """Make the row files of ``n`` items of ``dim`` dimensions and ``bias_columns`` bias
        columns, and one per per-row statistics array (``statistics``: name -> the array of
        some rows, for its shape and type); returns :attr:`files`."""
        shapes: dict[str, tuple[tuple[int, ...], Any]] = {
            "gallery.npy": ((n, dim), np.float32),
            "ids.npy": ((n,), np.int64),
            "bias.npy": ((n, bias_columns), np.float32),
        }
        shapes.update({f"stat.{name}.npy": ((n, *v.shape[1:]), v.dtype) for name, v in statistics.items()})
        for name, (shape, dtype) in shapes.items():
            self.files[name] = (str(self.folder / name), _create_npy(self.folder / name, shape, dtype))
        return self.files

    def write_state(self, bank: BankStatistics, gallery_sum: np.ndarray) -> None:
        """``state.npz``: the banks' sizes, means and activation sets, and the float64 sum of the rows."""
        state: dict[str, Any] = disk.state_arrays(bank, gallery_sum)
        self.entries["state.npz"] = disk._write_file(self.folder / "state.npz", lambda fh: np.savez(fh, **state))

    def write_metadata(self, meta: Metadata | None) -> None:
        """``metadata.parquet`` (nothing for no metadata, or metadata without keys)."""
        if meta is not None and meta.schema.names:
            pq = optional_import("pyarrow.parquet", "saving item metadata", "index", "pyarrow")
            self.entries["metadata.parquet"] = disk._write_file(self.folder / "metadata.parquet", lambda fh: pq.write_table(meta.table, fh))

    def add_entry(self, name: str, entry: dict) -> None:
        """A file written into the folder by another writer (``index.faiss``), with its ``{"sha256", "bytes"}``."""
        self.entries[name] = entry

    def manifest(
        self,
        *,
        version: int,
        spec: str,
        normalize: bool,
        dim: int,
        faiss_dim: int,
        bias_columns: int,
        config: IndexConfig,
        n: int,
        metadata: Metadata | None,
    ) -> dict:
        """Hash the row files (streamed, on threads), fsync the folder, and return the manifest
        naming this base (:func:`hubless.index.disk.manifest_fields`, for ``n``
        items with ids 0..n-1 and no segments)."""

        def digest(name: str) -> tuple[str, dict]:
            h, size = hashlib.sha256(), 0
            with open(self.folder / name, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
                    size += len(chunk)
            return name, {"sha256": h.hexdigest(), "bytes": size}

        with ThreadPoolExecutor(min(len(self.files), 4)) as pool:  # hashing releases the GIL
            self.entries.update(pool.map(digest, self.files))
        disk._fsync_dir(self.folder)
        base = {"name": self.folder.name, "rows": n, "files": {name: self.entries[name] for name in sorted(self.entries)}}
        return disk.manifest_fields(
            version=version,
            spec=spec,
            normalize=normalize,
            dim=dim,
            faiss_dim=faiss_dim,
            bias_columns=bias_columns,
            config=config,
            next_id=n,
            n_items=n,
            n_rows=n,
            metadata=metadata,
            base=base,
            segments=[],
        )


def write_rows(files: dict[str, tuple[str, int]], start: int, rows: np.ndarray, bias: np.ndarray, statistics: dict) -> None:
    """Write items ``start, start + 1, ...`` into a base's row files (``files``:
    :attr:`BaseFiles.files`) in place: their ``rows`` (as the index stores them), ids (their
    gallery positions), ``bias`` columns and per-row ``statistics`` (name -> array)."""
    values = {"gallery.npy": rows, "ids.npy": np.arange(start, start + rows.shape[0], dtype=np.int64), "bias.npy": bias}
    values.update({f"stat.{name}.npy": v for name, v in statistics.items()})
    for name, (path, offset) in files.items():
        _write_in_place(path, offset, start, values[name])


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


def _write_in_place(path: str, offset: int, start: int, values: np.ndarray) -> None:
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
