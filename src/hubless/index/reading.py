"""Reading a saved index: the base's files and the segments of one version, each checked
against its recorded size and sha256 as it is read (:func:`load`), the segments replayed in
order (:func:`replay`), and what a memory-mapped load has not checksummed kept for the writes
that copy it (:class:`MappedFiles`).

A load verifies the sha256 of every file it reads whole: all of them by default, and with
``mmap=True`` all but the memory-mapped ones (gallery, statistics, banks, the FAISS structure,
mapped whole by FAISS's ``IO_FLAG_MMAP_IFC`` so that it stays self-contained), which
``hubless index verify`` checks (:func:`hubless.index.integrity.verify`). Damage is a
:class:`~hubless.errors.Corrupt` naming the file. The format is described in
:mod:`hubless.index.disk`; the manifest is read and checked by :mod:`hubless.index.pointer`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import mmap as _mmap_module
import os
import threading
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import faiss
import numpy as np

from hubless._atomic import file_sha256
from hubless.corrections import make_correction
from hubless.engine import BankStatistics
from hubless.errors import Busy, Conflict, Corrupt, MissingDependency, optional_import
from hubless.index import writer
from hubless.index.config import IndexConfig
from hubless.index.faiss_build import plan_layout, stored_rows
from hubless.index.live import SIDES, Snapshot, row_statistics_names
from hubless.index.metadata import Metadata, table_from_bytes
from hubless.index.pointer import STAT_FILE, check_index_dir, pointer_stamp, read_manifest

__all__ = ["Gone", "Loaded", "MappedFiles", "load", "parse_segment", "parsing", "read_base", "replay"]

#: Files ``load(mmap=True)`` maps instead of reading (size and header checked, sha256 by ``verify``).
_MAPPED = ("gallery.npy", "index.faiss", "query_bank.npy", "gallery_bank.npy")
#: How ``load(mmap=True)`` maps a FAISS structure: FAISS's own whole-file map
#: (``IO_FLAG_MMAP_IFC``, FAISS >= 1.11: the lists, codes and graph are views of the file, the
#: index stays self-contained and is written back whole; FAISS advises the kernel of random
#: access). The older ``IO_FLAG_MMAP`` is not used: it turns IVF lists into
#: ``OnDiskInvertedLists`` that name a file, which ``write_index`` then saves as a reference to
#: an empty file name (a copy or compaction of such an index cannot be loaded). Without
#: ``IO_FLAG_MMAP_IFC`` the structure is read whole (and checksummed).
_MAP_FAISS = getattr(faiss, "IO_FLAG_MMAP_IFC", 0)


@dataclass
class Loaded:
    """A snapshot read from disk and the manifest it came from."""

    snapshot: Snapshot
    manifest: dict
    stamp: tuple = ()
    base: Snapshot | None = None  # the base alone, before the segments


class MappedFiles:
    """The files of a base that a memory-mapped load uses without having checksummed them
    (gallery, statistics, banks, FAISS structure). A write that carries their contents into a
    new file checksums them first (:meth:`verify`; once: the files never change), so a damaged
    file is refused (a :class:`~hubless.errors.Corrupt` naming it) instead of being copied into a
    new base that verifies (issue 38). Shared by every snapshot derived from one load."""

    def __init__(self, parts: Sequence[_Part]) -> None:
        self._parts = {part.file.name: part for part in parts}
        self._lock = threading.Lock()

    def verify(self, names: Sequence[str] | None = None) -> None:
        """Checksum the files ``names`` (file names such as "gallery.npy"; None: all) not
        verified yet: a Corrupt naming a damaged one; a Conflict when one was removed meanwhile
        (another writer compacted the index: reload it)."""
        with self._lock:
            for name, part in list(self._parts.items()):
                if names is not None and name not in names:
                    continue
                try:
                    part.verify()
                except Gone:
                    raise Conflict(
                        f"{part.root}: {part.label}, which this index maps, was removed (another writer compacted the "
                        "index) before it was verified: load the index again"
                    ) from None
                del self._parts[name]


class Gone(Exception):
    """A file vanished while it was read (a writer compacted meanwhile): follow CURRENT again."""


class _Part:
    """Read one file of a version: sizes always checked, sha256 when read whole."""

    def __init__(self, root: Path, file: Path, entry: dict, label: str) -> None:
        self.root, self.file, self.entry, self.label = root, file, entry, label

    def check_size(self) -> None:
        try:
            size = self.file.stat().st_size
        except FileNotFoundError:
            raise Gone from None
        if size != self.entry["bytes"]:
            raise Corrupt(f"{self.root}: {self.label} is truncated or altered (size differs from the manifest)")

    def verify(self) -> None:
        """Check the file's size and sha256 (streamed: nothing kept in memory)."""
        self.check_size()
        try:
            digest = file_sha256(self.file)
        except FileNotFoundError:
            raise Gone from None
        if digest != self.entry["sha256"]:
            raise Corrupt(f"{self.root}: {self.label} is corrupt (checksum mismatch)")

    def read_bytes(self) -> bytes:
        self.check_size()
        try:
            raw = self.file.read_bytes()
        except FileNotFoundError:
            raise Gone from None
        if hashlib.sha256(raw).hexdigest() != self.entry["sha256"]:
            raise Corrupt(f"{self.root}: {self.label} is corrupt (checksum mismatch)")
        return raw

    def array(self, *, mmap: bool) -> np.ndarray:
        """A .npy part: memory-mapped (size checked) or read and verified (a read-only view
        of the bytes read: no second copy of a gallery)."""
        with self.parsing():
            if mmap:
                self.check_size()
                return np.load(self.file, mmap_mode="r", allow_pickle=False)
            return _npy_view(self.read_bytes())

    def parsing(self):
        return parsing(self.root, self.label)


