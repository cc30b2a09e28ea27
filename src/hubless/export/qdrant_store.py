"""Qdrant, in-process: the real Qdrant engine (``qdrant-edge-py``) on a local directory, ``qdrant://path/collection``.

Each item is a point (id = the item id) with two named vectors, both with the Dot distance
(never Cosine: it would normalise [r, bias] and break the correction): ``corrected`` =
[r, bias(r)] and ``plain`` = r, and its metadata as payload. The collection is the directory
``path/collection/``: versions ``v-<hex>/`` (``shard/`` and ``hubless.json``) and a ``CURRENT``
file naming the live one. A re-export writes a new version and switches ``CURRENT`` atomically:
readers see the old or the new collection; the previous version stays until the next export,
which removes every other version (also those a killed export left). ``ann="HNSW"`` builds
Qdrant's HNSW index (searched with ``hnsw_ef``, the ``ef_search`` knob) before the switch.

One process at a time: Qdrant's engine locks a shard's write-ahead log, so a second process
opening the same version is refused with :class:`~hubless.export.base.StoreUnavailable` (use a
Qdrant server, ``qdrant+http://``, to search from several processes). A sync from another
process while one holds the store open copies the version, changes the copy and switches to it;
the holder moves to the new version at its next search.

Float metadata: the engine does not parse payload floats exactly (0.10000000000000005 is
stored as 0.10000000000000003, measured with qdrant-edge-py 0.9), so each point's payload also
keeps its floats as text under ``__hubless_floats`` (a reserved key), which a search or a sync
reads back: the payload's own float (what Qdrant filters on) may be one or two ulps off.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hubless._atomic import current_dir
from hubless.errors import InvalidInput, NotFound, optional_import
from hubless.export.base import StaleRead, StoreUnavailable, VectorStore, directory_lock, register
from hubless.export.store_options import positive_int_or_none
from hubless.export.store_rows import Rows

#: Segments larger than this many KB get an HNSW index; "never" for exact-only collections.
_NEVER_INDEX_KB = 2**40

_OPEN: dict[str, Any] = {}  # shard path -> the loaded shard, kept for searches
#: Held while a shard is looked up and loaded: two threads' first searches would otherwise both
#: load it, and the engine's own file lock refuses the second ("open in another process").
_OPEN_LOCK = threading.Lock()
#: The payload key holding a point's float metadata as exact text (see the module docstring).
EXACT_FLOATS = "__hubless_floats"


@atexit.register
def _close_kept() -> None:
    """Close what searches kept open (at interpreter exit)."""
    for kept in _OPEN.values():
        kept.close()
    _OPEN.clear()


def _qdrant():
    return optional_import("qdrant_edge", "exporting to Qdrant", "qdrant", "qdrant_edge")


def _is_locked(exc: BaseException) -> bool:
    return "WouldBlock" in str(exc) or "Resource temporarily unavailable" in str(exc)


def collect_hits(results, k: int):
    """(scores, ids, rows) from Qdrant's scored points per query (either client's: ``id``,
    ``score``, ``payload``); ties go to the lower id, as in hubless; empty slots are id -1."""
    scores = np.full((len(results), k), -np.inf, np.float32)
    ids = np.full((len(results), k), -1, np.int64)
    rows = []
    for i, hits in enumerate(results):
        hits = sorted(hits, key=lambda h: (-h.score, h.id))[:k]
        for j, hit in enumerate(hits):
            ids[i, j], scores[i, j] = hit.id, hit.score
        rows.append([{"id": int(h.id), **_metadata(h.payload)} for h in hits])
    return scores, ids, rows


def _payload(record: dict | None) -> dict | None:
    """A point's payload: the metadata, and its floats as exact text under EXACT_FLOATS."""
    if record is None:
        return None
    floats = {k: repr(v) for k, v in record.items() if type(v) is float}
    return {**record, EXACT_FLOATS: floats} if floats else record


def _metadata(payload: dict | None) -> dict:
    """The metadata of a payload written by :func:`_payload` (its floats exact)."""
    if not payload or EXACT_FLOATS not in payload:
        return payload or {}
    record = dict(payload)
    floats = record.pop(EXACT_FLOATS)
    record.update({k: float(v) for k, v in (floats or {}).items() if k in record})
    return record


