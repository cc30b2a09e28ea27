"""Sharded embedding sources read piecewise by distributed tasks (never gathered on the driver).

A source is an embedding set split over shard files, in order:

* ``.npy`` files: a folder of them, a glob (``emb/part-*.npy``) or a list of paths;
* parquet files (a folder, glob or list) with a list-of-float column (``embedding`` by default);
* a clip-retrieval output folder: ``out/`` (its ``img_emb`` files) or ``out/:text`` (its
  ``text_emb`` files), ordered by their number, not as text.

A folder means the same here as everywhere else in hubless (:func:`hubless.inputs.load_array`
reads the same rows from it on one machine): ``--gallery out/`` is one set of embeddings with
and without ``--ray``.

Opening a source reads only the shards' headers (their row counts, dimension and dtype) and
refuses, naming the shard, what an in-memory array would be refused for (the same checks,
:func:`hubless._validation.as_embeddings`): a missing or unreadable shard, a dtype that is not
floating point (an integer ``.npy``, a parquet column of strings or of integer lists), a shard
that is not 2-D, zero-length vectors, a dimension other than the first shard's, and a source
with no rows. :meth:`EmbeddingSource.read` returns rows ``[start, stop)`` as float32 from the
shards that hold them, checked as an in-memory array is (NaN/Inf, all-zero rows with
``normalize=True``, overflowing norms), the message naming the row in the whole source and in
its shard, and the shard.
"""

from __future__ import annotations

import glob
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import as_embeddings, check_float_dtype
from hubless.errors import InvalidInput, InvalidType, MissingFile

__all__ = ["EmbeddingSource", "Shard", "open_source"]

#: The column parquet shards hold their embeddings in, unless told otherwise.
PARQUET_COLUMN = "embedding"


@dataclass(frozen=True)
class Shard:
    """One shard file: its rows are global rows ``[start, start + rows)`` of the source."""

    path: str
    start: int
    rows: int


