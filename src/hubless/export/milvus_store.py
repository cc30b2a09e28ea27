"""Milvus Lite (embedded, ``pymilvus`` + ``milvus-lite``): ``milvus://path/collection``.

The database is the file ``path/milvus.db``. Fields: ``id`` (INT64 primary key, the item id),
``vector`` = [r, bias(r)] and ``plain`` = r (FLOAT_VECTOR, metric IP: inner product, never
COSINE) and ``meta`` (JSON, nullable). The hubless info is a collection property. ``collection``
is an alias: an export writes ``<collection>__hubless_<hex>`` and switches the alias to it in one
step (readers see the old or the new collection); the previous one is dropped by the next
export, with any a killed export left.

Without ``ann`` both vectors get a FLAT index (exact). ``ann="HNSW"`` indexes ``vector`` with
HNSW (searched with ``ef``, the ``ef_search`` knob); ``exact=True`` on it keeps ``ef`` = the
collection size (every node the graph reaches), since Milvus has no per-query scan of an
indexed field. Milvus Lite 3 (pure Python, FAISS per segment) does not honour IVF's ``nlist``
(so IVF is not offered), and once a segment's HNSW index is built it ignores ``ef``: its search
beam is max(ef, limit). So a search asks Milvus for ``ef`` hits and keeps the best ``k`` (the
``ef_search`` knob still widens the beam; measured on 3,000 x 32 hub-prone data: recall@10 0.81 at
ef 10, 0.996 at 100, 1.0 at 1,000). After writing, an export waits until every row is indexed and
reloads the collection: until then Milvus scans the segments it loaded before indexing, and a
recall measured then (by ``target_recall``) would be the scan's 1.0, not the index's.

One process at a time: Milvus Lite opens its database file exclusively; a second process is
refused with :class:`~hubless.export.base.StoreUnavailable`.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hubless.errors import Busy, InvalidInput, NotFound, optional_import
from hubless.export.base import StaleRead, StoreUnavailable, VectorStore, directory_lock, register
from hubless.export.store_options import positive_int_or_none
from hubless.export.store_rows import Rows

DB_FILE = "milvus.db"
#: Milvus's largest ef / nprobe.
MAX_EF, MAX_NPROBE = 32768, 65536
#: Milvus's largest number of hits per query.
MAX_TOPK = 16384

_CLIENTS: dict[str, Any] = {}  # database file -> client (Milvus Lite: one per process)
_LOADED: set[tuple[str, str]] = set()  # (database file, collection) known to be loaded


@atexit.register
def _close_kept() -> None:
    for client in _CLIENTS.values():
        try:
            client.close()
        except Exception:  # noqa: BLE001 - closing at exit
            pass
    _CLIENTS.clear()


def _pymilvus():
    return optional_import("pymilvus", "exporting to Milvus Lite", "milvus", "pymilvus")


@dataclass(frozen=True)
class MilvusOptions:
    """Milvus export options (ANN only)."""

    m: int | None = field(default=None, metadata={"help": "HNSW links per node (default 16)", "ann": ("HNSW",)})
    ef_construction: int | None = field(default=None, metadata={"help": "HNSW build beam (default 200)", "ann": ("HNSW",)})

    def __post_init__(self):
        for name in ("m", "ef_construction"):
            positive_int_or_none(getattr(self, name), name)


def shared_client(db_file: Path):
    """The process's one client of a Milvus Lite database file (Milvus Lite serves one process,
    and a second client of the same file in one process fails): every store and attached source
    of that file shares it."""
    key = str(Path(db_file).absolute())
    if key not in _CLIENTS:
        pymilvus = _pymilvus()
        try:
            _CLIENTS[key] = pymilvus.MilvusClient(key)
        except pymilvus.exceptions.MilvusException as exc:
            raise StoreUnavailable(
                f"cannot open Milvus Lite database {key} ({exc.message}): Milvus Lite serves one process at a time "
                "(is it open in another process?)"
            ) from None
    return _CLIENTS[key]


@register
class MilvusLiteStore(VectorStore):
    schemes = ("milvus",)
    label = "Milvus Lite"
    extra = "milvus"
    ann_types = {"HNSW": "ef_search"}
    knob_range = {"ef_search": (64, 4096)}
    Options = MilvusOptions
    process_limit = "one process at a time"

    @property
    def db_file(self) -> Path:
        return Path(self.location) / DB_FILE

    @property
    def client(self):
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        return shared_client(self.db_file)

    def writer_lock(self):
        return directory_lock(self.location, self.table)

    def _target(self) -> str | None:
        if not self.db_file.exists():
            return None
        client = self.client
        for name in client.list_collections():
            if self.table in (client.list_aliases(name).get("aliases") or []):
                return name
        return self.table if client.has_collection(self.table) else None

    def _own(self) -> re.Pattern:
        return re.compile(re.escape(self.table) + r"__hubless_[0-9a-f]{12}")

    def exists(self) -> bool:
        return self._target() is not None

    def clean_leftovers(self) -> None:
        if not self.db_file.exists():
            return
        keep = self._target()
        for name in self.client.list_collections():
            if self._own().fullmatch(name) and name != keep:
                self.client.drop_collection(name)

    def knob_limit(self, knob: str, info: dict) -> int:
        return min(MAX_EF, max(int(info.get("n_items", 0)), 16))

    def write_table(self, rows: Rows, info: dict, options, *, batch: int, ann: str | None) -> None:
        pymilvus = _pymilvus()
        client = self.client
        DataType = pymilvus.DataType
        old = self._target()
        new = f"{self.table}__hubless_{uuid.uuid4().hex[:12]}"
        schema = client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.INT64, is_primary=True)
        schema.add_field("vector", DataType.FLOAT_VECTOR, dim=int(rows.augmented.shape[1]))
        schema.add_field("plain", DataType.FLOAT_VECTOR, dim=int(rows.plain.shape[1]))
        schema.add_field("meta", DataType.JSON, nullable=True)
        params = client.prepare_index_params()
        if ann == "HNSW":
            hnsw = {"M": options.m or 16, "efConstruction": options.ef_construction or 200}
            params.add_index("vector", index_type="HNSW", metric_type="IP", params=hnsw)
        else:
            params.add_index("vector", index_type="FLAT", metric_type="IP")
        params.add_index("plain", index_type="FLAT", metric_type="IP")
        client.create_collection(new, schema=schema, consistency_level="Strong")  # searches see every written row
        try:
            # not create_collection(index_params=...): pymilvus then waits for the index by asking
            # Milvus Lite for its state, which may answer "no index" for an index it has just made
            # (seen under a concurrent reader); _wait_for_index waits for it below, and loads
            client.create_index(new, params, sync=False)
            for part in rows.batches(batch):
                client.insert(new, _entities(part))
            client.flush(new)
            _wait_for_index(client, new)
            client.alter_collection_properties(new, properties={"hubless": json.dumps(info)})
            if old is not None and old != self.table:
                client.alter_alias(new, self.table)  # one step: readers see the old or the new collection
            else:
                if old == self.table:  # a plain collection of that name (not made by hubless)
                    client.drop_collection(self.table)
                client.create_alias(new, self.table)
        except BaseException:
            try:
                client.drop_collection(new)
            except Exception:  # noqa: BLE001 - the next export drops it
                pass
            raise

    @contextlib.contextmanager
    def reading(self):
        """One physical collection for the info and the rows of a search."""
        self._pinned: Any = self._physical()
        try:
            yield
        except Exception as exc:
            if "not found" in str(exc).lower() or "not exist" in str(exc).lower():  # dropped by the exports after next
                raise StaleRead(str(exc)) from None
            raise
        finally:
            self._pinned = None

    def _physical(self) -> str:
        pinned = getattr(self, "_pinned", None)
        if pinned is not None:
            return pinned
        name = self._target()
        if name is None:
            raise NotFound(f"no collection {self.table!r} in Milvus Lite store {self.location}")
        key = (str(self.db_file.absolute()), name)
        if key not in _LOADED:  # a database opened again starts with its collections released
            if str(self.client.get_load_state(name).get("state")).lower().endswith("notload"):
                self.client.load_collection(name)
            _LOADED.add(key)
        return name

    def read_info(self) -> dict:
        name = self._physical()
        raw = (self.client.describe_collection(name).get("properties") or {}).get("hubless")
        if raw is None:
            raise InvalidInput(f"collection {self.table!r} in {self.location} was not written by hubless export (no hubless property)")
        return json.loads(raw)

    def write_info(self, info: dict) -> None:
        self.client.alter_collection_properties(self._physical(), properties={"hubless": json.dumps(info)})

    def native_knobs(self, knob: str, value: int, k: int, options: dict) -> dict:
        return {"ef": min(max(value, k), MAX_EF)}

    def query(self, vectors: np.ndarray, k: int, *, column: str, exact: bool, knobs: dict):
        name = self._physical()
        info = self.read_info() if exact and column == "vector" else None
        if info is not None and info.get("ann"):  # no per-query scan of an indexed field: the widest beam
            knobs = self.native_knobs("ef_search", int(info["n_items"]), k, {})
        params = {"metric_type": "IP", "params": dict(knobs)}
        # Milvus Lite 3 ignores ``ef`` once a segment's HNSW index is built; its FAISS search uses a
        # beam of max(ef, limit), so the beam is set by asking for ``ef`` hits and keeping the best k
        limit = min(max(k, int(knobs.get("ef", k))), MAX_TOPK)
        result = self.client.search(
            name,
            np.asarray(vectors, np.float32).tolist(),
            limit=limit,
            anns_field=column,
            search_params=params,
            output_fields=["meta"],
            consistency_level="Strong",
        )
        scores = np.full((len(vectors), k), -np.inf, np.float32)
        ids = np.full((len(vectors), k), -1, np.int64)
        rows = []
        for i, hits in enumerate(result):
            hits = sorted(hits, key=lambda h: (-h["distance"], h["id"]))[:k]
            for j, hit in enumerate(hits):
                ids[i, j], scores[i, j] = hit["id"], hit["distance"]
            rows.append([{"id": int(h["id"]), **((h.get("entity") or {}).get("meta") or {})} for h in hits])
        return scores, ids, rows

    def read_rows(self):
        name = self._physical()
        it = self.client.query_iterator(name, batch_size=4096, filter="id >= -9223372036854775807", output_fields=["id", "vector", "meta"])
        ids, vecs, meta = [], [], []
        try:
            while True:
                page = it.next()
                if not page:
                    break
                ids += [r["id"] for r in page]
                vecs += [r["vector"] for r in page]
                meta += [r.get("meta") or {} for r in page]
        finally:
            it.close()
        order = np.argsort(ids, kind="stable")
        return np.asarray(ids, np.int64)[order], np.asarray(vecs, np.float32).reshape(len(ids), -1)[order], [meta[i] for i in order]

    def apply_changes(self, rows: Rows, removed: np.ndarray, info: dict) -> None:
        name = self._physical()
        for lo in range(0, len(rows), 8192):
            self.client.upsert(name, _entities(rows.slice(lo, lo + 8192)))
        if len(removed):
            self.client.delete(name, ids=[int(i) for i in removed])
        self.client.flush(name)
        _wait_for_index(self.client, name)
        self.write_info(info)

    def release(self) -> None:
        """Close the client and stop Milvus Lite's in-process server for this database file, so
        another process can open it."""
        key = str(self.db_file.absolute())
        client = _CLIENTS.pop(key, None)
        _LOADED.difference_update({k for k in _LOADED if k[0] == key})
        if client is not None:
            client.close()
            try:
                from milvus_lite.server_manager import server_manager_instance
            except ImportError:  # another Milvus Lite: its client's close() is all there is
                return
            server_manager_instance.release_server(key)

    def drop_table(self) -> bool:
        if not self.db_file.exists():
            return False
        existed = self._target() is not None
        try:
            self.client.drop_alias(self.table)
        except Exception:  # noqa: BLE001 - no alias
            pass
        for name in self.client.list_collections():
            if self._own().fullmatch(name):
                self.client.drop_collection(name)
        return existed


def _wait_for_index(client, name: str, timeout: float = 3600.0) -> None:
    """Until every row of ``vector`` is indexed (Milvus builds indexes of flushed segments in the
    background; until then it scans them, and a recall measured meanwhile would be the scan's)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = client.describe_index(name, "vector")
        except _pymilvus().exceptions.MilvusException as exc:
            if "no index" not in str(exc).lower():
                raise
            state = None
        if not state:  # an index just made, not yet visible to its state query
            time.sleep(0.1)
            continue
        if int(state.get("pending_index_rows", 0)) == 0 and int(state.get("indexed_rows", 0)) >= int(state.get("total_rows", 0)):
            # the loaded collection keeps scanning the segments it held before they were indexed:
            # reload it so searches (and a recall measured now) go through the index
            client.release_collection(name)
            for attempt in range(10):  # Milvus Lite may still be writing a segment file it just indexed
                try:
                    client.load_collection(name)
                    return
                except _pymilvus().exceptions.MilvusException:
                    if attempt == 9:
                        raise
                    time.sleep(0.5)
        time.sleep(0.1)
    raise Busy(f"Milvus did not finish indexing {name} within {timeout:.0f} s")


def _entities(rows: Rows) -> list[dict]:
    aug, pl, ids = rows.augmented.tolist(), rows.plain.tolist(), rows.ids.tolist()
    meta = rows.metadata
    return [
        {"id": ids[i], "vector": aug[i], "plain": pl[i], "meta": (meta[i] or None) if meta is not None else None} for i in range(len(ids))
    ]
