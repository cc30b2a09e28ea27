"""Saving and loading an :class:`~hubless.index.Index` as a directory, safely.

Layout (format version 2)::

    idx/
      manifest.json      format, version, method spec, FAISS factory, dims, model, search
                         defaults, and the sha256 + size of every other file
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

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import faiss
import numpy as np

from hubless._io import umask_mode
from hubless.corrections import make_correction
from hubless.engine import BankStatistics

__all__ = ["FORMAT", "VERSION", "load_index", "save_index"]

FORMAT = "hubless-index"
VERSION = 2


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_index(index, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        corr = index.correction
        faiss.write_index(index._faiss, str(tmp / "index.faiss"))
        arrays = {f"statistics.{k}": v for k, v in corr.statistics_.to_arrays().items()}
        np.savez(tmp / "correction.npz", gallery=corr.gallery_, **arrays)
        banks = {k: v for k, v in (("query_bank", index.query_bank), ("gallery_bank", index.gallery_bank)) if v is not None}
        if banks:
            np.savez(tmp / "banks.npz", **banks)
        if index.metadata is not None:
            _write_parquet(index.metadata, tmp / "metadata.parquet")
        files = {f.name: {"sha256": _sha256(f), "bytes": f.stat().st_size} for f in sorted(tmp.iterdir())}
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "method": corr.spec,
            "normalize": bool(corr.normalize),
            "factory": index.factory,
            "dim": int(corr.dim_),
            "faiss_dim": int(index._dim),
            "n_items": int(corr.n_gallery_),
            "model": index.model,
            "search": {"nprobe": index.nprobe, "ef_search": index.ef_search, "rescore": index.rescore, "rescore_factor": index.rescore_factor},
            "bias_error": getattr(index, "bias_error", None),
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


def load_index(path: str | os.PathLike, *, mmap: bool = False):
    from hubless.index.index import Index

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
        if _sha256(f) != expected["sha256"]:
            raise ValueError(f"{path}: {name} is corrupt (checksum mismatch)")
    corr = make_correction(manifest["method"]).set_params(normalize=manifest["normalize"])
    with np.load(path / "correction.npz", allow_pickle=False) as data:
        gallery = data["gallery"]
        stats = BankStatistics.from_arrays({k.removeprefix("statistics."): data[k] for k in data.files if k != "gallery"})
    expected = (int(manifest["n_items"]), int(manifest["dim"]))
    if gallery.shape != expected or stats.n_gallery != expected[0]:
        raise ValueError(f"{path}: gallery is {gallery.shape} with statistics of {stats.n_gallery} items, manifest says {expected}")
    corr._fit_arrays(gallery, stats)  # biases and gates are derived from the kept statistics
    banks = {}
    if (path / "banks.npz").is_file():
        with np.load(path / "banks.npz", allow_pickle=False) as data:
            banks = {k: data[k] for k in data.files}
    flags = faiss.IO_FLAG_MMAP if mmap else 0
    faiss_index = faiss.read_index(str(path / "index.faiss"), flags)
    if faiss_index.d != manifest["faiss_dim"] or faiss_index.ntotal != corr.n_gallery_:
        raise ValueError(f"{path}: index.faiss has d={faiss_index.d}, {faiss_index.ntotal} items; manifest says {manifest['faiss_dim']}, {corr.n_gallery_}")
    index = object.__new__(Index)
    index.correction = corr
    index.factory = manifest["factory"]
    index.query_bank = banks.get("query_bank")
    index.gallery_bank = banks.get("gallery_bank")
    index.model = manifest.get("model")
    search = manifest["search"]
    index.nprobe, index.ef_search = search["nprobe"], search["ef_search"]
    index.rescore, index.rescore_factor = search["rescore"], search["rescore_factor"]
    index.metadata = _read_parquet(path / "metadata.parquet") if (path / "metadata.parquet").is_file() else None
    index._faiss, index._dim = faiss_index, manifest["faiss_dim"]
    index._mmap = bool(mmap)
    index.build_seconds = 0.0
    index.bias_error = manifest.get("bias_error")
    return index


def _write_parquet(records: list[dict], file: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError("saving item metadata needs pyarrow: pip install 'hubless[index]'") from exc
    pq.write_table(pa.Table.from_pylist(records), file)


def _read_parquet(file: Path) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError("reading item metadata needs pyarrow: pip install 'hubless[index]'") from exc
    return pq.read_table(file).to_pylist()