@dataclass(frozen=True)
class EmbeddingSource:
    """An ordered list of shards of one dimension (see the module docstring)."""

    shards: tuple[Shard, ...]
    dim: int
    kind: str  # "npy" or "parquet"
    column: str = PARQUET_COLUMN
    label: str = "embeddings"  # what the rows are, in messages ("gallery", "query_bank", ...)

    @property
    def n_rows(self) -> int:
        return self.shards[-1].start + self.shards[-1].rows if self.shards else 0

    @property
    def name(self) -> str:
        first = self.shards[0].path
        return first if len(self.shards) == 1 else f"{Path(first).parent}/ ({len(self.shards)} shards)"

    def fingerprint(self) -> list:
        """What identifies the data: each shard's path, rows and size/mtime (a changed shard
        invalidates kept tiles)."""
        out = []
        for s in self.shards:
            st = Path(s.path).stat()
            out.append([s.path, s.rows, st.st_size, st.st_mtime_ns])
        return out

    def read(self, start: int, stop: int, *, normalize: bool | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` as a C-contiguous float32 array, each shard's piece checked as
        an in-memory array is: finite always; with ``normalize`` given, all of
        :func:`~hubless._validation.as_embeddings` (True: L2-normalised, all-zero rows refused)."""
        if not 0 <= start <= stop <= self.n_rows:
            raise InvalidInput(f"rows [{start}, {stop}) are outside {self.name} ({self.n_rows} rows)")
        pieces = []
        for shard in self.shards:
            lo, hi = max(start, shard.start), min(stop, shard.start + shard.rows)
            if lo >= hi:
                continue
            part = _read_rows(shard.path, self.kind, self.column, lo - shard.start, hi - shard.start, self.dim, self.label, lo)
            if part.shape != (hi - lo, self.dim):
                raise InvalidInput(f"shard {shard.path} changed while being read: expected {hi - lo} rows of {self.dim}, got {part.shape}")
            where: dict[str, Any] = {"first_row": lo, "shard": (shard.path, lo - shard.start)}
            if normalize is None:
                bad = ~np.isfinite(part).all(axis=1)
                if bad.any():  # the same message as the full check's
                    as_embeddings(part[bad][:1], self.label, normalize=False, **{**where, "first_row": lo + int(np.argmax(bad))})
            else:
                part = as_embeddings(part, self.label, normalize=normalize, owned=True, **where)
            pieces.append(part)
        if len(pieces) == 1:  # rows of one shard: no copy
            return pieces[0]
        return np.concatenate(pieces) if pieces else np.empty((0, self.dim), dtype=np.float32)


def _natural_key(path: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", Path(path).name)]


def _shard_paths(spec) -> list[str]:
    if isinstance(spec, (list, tuple)):
        paths = [str(p) for p in spec]
        missing = [p for p in paths if not Path(p).is_file()]
        if missing:
            raise MissingFile(f"shard {missing[0]} does not exist" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
        return paths
    from hubless.storage.arrays import CLIP_RETRIEVAL, is_clip_retrieval, split_key

    text = str(spec)
    path, key = split_key(text)
    if path.is_dir() and is_clip_retrieval(path):  # clip-retrieval output: its img_emb (or, with :text, text_emb) files
        if (key or "img") not in CLIP_RETRIEVAL:
            raise InvalidInput(f"clip-retrieval modality must be 'img' or 'text'; got {key!r}")
        path = path / CLIP_RETRIEVAL[key or "img"][0]
        if not path.is_dir():
            raise MissingFile(f"{path} does not exist (clip-retrieval layout)")
    elif key is not None:
        path = Path(text)
    if path.is_dir():
        paths = [str(p) for p in path.iterdir() if p.suffix in (".npy", ".parquet") and p.is_file()]
        if not paths:
            raise MissingFile(f"{path} holds no .npy or .parquet shards")
        return sorted(paths, key=_natural_key)
    if path.is_file():
        return [text]
    if any(ch in text for ch in "*?["):
        paths = sorted(glob.glob(text), key=_natural_key)
        if not paths:
            raise MissingFile(f"no shard matches {text}")
        return paths
    raise MissingFile(f"embedding source {text} does not exist")


def open_source(spec, *, column: str = PARQUET_COLUMN, label: str | None = None) -> EmbeddingSource:
    """An :class:`EmbeddingSource` from a folder, glob, file, list of files, or a source;
    ``label`` names its rows in messages ("gallery", "query_bank", ...)."""
    if isinstance(spec, EmbeddingSource):
        return spec if label is None or spec.label == label else replace(spec, label=label)
    label = label or "embeddings"
    paths = _shard_paths(spec)
    kinds = {Path(p).suffix for p in paths}
    if len(kinds) != 1 or kinds - {".npy", ".parquet"}:
        raise InvalidInput(f"shards must be all .npy or all .parquet; got {', '.join(sorted(kinds))}")
    kind = kinds.pop().lstrip(".")
    shards, start, dim = [], 0, None
    for p in paths:
        rows, d = _header(p, kind, column, label)
        if dim is None:
            dim = d
        elif d != dim:
            raise InvalidInput(
                f"{label} shard {p} has dimension {d} but {paths[0]} has {dim}: every shard of a source must have one dimension"
            )
        shards.append(Shard(p, start, rows))
        start += rows
    if start == 0 or dim is None:
        raise InvalidInput(f"{label} {spec} is empty (its shards hold no rows); at least one row is needed.")
    return EmbeddingSource(tuple(shards), int(dim), kind, column, label)


def _header(path: str, kind: str, column: str, label: str) -> tuple[int, int]:
    """(rows, dim) of a shard, from its header only (its dtype and shape checked)."""
    name = f"{label} shard {path}"
    if kind == "npy":
        from hubless.storage.arrays import check_npy

        check_npy(Path(path))
        arr = np.load(path, mmap_mode="r")
        check_float_dtype(arr.dtype, name)
        if arr.ndim != 2:
            raise InvalidInput(f"{name} must be 2-D with shape (n_items, dim); got shape {arr.shape}.")
        if arr.shape[1] == 0:
            raise InvalidInput(f"{name} has zero-length vectors (shape {arr.shape}).")
        return int(arr.shape[0]), int(arr.shape[1])
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError for damaged files
        raise InvalidInput(f"cannot read shard {path}: {exc}") from None
    if column not in meta.schema_arrow.names:
        raise InvalidInput(f"{name} has no column {column!r} (columns: {', '.join(meta.schema_arrow.names)})")
    arrow_type = meta.schema_arrow.field(column).type
    _check_list_of_floats(arrow_type, name, column)
    rows = meta.metadata.num_rows
    if rows == 0:
        return 0, _parquet_dim(arrow_type, path, None)
    first = meta.read_row_group(0, columns=[column]).column(column)
    dim = _parquet_dim(first.type, path, first)
    if dim == 0:
        raise InvalidInput(f"{name} has zero-length vectors (column {column!r}).")
    return rows, dim


def _check_list_of_floats(arrow_type, name: str, column: str) -> None:
    """A parquet embedding column must hold a list of floats per row (as an array must be float)."""
    import pyarrow as pa

    listed = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)
    if listed and pa.types.is_floating(arrow_type.value_type):
        return
    what = f"lists of {arrow_type.value_type}" if listed else f"{arrow_type} values"
    raise InvalidType(f"{name}: column {column!r} holds {what}; it must hold a list of floats per row (float16, float32 or float64)")


def _parquet_dim(arrow_type, path, values) -> int:
    size = getattr(arrow_type, "list_size", None)
    if size is not None and size > 0:
        return int(size)
    if values is None or len(values) == 0:
        raise InvalidInput(f"shard {path}: cannot tell the dimension of its variable-length column")
    return len(values[0].as_py())


def _read_rows(path: str, kind: str, column: str, lo: int, hi: int, dim: int, label: str, first_row: int) -> np.ndarray:
    if kind == "npy":
        return np.array(np.load(path, mmap_mode="r")[lo:hi], dtype=np.float32)  # a copy the caller owns (normalised in place)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    file = pq.ParquetFile(path)  # only the row groups holding rows [lo, hi) are read
    starts = np.cumsum([0] + [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)])
    groups = [g for g in range(file.num_row_groups) if starts[g] < hi and starts[g + 1] > lo]
    table = file.read_row_groups(groups, columns=[column]).slice(lo - int(starts[groups[0]]) if groups else 0, hi - lo)
    col = table.column(column).combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(col), -1).to_numpy(zero_copy_only=False)
    if (lengths != dim).any():
        bad = int(np.flatnonzero(lengths != dim)[0])
        what = "is missing" if lengths[bad] < 0 else f"has {lengths[bad]} values"
        raise InvalidInput(
            f"{label} row {first_row + bad} (row {lo + bad} of shard {path}): column {column!r} {what}; every row needs {dim}"
        )
    values = col.flatten().to_numpy(zero_copy_only=False)
    return np.array(values, dtype=np.float32).reshape(hi - lo, -1)  # owned (arrow memory is read-only)