def collect_rows(scroll) -> tuple[np.ndarray, np.ndarray, list]:
    """(ids, [r, bias] rows, payloads) by id from ``scroll(offset) -> (records, next offset)`` pages."""
    ids, rows, meta, offset = [], [], [], None
    while True:
        records, offset = scroll(offset)
        ids += [r.id for r in records]
        rows += [r.vector["corrected"] for r in records]
        meta += [_metadata(r.payload) for r in records]
        if offset is None:
            break
    order = np.argsort(ids, kind="stable")
    return np.asarray(ids, np.int64)[order], np.asarray(rows, np.float32).reshape(len(ids), -1)[order], [meta[i] for i in order]


def check_point_ids(ids: np.ndarray, label: str) -> None:
    if len(ids) and int(ids.min()) < 0:
        raise InvalidInput(f"{label} point ids are unsigned: item id {int(ids.min())} is negative")


@dataclass(frozen=True)
class QdrantOptions:
    """Qdrant export options (HNSW only)."""

    m: int | None = field(default=None, metadata={"help": "HNSW links per node (Qdrant's default 16)", "ann": ("HNSW",)})
    ef_construct: int | None = field(default=None, metadata={"help": "HNSW build beam (Qdrant's default 100)", "ann": ("HNSW",)})

    def __post_init__(self):
        positive_int_or_none(self.m, "m")
        positive_int_or_none(self.ef_construct, "ef_construct")


