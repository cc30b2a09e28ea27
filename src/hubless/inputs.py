"""Every input file hubless reads, with the same formats and clear errors everywhere.

* Embeddings: ``load_array`` returns a stored array (.npy memory-mapped when possible, .npz
  entries, clip-retrieval output folders); ``load_embeddings`` also validates it as (n, d) float
  embeddings (see :func:`hubless._validation.as_embeddings`).
* Tables of per-row records (item metadata, fairness attributes): :func:`read_records` reads
  .parquet, .csv, .tsv, .json (a list of objects, or the ``OUT.meta.json`` of ``hubless
  embed``: its items, without their ``index`` in the embedded list) and .txt (one value per line,
  as ``{"item": line}``).
* Items, one string per row (texts to embed, what a reranker reads, query texts):
  :func:`read_items` reads .txt (one per line), a .json list of strings, an ``OUT.meta.json``
  (its paths or texts), or one column of a table.
* Item ids: :func:`read_ids` reads "3,17,42", a .npy of integers or a .txt of them.
"""

from __future__ import annotations

import csv
import json
import os
import tokenize
import zipfile
from pathlib import Path

import numpy as np

from hubless._validation import as_embeddings
from hubless.errors import InvalidInput, MissingFile, NotFound
from hubless.storage.arrays import CLIP_RETRIEVAL, check_npy, is_clip_retrieval, split_key

__all__ = ["load_array", "load_clip_retrieval", "load_embeddings", "read_ids", "read_items", "read_records"]

#: Table formats :func:`read_records` reads.
TABLE_SUFFIXES = (".parquet", ".csv", ".tsv", ".json", ".txt")
#: Columns that hold an item's path or text, in order of preference.
ITEM_COLUMNS = ("path", "text", "item")


def _numbered(folder: Path, prefix: str, suffix: str) -> list[Path]:
    files = [f for f in folder.glob(f"{prefix}*{suffix}") if f.stem[len(prefix) :].isdigit()]
    return sorted(files, key=lambda f: int(f.stem[len(prefix) :]))


def load_clip_retrieval(folder: str | os.PathLike, modality: str = "img", *, with_metadata: bool = False):
    """Embeddings written by clip-retrieval (``clip-retrieval inference``): the numbered
    ``img_emb/img_emb_{i}.npy`` (or ``text_emb/``) files concatenated in order, and with
    ``with_metadata`` the matching rows of ``metadata/metadata_{i}.parquet`` (needs pyarrow)."""
    folder = Path(folder)
    if modality not in CLIP_RETRIEVAL:
        raise InvalidInput(f"clip-retrieval modality must be 'img' or 'text'; got {modality!r}")
    sub, prefix = CLIP_RETRIEVAL[modality]
    files = _numbered(folder / sub, prefix, ".npy")
    if not files:
        raise MissingFile(f"{folder} has no {sub}/{prefix}N.npy files (clip-retrieval layout)")
    parts = [load_array(f, mmap=False) for f in files]
    if len({p.shape[1:] for p in parts}) != 1:
        raise InvalidInput(f"{folder}/{sub}: files have different dimensions")
    embeddings = np.concatenate(parts)
    if not with_metadata:
        return embeddings
    meta_files = _numbered(folder / "metadata", "metadata_", ".parquet")
    if len(meta_files) != len(files):
        raise InvalidInput(f"{folder}: {len(files)} embedding files but {len(meta_files)} metadata files")
    import pyarrow.parquet as pq

    records = [r for f in meta_files for r in pq.read_table(f).to_pylist()]
    if len(records) != embeddings.shape[0]:
        raise InvalidInput(f"{folder}: {embeddings.shape[0]} embeddings but {len(records)} metadata rows")
    return embeddings, records


