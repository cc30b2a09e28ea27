"""Chroma (embedded, ``chromadb.PersistentClient``): ``chroma://path/collection``.

Each item is a record (id = the item id as text) with the embedding [r, bias(r)] in an HNSW
index with the ``ip`` space (distance 1 - q.r, turned back into q.r; never cosine) and its
metadata (a list of text is kept as JSON text, since Chroma refuses empty lists; None is left
out and read back as None; floats are also kept as exact text, since Chroma reads some back an
ulp or two off). Chroma keeps one embedding per record, so the plain r lives in a
second collection (searched by ``corrected=False``). Chroma has no aliases: the live physical
collections are named in ``path/.hubless/<collection>.json`` (with the hubless info), replaced
atomically by an export once its collections are complete, so readers see the old or the new
ones; the previous ones are dropped by the next export, with any a killed export left.

Chroma always searches its HNSW graph: the ``ef_search`` knob is the depth asked of it
(hnswlib searches with ef = max(ef_search, depth)), and ``exact=True`` asks for every record,
which visits every node the graph reaches. ``ann="HNSW"`` makes the knob's default a measured
one (``target_recall``); an export without ``ann`` is searched at full depth (exact).
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hubless.errors import InvalidInput, NotFound, optional_import
from hubless.export.base import StaleRead, VectorStore, directory_lock, register
from hubless.export.store_options import positive_int_or_none
from hubless.export.store_rows import Rows

_CLIENTS: dict[str, Any] = {}
#: (location, collection) -> the stamp of the pointer file this process last wrote or read.
#: (location, collection) -> the pointer stamps this process wrote or has read since its
#: Chroma clients last (re)started.
_KNOWN: dict[tuple[str, str], set] = {}
#: How many times this process restarted its Chroma clients (a search that saw it retries).
_RESTARTS = [0]
#: The metadata key holding a record's floats as exact JSON text (see :func:`_chroma_meta`).
EXACT_FLOATS = "__hubless_floats"


def _chromadb():
    return optional_import("chromadb", "exporting to Chroma", "chroma", "chromadb")


@dataclass(frozen=True)
class ChromaOptions:
    """Chroma export options (HNSW)."""

    max_neighbors: int | None = field(default=None, metadata={"help": "HNSW links per node (Chroma's default 16)"})
    ef_construction: int | None = field(default=None, metadata={"help": "HNSW build beam (Chroma's default 100)"})

    def __post_init__(self):
        positive_int_or_none(self.max_neighbors, "max_neighbors")
        positive_int_or_none(self.ef_construction, "ef_construction")


@register
class ChromaStore(VectorStore):
    schemes = ("chroma",)
    label = "Chroma"
    extra = "chroma"
    ann_types = {"HNSW": "ef_search"}
    knob_range = {"ef_search": (100, 1 << 20)}
    Options = ChromaOptions

    @property
    def client(self):
        key = str(Path(self.location).absolute())
        if key not in _CLIENTS:
            from chromadb.config import Settings

            _CLIENTS[key] = _chromadb().PersistentClient(path=key, settings=Settings(anonymized_telemetry=False))
        return _CLIENTS[key]

    @property
    def pointer(self) -> Path:
        return Path(self.location) / ".hubless" / f"{self.table}.json"

    def writer_lock(self):
        return directory_lock(self.location, self.table)

    def _write_pointer(self, state: dict) -> None:
        """Replace the pointer file (atomically), with a new stamp this process knows it wrote."""
        from hubless._atomic import write_json

        stamp = uuid.uuid4().hex
        _KNOWN.setdefault((str(Path(self.location).absolute()), self.table), set()).add(stamp)
        write_json(self.pointer, {**state, "stamp": stamp})

    def _fresh(self, state: dict) -> dict:
        """``state`` (just read from the pointer file), after making sure this process's Chroma
        client does not serve a collection another process changed since this one last looked:
        Chroma's embedded client keeps each collection's index in memory and never sees another
        process's writes (a sync from another process went unseen, measured with chromadb 1.5),
        so a pointer stamp this process neither wrote nor read, of a store it has read before,
        restarts its Chroma clients (a search running meanwhile in another thread is retried)."""
        key = (str(Path(self.location).absolute()), self.table)
        stamp = state.get("stamp")
        known = _KNOWN.get(key)
        if known is not None and stamp not in known:
            from chromadb.api.client import SharedSystemClient

            _CLIENTS.clear()
            SharedSystemClient.clear_system_cache()  # every embedded Chroma of this process reads its files again
            _RESTARTS[0] += 1
            known.clear()
        _KNOWN.setdefault(key, set()).add(stamp)
        return state

    def _state(self) -> dict | None:
        try:
            state = json.loads(self.pointer.read_text())
        except (OSError, ValueError):
            return None
        return self._fresh(state) if isinstance(state, dict) else None

    def exists(self) -> bool:
        return self._state() is not None

    def _own(self) -> re.Pattern:
        return re.compile(r"hubless_" + re.escape(self.table) + r"_[0-9a-f]{12}_(vector|plain)")

    def clean_leftovers(self) -> None:
        if not Path(self.location).is_dir():
            return
        state = self._state() or {}
        keep = {state.get("vector"), state.get("plain")}
        for col in self.client.list_collections():
            name = col if isinstance(col, str) else col.name
            if self._own().fullmatch(name) and name not in keep:
                self.client.delete_collection(name)

    def knob_limit(self, knob: str, info: dict) -> int:
        return max(int(info.get("n_items", 1)), 16)

    def write_table(self, rows: Rows, info: dict, options, *, batch: int, ann: str | None) -> None:

        client = self.client
        stem = f"hubless_{self.table}_{uuid.uuid4().hex[:12]}"
        hnsw = {"space": "ip"}
        if options.max_neighbors:
            hnsw["max_neighbors"] = options.max_neighbors
        if options.ef_construction:
            hnsw["ef_construction"] = options.ef_construction
        made = []
        try:
            for column in ("vector", "plain"):
                made.append(client.create_collection(f"{stem}_{column}", configuration={"hnsw": dict(hnsw)}, embedding_function=None))
            vec, plain = made
            for part in rows.batches(min(batch, client.get_max_batch_size())):
                ids = [str(i) for i in part.ids.tolist()]
                meta = _chroma_meta(part.metadata, info["metadata_columns"])
                vec.add(ids=ids, embeddings=part.augmented, metadatas=meta)
                plain.add(ids=ids, embeddings=part.plain)
            self._write_pointer({"vector": vec.name, "plain": plain.name, "info": info})  # the switch
        except BaseException:
            for col in made:
                try:
                    client.delete_collection(col.name)
                except Exception:  # noqa: BLE001 - the next export drops it
                    pass
            raise

    @contextlib.contextmanager
    def reading(self):
        """One pair of collections (and their info) for a search."""
        self._pinned: Any = self._current()
        restarts = _RESTARTS[0]
        try:
            yield
        except Exception as exc:
            text = str(exc).lower()
            if "does not exist" in text or "not found" in text or "missing metadata segment" in text:  # dropped by the exports after next
                raise StaleRead(str(exc)) from None
            if _RESTARTS[0] != restarts:  # the clients restarted under this search (another process wrote)
                raise StaleRead(str(exc)) from None
            raise
        finally:
            self._pinned = None

    def _current(self) -> dict:
        pinned = getattr(self, "_pinned", None)
        if pinned is not None:
            return pinned
        state = self._state()
        if state is None:
            raise NotFound(f"no collection {self.table!r} in Chroma store {self.location}")
        if "info" not in state:
            raise InvalidInput(f"collection {self.table!r} in {self.location} was not written by hubless export")
        return state

    def read_info(self) -> dict:
        return self._current()["info"]

    def write_info(self, info: dict) -> None:

        self._write_pointer({**self._current(), "info": info})

    def native_knobs(self, knob: str, value: int, k: int, options: dict) -> dict:
        return {"depth": max(value, k)}

    def query(self, vectors: np.ndarray, k: int, *, column: str, exact: bool, knobs: dict):
        state = self._current()
        col = self.client.get_collection(state[column], embedding_function=None)
        n = col.count()
        depth = n if exact or not knobs else min(int(knobs["depth"]), n)
        depth = max(min(depth, n), min(k, n))
        scores = np.full((len(vectors), k), -np.inf, np.float32)
        ids = np.full((len(vectors), k), -1, np.int64)
        if n == 0:
            return scores, ids, [[] for _ in range(len(vectors))]
        res = col.query(query_embeddings=np.asarray(vectors, np.float32), n_results=depth, include=["distances"])
        found = []
        for i, (hit_ids, dists) in enumerate(zip(res["ids"], res["distances"])):
            hits = sorted(zip(dists, (int(h) for h in hit_ids)))[:k]  # best first, ties by id
            for j, (dist, item) in enumerate(hits):
                ids[i, j], scores[i, j] = item, 1.0 - dist
            found.append([item for _, item in hits])
        vec = self.client.get_collection(state["vector"], embedding_function=None)
        wanted = sorted({item for hits in found for item in hits})
        got = vec.get(ids=[str(i) for i in wanted], include=["metadatas"]) if wanted else {"ids": [], "metadatas": []}
        meta = {int(i): _from_chroma(m, state["info"].get("metadata_columns")) for i, m in zip(got["ids"], got["metadatas"])}
        rows = [[{"id": item, **meta.get(item, {})} for item in hits] for hits in found]
        return scores, ids, rows

    def read_rows(self):
        state = self._current()
        col = self.client.get_collection(state["vector"], embedding_function=None)
        ids, vecs, meta = [], [], []
        offset, page = 0, 4096
        while True:
            got = col.get(include=["embeddings", "metadatas"], limit=page, offset=offset)
            if not got["ids"]:
                break
            ids += [int(i) for i in got["ids"]]
            vecs.append(np.asarray(got["embeddings"], np.float32))
            meta += [_from_chroma(m, state["info"].get("metadata_columns")) for m in got["metadatas"]]
            offset += len(got["ids"])
        order = np.argsort(ids, kind="stable")
        width = int(state["info"]["dim"]) + int(state["info"]["bias_columns"])
        rows = np.concatenate(vecs) if vecs else np.empty((0, width), np.float32)
        return np.asarray(ids, np.int64)[order], rows[order], [meta[i] for i in order]

    def apply_changes(self, rows: Rows, removed: np.ndarray, info: dict) -> None:
        state = self._current()
        vec = self.client.get_collection(state["vector"], embedding_function=None)
        plain = self.client.get_collection(state["plain"], embedding_function=None)
        step = min(4096, self.client.get_max_batch_size())
        for lo in range(0, len(rows), step):
            part = rows.slice(lo, lo + step)
            ids = [str(i) for i in part.ids.tolist()]
            vec.delete(ids=ids)  # an upsert would keep metadata keys the new record leaves out
            vec.add(ids=ids, embeddings=part.augmented, metadatas=_chroma_meta(part.metadata, info["metadata_columns"]))
            plain.upsert(ids=ids, embeddings=part.plain)
        if len(removed):
            gone = [str(int(i)) for i in removed]
            vec.delete(ids=gone)
            plain.delete(ids=gone)
        self.write_info(info)

    def drop_table(self) -> bool:
        if not Path(self.location).is_dir():
            return False
        existed = self.exists()
        for col in self.client.list_collections():
            name = col if isinstance(col, str) else col.name
            if self._own().fullmatch(name):
                self.client.delete_collection(name)
        self.pointer.unlink(missing_ok=True)
        return existed


def _chroma_meta(records, columns: dict) -> list | None:
    """Chroma metadata: None left out, lists of text as JSON text, and the floats also as exact
    text under ``__hubless_floats`` (Chroma reads 0.10000000000000005 back as
    0.10000000000000003: measured with chromadb 1.5); an empty record is None."""
    if records is None:
        return None
    out = []
    for r in records:
        m = {k: (json.dumps(v) if columns.get(k) == "list<string>" else v) for k, v in (r or {}).items() if v is not None}
        floats = {k: repr(v) for k, v in m.items() if type(v) is float}
        if floats:
            m[EXACT_FLOATS] = json.dumps(floats)
        out.append(m or None)
    return out


def _from_chroma(record, columns: dict | None) -> dict:
    if not record:
        return {}
    record = dict(record)
    floats = json.loads(record.pop(EXACT_FLOATS, None) or "{}")
    out = {k: (json.loads(v) if (columns or {}).get(k) == "list<string>" and isinstance(v, str) else v) for k, v in record.items()}
    out.update({k: float(v) for k, v in floats.items() if k in out})
    return out
