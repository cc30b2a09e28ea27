"""Saving and loading an :class:`~hubless.index.Index` as a directory, safely.

Layout (format version 3)::

    idx/
      manifest.json      format, version, method spec, dims, the index config (FAISS
                         factory, model, search defaults; see IndexConfig) and the sha256
                         + size of every other file
      index.faiss        the FAISS index over [r, bias(r)]
      correction.npz     the gallery and the bank statistics the correction keeps (top-k,
                         log-sum-exps, activation top-k, means), from which its biases and
                         gates are derived on load and kept current by add/remove
      banks.npz          the reference banks, so ``add`` can compute new biases (optional)
      metadata.parquet   per-item metadata (optional; needs pyarrow)

A save writes everything into a temporary sibling directory, fsyncs, then renames it into place
(replacing an existing index only with ``overwrite=True``, and only once the new one is
complete), so an interrupted save leaves the previous index untouched. A load checks the
format version and every checksum before reading, and names the damaged file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

from hubless._io import file_sha256, umask_mode
from hubless.corrections import Correction, make_correction
from hubless.engine import BankStatistics
from hubless.errors import MissingDependencyError
from hubless.index.config import IndexConfig

__all__ = ["FORMAT", "VERSION", "SavedIndex", "load_index", "save_index"]

FORMAT = "hubless-index"
VERSION = 3


@dataclass
class SavedIndex:
    """What :func:`load_index` reads: the parts an :class:`~hubless.index.Index` is made of."""

    correction: Correction
    config: IndexConfig
    faiss_index: object
    faiss_dim: int
    banks: dict[str, np.ndarray]
    metadata: list[dict] | None


def save_index(
    path: str | os.PathLike,
    *,
    faiss_index,
    faiss_dim: int,
    correction: Correction,
    config: IndexConfig,
    banks: dict[str, np.ndarray | None],
    metadata: list[dict] | None,
    overwrite: bool = False,
) -> Path:
    """Write an index's parts to the directory ``path`` atomically (see the module docstring)."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        corr = correction
        faiss.write_index(faiss_index, str(tmp / "index.faiss"))
        arrays = {f"statistics.{k}": v for k, v in corr.statistics_.to_arrays().items()}
        np.savez(tmp / "correction.npz", gallery=corr.gallery_, **arrays)
        banks = {k: v for k, v in banks.items() if v is not None}
        if banks:
            np.savez(tmp / "banks.npz", **banks)
        if metadata is not None:
            _write_parquet(metadata, tmp / "metadata.parquet")
        files = {f.name: {"sha256": file_sha256(f), "bytes": f.stat().st_size} for f in sorted(tmp.iterdir())}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "method": corr.spec,
            "normalize": bool(corr.normalize),
            "dim": int(corr.dim_),
            "faiss_dim": int(faiss_dim),
            "n_items": int(corr.n_gallery_),
            "config": config.to_dict(),
            "files": files,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        os.chmod(tmp, umask_mode(0o777))
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def load_index(path: str | os.PathLike, *, mmap: bool = False) -> SavedIndex:
    """Read the parts of an index saved by :func:`save_index`, verifying version and checksums."""
    path = Path(path)
    manifest_file = path / "manifest.json"
    if not manifest_file.is_file():
        raise FileNotFoundError(f"{path} is not a hubless index (no manifest.json)")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{manifest_file} is corrupt: {exc}") from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path} is not a hubless index (format {manifest.get('format')!r})")
    if manifest.get("version") != VERSION:
        raise ValueError(f"{path} has index format version {manifest.get('version')}; this hubless reads version {VERSION}")
    for name, expected in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise ValueError(f"{path}: {name} is missing")
        if f.stat().st_size != expected["bytes"]:
            raise ValueError(f"{path}: {name} is truncated or altered ({f.stat().st_size} bytes, expected {expected['bytes']})")
        if file_sha256(f) != expected["sha256"]:
            raise ValueError(f"{path}: {name} is corrupt (checksum mismatch)")
    corr = make_correction(manifest["method"]).set_params(normalize=manifest["normalize"])
    with np.load(path / "correction.npz", allow_pickle=False) as data:
        gallery = data["gallery"]
        stats = BankStatistics.from_arrays({k.removeprefix("statistics."): data[k] for k in data.files if k != "gallery"})
    expected = (int(manifest["n_items"]), int(manifest["dim"]))
    if gallery.shape != expected or stats.n_gallery != expected[0]:
        raise ValueError(f"{path}: gallery is {gallery.shape} with statistics of {stats.n_gallery} items, manifest says {expected}")
    corr.fit_from_statistics(gallery, stats)  # biases and gates are derived from the kept statistics
    banks = {}
    if (path / "banks.npz").is_file():
        with np.load(path / "banks.npz", allow_pickle=False) as data:
            banks = {k: data[k] for k in data.files}
    flags = faiss.IO_FLAG_MMAP if mmap else 0
    faiss_index = faiss.read_index(str(path / "index.faiss"), flags)
    if faiss_index.d != manifest["faiss_dim"] or faiss_index.ntotal != corr.n_gallery_:
        raise ValueError(
            f"{path}: index.faiss has d={faiss_index.d}, {faiss_index.ntotal} items; manifest says {manifest['faiss_dim']}, {corr.n_gallery_}"
        )
    metadata = _read_parquet(path / "metadata.parquet") if (path / "metadata.parquet").is_file() else None
    return SavedIndex(corr, IndexConfig.from_dict(manifest["config"]), faiss_index, int(manifest["faiss_dim"]), banks, metadata)


def _write_parquet(records: list[dict], file: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError("saving item metadata", "pyarrow", "index") from exc
    pq.write_table(pa.Table.from_pylist(records), file)


def _read_parquet(file: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingDependencyError("reading item metadata", "pyarrow", "index") from exc
    return pq.read_table(file).to_pylist()