def _npy_view(raw: bytes) -> np.ndarray:
    """The array a .npy file's bytes hold, as a read-only view of ``raw`` (``np.load`` of a
    BytesIO copies the data in chunks: a second gallery in memory and a third of a plain load's
    time); object arrays are refused as ``np.load(allow_pickle=False)`` refuses them."""
    fh = io.BytesIO(raw)
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fh)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fh)
    else:  # a version np.save does not write for these arrays: numpy's own reader
        return np.load(io.BytesIO(raw), allow_pickle=False)
    if dtype.hasobject:
        return np.load(io.BytesIO(raw), allow_pickle=False)  # raises: no pickles
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) - fh.tell() < count * dtype.itemsize:
        raise ValueError("the array's data is shorter than its header says")
    array = np.frombuffer(raw, dtype=dtype, count=count, offset=fh.tell())
    return array.reshape(shape[::-1]).T if fortran else array.reshape(shape)


class parsing:
    """Turn a failure to parse one part into a Corrupt naming it (a part whose checksum matches
    can still be unreadable, e.g. written by a broken tool with a forged manifest)."""

    def __init__(self, root: Path, label: str) -> None:
        self.root, self.label = root, label

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if exc is None or isinstance(exc, (MissingDependency, Corrupt, Gone)):
            return False
        if isinstance(exc, FileNotFoundError):
            raise Gone from None
        if isinstance(exc, (zipfile.BadZipFile, RuntimeError, OSError, ValueError, KeyError, TypeError, EOFError, IndexError)):
            detail = " ".join(str(exc).split())[:200]
            raise Corrupt(f"{self.root}: {self.label} cannot be read ({type(exc).__name__}: {detail})") from None
        return False


def load(path: str | os.PathLike, *, mmap: bool = False) -> Loaded:
    """Read the index at ``path``, verifying as the module docstring says."""
    path = check_index_dir(Path(path))
    for _ in range(5):  # a commit may switch versions while we read: follow CURRENT again
        stamp = pointer_stamp(path)
        manifest, _ = read_manifest(path)
        try:
            base = read_base(path, manifest, mmap=mmap)
            snap = replay(path, base, manifest, manifest["segments"])
        except Gone:
            if pointer_stamp(path) == stamp:
                raise Corrupt(f"{path}: a file the current version names is missing") from None
            continue
        return Loaded(snap, manifest, stamp, base=base)
    raise Busy(f"{path} changed under five consecutive loads; retry when writes settle")