def load_array(path: str | os.PathLike, key: str | None = None, *, mmap: bool = True) -> np.ndarray:
    """Load one array from ``.npy`` or ``.npz`` (``key`` or ``"file.npz:key"`` picks an entry; an
    archive holding a single array needs none), from a clip-retrieval output folder
    (``"folder"`` for its image embeddings, ``"folder:text"`` for its text embeddings), or from a
    folder of ``.npy`` / parquet shards (concatenated in natural order: ``part-2`` before
    ``part-10``), the same rows :func:`hubless.storage.sources.open_source` reads from it, so
    a folder means one thing with and without ``--ray``. Object arrays (pickles) are refused."""
    file, inline_key = split_key(path)
    key = key or inline_key
    if file.is_dir() and is_clip_retrieval(file):
        return load_clip_retrieval(file, key or "img")
    if file.is_dir():
        from hubless.storage.sources import open_source

        source = open_source(file)
        return source.read(0, source.n_rows)
    if file.exists() and not file.is_file():
        raise InvalidInput(f"{file} is not a regular file (a FIFO or device?); give a .npy or .npz file")
    if not file.is_file():
        raise MissingFile(f"no such file: {file}")
    suffix = file.suffix.lower()
    if suffix not in {".npy", ".npz"}:
        raise InvalidInput(f"{file}: unsupported file type {suffix!r}; expected .npy or .npz")
    if suffix == ".npy" and key is not None:
        raise InvalidInput(f"{file} is a .npy file; a key ({key!r}) only applies to .npz archives")
    try:
        if suffix == ".npy":
            check_npy(file)
            return np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
        with np.load(file, allow_pickle=False) as archive:
            names = list(archive.files)
            if key is None and len(names) == 1:
                key = names[0]
            if key in names:
                return archive[key]
    except (
        OSError,
        EOFError,
        ValueError,
        SyntaxError,
        tokenize.TokenError,
        zipfile.BadZipFile,
    ) as exc:  # an archive member's damaged header too
        if str(exc).startswith(("cannot read", f"{file} holds")):
            raise
        if "Object arrays" in str(exc) or "Python objects" in str(exc):
            raise InvalidInput(f"{file} holds Python objects; only numeric arrays are read (no pickles)") from exc
        raise InvalidInput(f"cannot read {file}: the file is truncated or corrupt ({exc})") from exc
    if key is None:
        raise InvalidInput(f"{file} holds {len(names)} arrays ({', '.join(names) or 'none'}); name one as {file}:KEY")
    raise NotFound(f"{file} has no array {key!r}; it holds: {', '.join(names)}")


def load_embeddings(
    path: str | os.PathLike,
    name: str = "embeddings",
    *,
    key: str | None = None,
    normalize: bool = True,
    dim: int | None = None,
    dim_of: str = "the gallery",
) -> np.ndarray:
    """Load and validate (n, d) embeddings as float32, L2-normalised when ``normalize``."""
    array = load_array(path, key)
    return as_embeddings(array, f"{name} ({os.fspath(path)})", normalize=normalize, dim=dim, dim_of=dim_of)


def _existing_file(path: str | os.PathLike, what: str) -> Path:
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{what} {path} is a directory, not a file")
    if not path.exists():
        raise MissingFile(f"no such {what}: {path}")
    if not path.is_file():
        raise InvalidInput(f"{what} {path} is not a regular file")
    return path


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{path} is not valid JSON: {exc}") from None


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{path} is not UTF-8 text: {exc}") from None


def read_records(path: str | os.PathLike) -> list[dict]:
    """One dict per row of a table (see the module docstring for the formats)."""
    path = _existing_file(path, "table")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        from hubless.errors import optional_import

        pq = optional_import("pyarrow.parquet", "reading .parquet tables", "index", "pyarrow")
        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow raises its own error types for corrupt files
            raise InvalidInput(f"cannot read {path}: {exc}") from None
    if suffix in (".csv", ".tsv"):
        try:
            with open(path, newline="", encoding="utf-8") as fh:
                return list(csv.DictReader(fh, delimiter="\t" if suffix == ".tsv" else ","))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InvalidInput(f"cannot read {path}: {exc}") from None
    if suffix == ".json":
        data = _read_json(path)
        embedded = isinstance(data, dict) and "items" in data  # an OUT.meta.json from `hubless embed`
        if embedded:
            data = data["items"]
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise InvalidInput(f"{path} must hold a JSON list of objects (one per row)")
        if embedded:
            # "index" is the item's place in the list that was embedded: bookkeeping of that file,
            # not of the item. As a metadata column it would sit beside the item's id and disagree
            # with it (items added later, or given --ids), so it is left out.
            data = [{k: v for k, v in r.items() if k != "index"} for r in data]
        return data
    if suffix == ".txt":
        return [{"item": line} for line in _read_lines(path)]
    raise InvalidInput(f"{path}: unsupported table format {suffix!r}; use {', '.join(TABLE_SUFFIXES)}")