@register
class QdrantEdgeStore(VectorStore):
    schemes = ("qdrant",)
    label = "Qdrant (in-process)"
    extra = "qdrant"
    ann_types = {"HNSW": "ef_search"}
    knob_range = {"ef_search": (128, 8192)}
    Options = QdrantOptions
    process_limit = "one process at a time"

    @property
    def folder(self) -> Path:
        return Path(self.location) / self.table

    def writer_lock(self):
        return directory_lock(self.location, self.table)

    def exists(self) -> bool:
        return current_dir(self.folder) is not None

    def clean_leftovers(self) -> None:
        """Every version but the current one (the previous export's, kept for its readers, and
        those of killed exports)."""
        if not self.folder.is_dir():
            return
        keep = current_dir(self.folder)
        for version in self.folder.glob("v-*"):
            if version != keep:
                _OPEN.pop(str(version / "shard"), None)  # freed with its last use
                shutil.rmtree(version, ignore_errors=True)

    def _config(self, dim: int, plain: int, ann: str | None, options):
        qd = _qdrant()
        hnsw = None
        if ann is not None and (options.m or options.ef_construct):
            hnsw = qd.HnswIndexConfig(m=options.m or 16, ef_construct=options.ef_construct or 100, full_scan_threshold=10_000)
        params = {"size": dim, "distance": qd.Distance.Dot}
        if hnsw is not None:
            params["hnsw_config"] = hnsw
        return qd.EdgeConfig(
            vectors={"corrected": qd.EdgeVectorParams(**params), "plain": qd.EdgeVectorParams(size=plain, distance=qd.Distance.Dot)},
            optimizers=qd.EdgeOptimizersConfig(indexing_threshold=1 if ann is not None else _NEVER_INDEX_KB),
        )

    def write_table(self, rows: Rows, info: dict, options, *, batch: int, ann: str | None) -> None:
        from hubless._atomic import write_json, write_text

        qd = _qdrant()
        check_point_ids(rows.ids, "Qdrant")
        version = self.folder / f"v-{uuid.uuid4().hex[:12]}"
        try:
            shard = qd.EdgeShard.create(str(version / "shard"), self._config(rows.augmented.shape[1], rows.plain.shape[1], ann, options))
            try:
                for part in rows.batches(batch):
                    shard.update(qd.UpdateOperation.upsert_points(_points(qd, part)))
                if ann is not None:
                    shard.optimize()
                shard.flush()
            finally:
                shard.close()
            write_json(version / "hubless.json", info)
            write_text(self.folder / "CURRENT", version.name)  # atomic: readers see the old or the new version
        except BaseException:
            shutil.rmtree(version, ignore_errors=True)
            raise

    @contextlib.contextmanager
    def reading(self):
        """One version for the info and the rows of a search."""
        self._pinned: Any = self._version()
        try:
            yield
        except (OSError, NotFound, InvalidInput) as exc:
            # removed (or being removed: its hubless.json may go before the directory) by the
            # exports after next: no longer the current version, so the search is run again
            if not self._pinned.is_dir() or current_dir(self.folder) != self._pinned:
                raise StaleRead(str(exc)) from None
            raise
        finally:
            self._pinned = None

    def _version(self) -> Path:
        pinned = getattr(self, "_pinned", None)
        if pinned is not None:
            return pinned
        version = current_dir(self.folder)
        if version is None:
            raise NotFound(f"no collection {self.table!r} in Qdrant store {self.location}")
        return version

    def read_info(self) -> dict:
        version = self._version()
        try:
            return json.loads((version / "hubless.json").read_text())
        except (OSError, ValueError):
            raise InvalidInput(
                f"collection {self.table!r} in {self.location} was not written by hubless export (no hubless.json)"
            ) from None

    def write_info(self, info: dict) -> None:
        from hubless._atomic import write_json

        write_json(self._version() / "hubless.json", info)

    def _shard(self, version: Path | None = None):
        """The loaded shard of the current version (kept for later searches)."""
        qd = _qdrant()
        version = version or self._version()
        key = str(version / "shard")
        with _OPEN_LOCK:
            if key not in _OPEN:  # a re-export is a new version: a new key
                for stale in [k for k in _OPEN if k.startswith(str(self.folder) + "/")]:
                    del _OPEN[stale]  # not closed here: a search in another thread may still use it (freed with its last use)
                try:
                    _OPEN[key] = qd.EdgeShard.load(key)
                except Exception as exc:
                    if _is_locked(exc):
                        raise StoreUnavailable(
                            f"{self.uri} is open in another process: Qdrant's in-process engine serves one process at a time "
                            "(close it there, or serve the collection from a Qdrant server, qdrant+http://)"
                        ) from None
                    raise
            return _OPEN[key]

    def native_knobs(self, knob: str, value: int, k: int, options: dict) -> dict:
        return {"hnsw_ef": max(value, k)}

    def query(self, vectors: np.ndarray, k: int, *, column: str, exact: bool, knobs: dict):
        qd = _qdrant()
        shard = self._shard()
        using = "corrected" if column == "vector" else "plain"
        params = qd.SearchParams(exact=True) if exact or not knobs else qd.SearchParams(hnsw_ef=int(knobs["hnsw_ef"]))
        requests = [
            qd.QueryRequest(limit=k, query=qd.Query.Nearest(v, using=using), with_payload=True, params=params) for v in vectors.tolist()
        ]
        return collect_hits(shard.query_batch(qd.QueryBatchRequest(requests)), k)

    def read_rows(self):
        qd = _qdrant()
        shard = self._shard()
        return collect_rows(
            lambda offset: shard.scroll(qd.ScrollRequest(offset=offset, limit=4096, with_vector=["corrected"], with_payload=True))
        )

    @contextlib.contextmanager
    def changing(self):
        """A sync changes the current version in place, or, when another process holds it open,
        a copy of it that becomes current once the changes are written."""
        from hubless._atomic import write_text

        version = self._version()
        try:
            self._shard(version)
        except StoreUnavailable:
            pass
        else:
            yield
            return
        target = self.folder / f"v-{uuid.uuid4().hex[:12]}"
        shutil.copytree(version, target)  # the holder only reads it; writers take turns (the writer lock)
        self._pinned = target
        try:
            yield
            _OPEN.pop(str(target / "shard")).close()
            write_text(self.folder / "CURRENT", target.name)
        except BaseException:
            kept = _OPEN.pop(str(target / "shard"), None)
            if kept is not None:
                kept.close()
            shutil.rmtree(target, ignore_errors=True)
            raise
        finally:
            self._pinned = None

    def apply_changes(self, rows: Rows, removed: np.ndarray, info: dict) -> None:
        """Upsert ``rows``, delete ``removed`` and rewrite hubless.json, through Qdrant's
        write-ahead log (an interrupted sync is completed by running it again)."""
        from hubless._atomic import write_json

        qd = _qdrant()
        check_point_ids(rows.ids, "Qdrant")
        shard = self._shard()
        if len(rows):
            shard.update(qd.UpdateOperation.upsert_points(_points(qd, rows)))
        if len(removed):
            shard.update(qd.UpdateOperation.delete_points([int(i) for i in removed]))
        shard.flush()
        write_json(self._version() / "hubless.json", info)

    def release(self) -> None:
        with _OPEN_LOCK:
            for key in [k for k in _OPEN if k.startswith(str(self.folder) + "/")]:
                _OPEN.pop(key).close()

    def drop_table(self) -> bool:
        if not self.folder.is_dir():
            return False
        self.release()
        existed = self.exists()
        shutil.rmtree(self.folder, ignore_errors=True)
        return existed


def _points(qd, rows: Rows) -> list:
    aug, pl = rows.augmented.tolist(), rows.plain.tolist()
    meta = rows.metadata
    ids = rows.ids.tolist()
    return [qd.Point(ids[i], {"corrected": aug[i], "plain": pl[i]}, None if meta is None else _payload(meta[i])) for i in range(len(ids))]