def read_base(path: Path, m: dict, *, mmap: bool) -> Snapshot:
    base = m["base"]
    folder = path / base["name"]
    files = base["files"]
    corr = make_correction(m["method"])
    request = corr.statistics_request()

    def part(name: str) -> _Part:
        return _Part(path, folder / name, files[name], f"{base['name']}/{name}")

    n, dim, columns = base["rows"], m["dim"], m["bias_columns"]
    mapped: list[_Part] = []  # the parts mapped, not checksummed (MappedFiles)

    def read_array(name: str) -> np.ndarray:
        one = part(name)
        if mmap:
            mapped.append(one)
        return one.array(mmap=mmap)

    gallery = read_array("gallery.npy")
    ids = part("ids.npy").array(mmap=False)
    bias = part("bias.npy").array(mmap=False)
    expect = {"gallery.npy": ((n, dim), np.float32), "ids.npy": ((n,), np.int64), "bias.npy": ((n, columns), np.float32)}
    for name, array in (("gallery.npy", gallery), ("ids.npy", ids), ("bias.npy", bias)):
        shape, dtype = expect[name]
        if array.shape != shape or array.dtype != dtype:
            raise Corrupt(f"{path}: {base['name']}/{name} holds {array.dtype} {array.shape}; the manifest says {np.dtype(dtype)} {shape}")
    names = row_statistics_names(request)
    listed = sorted(name[5:-4] for name in files if STAT_FILE.fullmatch(name))
    if listed != sorted(names):
        raise Corrupt(f"{path}: the base holds statistics {listed}; {m['method']} needs {sorted(names)}")
    stats = {}
    for name in names:
        stats[name] = read_array(f"stat.{name}.npy")
        if stats[name].shape[0] != n:
            raise Corrupt(f"{path}: {base['name']}/stat.{name}.npy has {stats[name].shape[0]} rows for {n} items")
    state = part("state.npz")
    with state.parsing(), np.load(io.BytesIO(state.read_bytes()), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    with state.parsing():
        bank, gallery_sum = _bank_from_state(arrays, n, dim, request)
    banks = {}
    for name in ("query_bank", "gallery_bank"):
        if f"{name}.npy" in files:
            banks[name] = read_array(f"{name}.npy")
            if banks[name].ndim != 2 or banks[name].shape[1] != dim or banks[name].dtype != np.float32:
                raise Corrupt(f"{path}: {base['name']}/{name}.npy is not a ({dim}-d) float32 bank")
    faiss_index = None
    if "index.faiss" in files:
        faiss_part = part("index.faiss")
        with faiss_part.parsing(), _lists_elsewhere(path, faiss_part.label):
            if mmap and _MAP_FAISS:
                faiss_part.check_size()
                faiss_index = faiss.read_index(str(faiss_part.file), _MAP_FAISS | faiss.IO_FLAG_READ_ONLY)
                mapped.append(faiss_part)
            else:
                raw = faiss_part.read_bytes()
                faiss_index = faiss.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
        config = IndexConfig.from_dict(m["config"])
        rows = stored_rows(bias, config.spill_below)  # IVF items spilled to a second list count twice
        if faiss_index.d != m["faiss_dim"] or faiss_index.ntotal != rows:
            raise Corrupt(
                f"{path}: {base['name']}/index.faiss has d={faiss_index.d}, {faiss_index.ntotal} rows; the manifest says {m['faiss_dim']}, {rows}"
            )
        offsets = {dim, plan_layout(config.factory, dim, columns)[2]}
        if config.bias_offset is not None and (config.bias_offset not in offsets or config.bias_offset + columns > faiss_index.d):
            raise Corrupt(f"{path}: the manifest puts the bias at column {config.bias_offset} of {faiss_index.d}; {config.factory} cannot")
    if mmap and faiss_index is not None:
        _advise_random(gallery)  # an ANN index reads its candidates' rows, scattered (FAISS advises its own map)
    schema = None if m["metadata_schema"] is None else Metadata.schema_from_text(m["metadata_schema"])
    metadata = None
    if schema is not None:
        table = None
        if "metadata.parquet" in files:
            pa = optional_import("pyarrow", "reading item metadata", "index")
            pq = optional_import("pyarrow.parquet", "reading item metadata", "index", "pyarrow")

            meta_part = part("metadata.parquet")
            with meta_part.parsing():
                # ParquetFile, one thread: pq.read_table goes through Arrow's dataset layer (and
                # imports pandas), whose thread pools next to FAISS's OpenMP threads can abort the
                # interpreter at exit ("terminate called without an active exception")
                table = pq.ParquetFile(pa.BufferReader(meta_part.read_bytes())).read(use_threads=False)
            if table.num_rows != n:
                raise Corrupt(f"{path}: {base['name']}/metadata.parquet has {table.num_rows} rows for {n} items")
        metadata = Metadata(schema, [(n, table)] if n else [])
    config = IndexConfig.from_dict(m["config"])
    return Snapshot.from_arrays(
        spec=m["method"],
        normalize=m["normalize"],
        config=config,
        gallery=gallery,
        bias=bias,
        ids=ids,
        stats=stats,
        bank=bank,
        gallery_sum=gallery_sum,
        banks=banks,
        metadata=metadata,
        faiss=faiss_index,
        faiss_dim=m["faiss_dim"],
        next_id=m["next_id"],
        mapped=MappedFiles(mapped) if mapped else None,
    )


@contextlib.contextmanager
def _lists_elsewhere(path: Path, label: str):
    """A FAISS file whose inverted lists name another file (what an earlier hubless wrote when a
    memory-mapped IVF index was compacted or saved: issue 38) said as such, not as FAISS's error."""
    try:
        yield
    except RuntimeError as exc:
        if "OnDiskInvertedLists" not in str(exc):
            raise
        raise Corrupt(
            f"{path}: {label} keeps its inverted lists in another file (OnDiskInvertedLists), which cannot be opened: "
            "the IVF lists are not in the index (an index compacted or saved from a memory-mapped load by an earlier "
            "hubless); build the index again from its items"
        ) from None


def _advise_random(array: np.ndarray) -> None:
    """``madvise(MADV_RANDOM)`` on a memory-mapped array: each page fault reads that page only,
    not the kernel's read-ahead around it (most of which a scattered reader never uses; measured
    in ``benchmarks/index_writes.py``). Left to the default where the platform lacks it."""
    advice = getattr(_mmap_module, "MADV_RANDOM", None)
    mapping = getattr(array, "_mmap", None)
    if advice is None or mapping is None:
        return
    with contextlib.suppress(OSError, ValueError):
        mapping.madvise(advice)


def _bank_from_state(arrays: dict, n: int, dim: int, request) -> tuple[BankStatistics, np.ndarray]:
    sizes = arrays["sizes"]
    if sizes.shape != (2,):
        raise ValueError("sizes must hold two numbers")
    n_query_bank, n_gallery_bank = int(sizes[0]), int(sizes[1])
    bank = BankStatistics(
        n_gallery=n,
        n_query_bank=n_query_bank,
        n_gallery_bank=None if n_gallery_bank < 0 else n_gallery_bank,
        query_bank_mean=arrays["query_bank_mean"],
        gallery_mean=np.zeros(dim),
        gallery_bank_mean=arrays.get("gallery_bank_mean"),
    )
    for side in SIDES:
        k = getattr(request, f"{side}_activation_k")
        lists, scores = arrays.get(f"{side}_activation"), arrays.get(f"{side}_activation_scores")
        if not k:
            continue
        size = getattr(bank, f"n_{side}_bank")
        if lists is None or scores is None or lists.shape != (size, k) or scores.shape != (size, k) or lists.dtype != np.int64:
            raise ValueError(f"the {side}-bank activation sets are missing or not ({size}, {k})")
        setattr(bank, f"{side}_activation", lists)
        setattr(bank, f"{side}_activation_scores", scores)
    if arrays["query_bank_mean"].shape != (dim,) or arrays["gallery_sum"].shape != (dim,):
        raise ValueError(f"the bank means are not {dim}-d")
    return bank, arrays["gallery_sum"]


def replay(path: Path, snap: Snapshot, manifest: dict, segments: list[dict]) -> Snapshot:
    """``snap`` with ``segments`` (manifest entries, in order) read, verified and applied."""
    schema = None if manifest["metadata_schema"] is None else Metadata.schema_from_text(manifest["metadata_schema"])
    for entry in segments:
        seg = _Part(path, path / entry["name"], entry, entry["name"])
        raw = seg.read_bytes()
        with seg.parsing():
            part = parse_segment(raw, entry, snap, schema)
        snap = writer.replayed(snap, part)
    if (snap.n_alive, snap.n_rows) != (manifest["n_items"], manifest["n_rows"]):
        raise Corrupt(
            f"{path}: the base and segments hold {snap.n_alive} items in {snap.n_rows} rows; the manifest says {manifest['n_items']} in {manifest['n_rows']}"
        )
    return replace(snap, next_id=max(snap.next_id, manifest["next_id"]))


def parse_segment(raw: bytes, entry: dict, snap: Snapshot, schema) -> dict:
    with np.load(io.BytesIO(raw), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    info = json.loads(arrays.pop("info").tobytes().decode()) if "info" in arrays else {}
    rows = arrays["rows"]
    n = rows.shape[0]
    if rows.ndim != 2 or rows.shape[1] != snap.dim or rows.dtype != np.float32 or n != entry["rows"]:
        raise ValueError(f"rows are {rows.dtype} {rows.shape}; the index needs {entry['rows']} x {snap.dim} float32")
    if "ids" in arrays:
        ids = arrays["ids"]
    elif "first_id" in entry:
        ids = np.arange(entry["first_id"], entry["first_id"] + n, dtype=np.int64)
    else:
        raise ValueError("the segment's rows have no ids")
    bias = arrays["bias"]
    if ids.shape != (n,) or ids.dtype != np.int64 or (ids.size and ids.min() < 0) or bias.shape != (n, snap.bias.shape[1]):
        raise ValueError("its ids or bias columns do not fit its rows")
    if bias.dtype != np.float32 or not np.isfinite(bias).all():
        raise ValueError("its bias columns are not finite float32")
    statistics = {}
    for name in snap.stats_base:
        values = arrays.get(f"stat.{name}")
        if values is None or values.shape != (n, *snap.stats_base[name].shape[1:]):
            raise ValueError(f"its statistics {name} are missing or of another shape")
        statistics[name] = values.astype(snap.stats_base[name].dtype, copy=False)
    dead = arrays.get("dead", np.zeros(0, np.int64))
    activation = {}
    for side in SIDES:
        for kind in ("merge", "replace"):
            key = f"act.{side}.{kind}"
            if f"{key}.rows" in arrays:
                activation[f"{side}.{kind}"] = (arrays[f"{key}.rows"], arrays[f"{key}.ids"], arrays[f"{key}.scores"])
    table = table_from_bytes(arrays["metadata"].tobytes()) if "metadata" in arrays else None
    if table is not None and table.num_rows != n:
        raise ValueError(f"its metadata has {table.num_rows} rows for {n}")
    meta = snap.metadata
    if schema is not None and (table is not None or meta is not None):
        meta = Metadata(
            schema, [*(meta.parts if meta is not None else ([(snap.n_rows, None)] if snap.n_rows else [])), (n, table)]
        ).folded()
    elif table is not None:
        raise ValueError("it holds metadata but the manifest has no metadata schema")
    start = info.get("start")
    return {
        "name": entry["name"],
        "start": None if start is None else int(start),
        "rows": rows,
        "ids": ids,
        "bias": bias,
        "statistics": statistics,
        "dead": np.asarray(dead, np.int64),
        "activation": activation,
        "metadata": meta,
        "next_id": int(info.get("next_id", 0)),
    }