def read_items(path: str | os.PathLike, column: str | None = None) -> list[str]:
    """One string per row: a path or a text (see the module docstring for the formats).

    For tables, ``column`` names the column (default: the first of path, text, item present).
    """
    path = _existing_file(path, "items file")
    suffix = path.suffix.lower()
    if suffix == ".txt" and column is None:
        return _read_lines(path)
    if suffix == ".json" and column is None:
        data = _read_json(path)
        if isinstance(data, list) and all(isinstance(x, str) for x in data):
            return data
    records = read_records(path)
    if not records:
        return []
    name = column or next((c for c in ITEM_COLUMNS if c in records[0]), None)
    if name is None or name not in records[0]:
        raise InvalidInput(f"{path} has no {column or ' / '.join(ITEM_COLUMNS)} column (columns: {', '.join(records[0])})")
    return [str(r.get(name, "")) for r in records]


def read_ids(spec: str) -> np.ndarray:
    """Item ids from "3,17,42", a .npy of integers or a .txt (one per line), as int64."""
    text = str(spec).strip()
    if text.lower().endswith((".npy", ".txt")):
        path = _existing_file(text, "ids file")
        if path.suffix.lower() == ".npy":
            values = load_array(path, mmap=False)
        else:
            lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
            try:
                values = np.array([int(v) for v in lines], dtype=np.int64)
            except ValueError:
                raise InvalidInput(f"{path} must hold one integer per line") from None
    else:
        try:
            values = np.array([int(v) for v in text.split(",") if v.strip()], dtype=np.int64)
        except ValueError:
            raise InvalidInput(f"ids must be comma-separated integers or a .npy/.txt file; got {text!r}") from None
    try:
        values = np.asarray(values)
    except OverflowError:
        raise InvalidInput("ids must be int64 item ids (below 2**63)") from None
    if values.size == 0:
        raise InvalidInput("ids: name at least one item id")
    if values.dtype.kind not in "iuf" or not np.all(np.isfinite(values)) or not np.all(np.mod(values, 1) == 0):
        raise InvalidInput("ids must be integers")
    if values.dtype.kind == "f" and np.abs(values).max() >= 2**53:
        raise InvalidInput("ids given as floating-point numbers lose digits beyond 2**53; give them as integers")
    if values.dtype == np.uint64 and values.max() >= 2**63:
        raise InvalidInput("ids must be int64 item ids (below 2**63)")
    return values.astype(np.int64).ravel()


def check_embedding_meta(meta: str | os.PathLike, embeddings: str | os.PathLike) -> None:
    """Refuse an ``OUT.meta.json`` of ``hubless embed`` that describes another version of the
    embeddings file it is used with (e.g. a job interrupted between writing the two)."""
    meta, embeddings = Path(meta), Path(split_key(embeddings)[0])
    if not meta.name.endswith(".meta.json") or not embeddings.is_file():
        return
    data = _read_json(meta)
    if not isinstance(data, dict) or data.get("embeddings") != embeddings.name or "embeddings_sha256" not in data:
        return  # not the metadata of this file (or written by an older hubless)
    from hubless._atomic import file_sha256

    if file_sha256(embeddings) != data["embeddings_sha256"]:
        raise InvalidInput(
            f"{meta} describes another version of {embeddings} (checksums differ: an interrupted embed?); run `hubless embed` again"
        )
