"""Plain collections a correction is attached to: a FAISS index file or a vector database
collection that the user wrote (their ids, their vectors, their payloads), read as it is.

A :class:`Source` gives hubless four things, each in bounded batches and by the collection's own
ids: :meth:`Source.scan` ((ids, vectors) of every item), :meth:`Source.scan_ids` (ids only),
:meth:`Source.fetch` (the vectors of given ids) and :meth:`Source.search` (the store's own plain
top-k by inner product, through its ANN index when it has one). Nothing is ever written to the
collection. Every read is counted in :attr:`Source.bytes_read` (8 bytes per id, 4 per float),
so an update can show that it read only what changed.

Sources (:func:`open_source`):

* ``path/to/index.faiss`` (any FAISS index with the inner-product metric; an ``IndexIDMap`` /
  ``IndexIDMap2`` gives the user's ids, else ids are the positions): vectors by
  ``reconstruct_n`` over the inner index, search with ``nprobe`` (IVF) / ``ef_search`` (HNSW;
  default the larger of the index's own and 2 k': a beam as long as the list asked for finds
  its last entries poorly); the file is read again when it is rewritten;
* ``lancedb://dir/table``: columns ``id`` and ``vector`` (``id_field=`` / ``vector_field=`` to
  name others), scanned in record batches, searched with LanceDB's dot (or ``metric="cosine"``)
  distance turned back into a similarity (1 - distance);
* Qdrant (both): ``ef_search`` sets ``hnsw_ef``, by default 4 k' (:data:`QDRANT_EF_FACTOR`);
* ``qdrant://dir/collection``: a shard of Qdrant's in-process engine (``qdrant-edge-py``) in the
  directory ``dir/collection``; the engine lets one holder open a shard, so a process that
  holds it open passes its ``EdgeShard`` as ``shard=``;
* ``qdrant+http://host:port/collection`` (and ``qdrant+https``): a collection of a Qdrant server
  (through ``qdrant-client``; integer point ids; its unnamed vector or ``vector_field=``; Dot or
  Cosine distance), scrolled and searched with ``hnsw_ef`` (``ef_search``);
* ``postgresql://user@host:port/db/table``: a pgvector column (:class:`PgvectorSource`);
* ``chroma://path/collection``: an embedded Chroma collection with integer ids (:class:`ChromaSource`);
* ``milvus://path/file.db/collection``: a Milvus Lite collection (:class:`MilvusSource`).

Every source's count is checked before each search (a changed collection is refused); the
count is free for FAISS, LanceDB, Qdrant and Chroma, a ``count(*)`` for pgvector and Milvus.

A collection whose distance is not an inner product (Euclidean) is refused: its ranking is not
the similarity the correction corrects.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hubless.errors import InvalidInput, MissingFile, NotFound, optional_import

__all__ = [
    "ChromaSource",
    "FaissSource",
    "LanceSource",
    "MilvusSource",
    "PgvectorSource",
    "QdrantEdgeSource",
    "QdrantSource",
    "Source",
    "open_source",
    "sample_hash",
]

#: Items read per batch by default.
BATCH = 8192
#: Ids whose vectors make a collection's sample hash.
SAMPLE = 32
#: Qdrant's default beam for k' candidates: this many times k'. Measured at 100k x 256 (hub-prone
#: synthetic, Qdrant's default m 16, NNN): recall@10 of the attached search against exact
#: corrected search 0.959 with 2 k', 0.972 with 4 k', next to 0.974 for Qdrant's own plain top 10
#: (benchmarks/attach.py; docs/benchmarks/measured.md).
QDRANT_EF_FACTOR = 4


class Source(abc.ABC):
    """A plain collection (see the module docstring)."""

    #: Short name of the kind of collection ("faiss", "lancedb", "qdrant").
    kind: ClassVar[str] = ""
    #: The search knobs this collection takes (name -> help).
    knobs: ClassVar[dict[str, str]] = {}
    #: Whether the store ranks by cosine (then its vectors need not be unit length).
    cosine: bool = False

    def __init__(self, uri: str) -> None:
        self.uri = str(uri)
        self.bytes_read = 0

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The vectors' dimension."""

    @abc.abstractmethod
    def count(self) -> int:
        """How many items the collection holds now."""

    @abc.abstractmethod
    def scan(self, batch: int = BATCH) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids int64, vectors float32) of every item, ``batch`` at a time (in the store's order)."""

    @abc.abstractmethod
    def scan_ids(self, batch: int = BATCH) -> Iterator[np.ndarray]:
        """The ids of every item, ``batch`` at a time (no vector is read)."""

    @abc.abstractmethod
    def _fetch(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids found, their vectors) for ``ids`` (any order; unknown ids left out)."""

    @abc.abstractmethod
    def _search(self, queries: np.ndarray, k: int, knobs: dict) -> tuple[np.ndarray, np.ndarray]:
        """The store's plain top-``k`` by similarity: (scores float32, ids int64), (n, k) each."""

    def fetch(self, ids, batch: int = BATCH) -> np.ndarray:
        """The vectors of ``ids`` in that order, ``batch`` ids per request; an id the collection
        does not hold is :class:`~hubless.errors.NotFound`."""
        ids = np.asarray(ids, np.int64).ravel()
        out = np.empty((ids.size, self.dim), np.float32)
        for lo in range(0, ids.size, batch):
            want = ids[lo : lo + batch]
            got, vectors = self._fetch(want)
            order = np.argsort(got, kind="stable")
            pos = np.searchsorted(got[order], want)
            pos = np.minimum(pos, max(got.size - 1, 0))
            found = got.size > 0 and (got[order][pos] == want)
            if not np.all(found):
                missing = want[~np.asarray(found, bool)] if got.size else want
                raise NotFound(f"{self.uri} holds no item with id {int(missing[0])}")
            out[lo : lo + want.size] = vectors[order][pos]
        return out

    def search(self, queries: np.ndarray, k: int, **knobs) -> tuple[np.ndarray, np.ndarray]:
        """The store's plain top-``k`` (scores, ids), best first, ties to the lower id, empty
        slots id -1 / score -inf. ``knobs``: :attr:`knobs` (others are refused, naming them)."""
        unknown = sorted(set(knobs) - set(self.knobs))
        if unknown:
            valid = ", ".join(f"{name} ({text})" for name, text in self.knobs.items()) or "none"
            raise InvalidInput(f"unknown search option(s) {', '.join(unknown)} for {self.kind} collection {self.uri}; valid: {valid}")
        scores, ids = self._search(np.ascontiguousarray(queries, np.float32), int(k), {k_: v for k_, v in knobs.items() if v is not None})
        return _ordered(scores, ids)

    def payloads(self, ids) -> list[dict]:
        """The stored metadata of ``ids`` (the store's payload or other columns, never the
        vector), one dict per id in that order (empty for an id without any; a FAISS index has
        none)."""
        ids = np.asarray(ids, np.int64).ravel()
        if ids.size == 0:
            return []
        found = self._payloads(np.unique(ids))
        return [dict(found.get(int(i), {})) for i in ids.tolist()]

    def _payloads(self, ids: np.ndarray) -> dict[int, dict]:
        """id -> metadata of the (unique) ``ids`` (hook; none by default)."""
        return {}

    def _count(self, n_ids: int, n_floats: int = 0) -> None:
        self.bytes_read += 8 * int(n_ids) + 4 * int(n_floats)

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what this source holds open (nothing by default)."""


def _ordered(scores: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row best first, ties to the lower id, empty slots (id -1) last with score -inf."""
    scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
    big = np.where(ids < 0, np.iinfo(np.int64).max, ids)
    order = np.lexsort((big, -scores.astype(np.float64)), axis=1)
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1).astype(np.int64)


def _pad(rows: list[list[tuple[float, int]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    scores = np.full((len(rows), k), -np.inf, np.float32)
    ids = np.full((len(rows), k), -1, np.int64)
    for i, hits in enumerate(rows):
        for j, (s, item) in enumerate(hits[:k]):
            scores[i, j], ids[i, j] = s, item
    return scores, ids


def sample_hash(source: Source, ids_sorted: np.ndarray) -> tuple[list[int], str]:
    """(sample ids, sha256 of their ids and vectors as read): :data:`SAMPLE` ids evenly spaced
    over the sorted ids, part of a collection's fingerprint."""
    n = ids_sorted.size
    if n == 0:
        return [], hashlib.sha256(b"").hexdigest()
    picks = np.unique(np.linspace(0, n - 1, min(SAMPLE, n)).astype(np.int64))
    sample = ids_sorted[picks]
    vectors = source.fetch(sample)
    h = hashlib.sha256(sample.astype("<i8").tobytes())
    h.update(np.ascontiguousarray(vectors, "<f4").tobytes())
    return sample.tolist(), h.hexdigest()


# ---------------------------------------------------------------------------------------- FAISS
class FaissSource(Source):
    """A FAISS index file (see the module docstring)."""

    kind = "faiss"
    knobs = {"nprobe": "IVF partitions probed per query", "ef_search": "HNSW candidates kept per query"}

    def __init__(self, uri: str, *, index=None) -> None:
        super().__init__(uri)
        self._faiss = optional_import("faiss", "attaching to a FAISS index", "faiss", "faiss-cpu")
        self.path = None if index is not None else Path(uri)
        self._stamp: tuple[int, int] | None = None
        if index is None:
            index = self._read()
        self._load(index)

    def _read(self):
        assert self.path is not None  # only a source read from a file is read again
        if not self.path.is_file():
            raise MissingFile(f"no FAISS index file {self.uri}")
        stat = self.path.stat()
        try:
            index = self._faiss.read_index(str(self.path))
        except RuntimeError as exc:
            raise InvalidInput(f"{self.uri} is not a FAISS index: {str(exc).splitlines()[0]}") from None
        self._stamp = (stat.st_mtime_ns, stat.st_size)
        return index

    def _fresh(self) -> None:
        """Read the file again when it was rewritten since (the collection changed)."""
        if self.path is None:
            return
        try:
            stat = self.path.stat()
        except OSError:
            raise MissingFile(f"the FAISS index file {self.uri} is gone") from None
        if (stat.st_mtime_ns, stat.st_size) != self._stamp:
            self._load(self._read())

    def _load(self, index) -> None:
        faiss = self._faiss
        uri = self.uri
        self._owner = index  # owns the C++ index: the downcast wrapper below does not
        self.index = faiss.downcast_index(index)
        if self.index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise InvalidInput(
                f"FAISS index {uri} ranks by L2 distance: a correction attaches to an inner-product index (METRIC_INNER_PRODUCT)"
            )
        if hasattr(self.index, "id_map"):  # IndexIDMap / IndexIDMap2: the user's ids
            self.inner = faiss.downcast_index(self.index.index)
            self._ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        else:
            self.inner = self.index
            self._ids = None
        ivf = faiss.try_extract_index_ivf(self.inner)
        if ivf is not None:  # vectors by position (reconstruct_n / reconstruct_batch) need IVF's direct map
            try:
                ivf.make_direct_map()
            except RuntimeError:
                raise InvalidInput(
                    f"FAISS index {uri}: its IVF lists hold non-sequential ids (an IVF with ids of its own, or items removed "
                    "from an IndexIDMap over an IVF, which FAISS does not renumber): wrap a freshly built IVF in IndexIDMap2"
                ) from None
        self._order: np.ndarray | None = None

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def count(self) -> int:
        self._fresh()
        return int(self.index.ntotal)

    def _ids_of(self, lo: int, hi: int) -> np.ndarray:
        return np.arange(lo, hi, dtype=np.int64) if self._ids is None else self._ids[lo:hi]

    def scan(self, batch: int = BATCH):
        n = self.count()
        for lo in range(0, n, batch):
            hi = min(n, lo + batch)
            vectors = self._reconstruct(lo, hi)
            self._count(hi - lo, vectors.size)
            yield self._ids_of(lo, hi), vectors

    def _reconstruct(self, lo: int, hi: int) -> np.ndarray:
        return np.asarray(self.inner.reconstruct_n(lo, hi - lo), np.float32)

    def scan_ids(self, batch: int = BATCH):
        n = self.count()
        for lo in range(0, n, batch):
            hi = min(n, lo + batch)
            self._count(hi - lo)
            yield self._ids_of(lo, hi)

    def _fetch(self, ids):
        self._fresh()
        if self._ids is None:
            hit = (ids >= 0) & (ids < self.count())
            found, positions = ids[hit], ids[hit]
        else:
            if self._order is None:
                self._order = np.argsort(self._ids, kind="stable")
            sorted_ids = self._ids[self._order]
            pos = np.minimum(np.searchsorted(sorted_ids, ids), max(sorted_ids.size - 1, 0))
            hit = (sorted_ids[pos] == ids) if sorted_ids.size else np.zeros(ids.shape, bool)
            found, positions = ids[hit], self._order[pos[hit]]
        vectors = np.asarray(self.inner.reconstruct_batch(np.ascontiguousarray(positions, np.int64)), np.float32)
        vectors = vectors.reshape(found.size, self.dim)
        self._count(found.size, vectors.size)
        return found, vectors

    def _search(self, queries, k, knobs):
        faiss = self._faiss
        params = None
        ef, nprobe = knobs.get("ef_search"), knobs.get("nprobe")
        if ef is None and isinstance(self.inner, faiss.IndexHNSW):
            # a list as long as the beam is poor at its end: at least twice k' (the index's own when larger)
            ef = max(int(self.inner.hnsw.efSearch), 2 * k)
        if ef is not None and isinstance(self.inner, faiss.IndexHNSW):
            params = faiss.SearchParametersHNSW(efSearch=int(ef))
        elif nprobe is not None and faiss.try_extract_index_ivf(self.inner) is not None:
            params = faiss.SearchParametersIVF(nprobe=int(nprobe))
        k_eff = min(k, self.count())
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        if k_eff:
            d, i = self.inner.search(queries, k_eff, params=params) if params is not None else self.inner.search(queries, k_eff)
            found = i >= 0
            scores[:, :k_eff] = np.where(found, d, -np.inf)
            ids[:, :k_eff] = np.where(found, self._ids_of(0, self.count())[np.maximum(i, 0)] if self._ids is not None else i, -1)
        return scores, ids


# ---------------------------------------------------------------------------------------- LanceDB
class LanceSource(Source):
    """A LanceDB table (see the module docstring)."""

    kind = "lancedb"
    knobs = {"nprobe": "IVF partitions probed per query", "refine_factor": "candidates re-scored exactly, x k"}

    def __init__(self, uri: str, *, id_field: str = "id", vector_field: str = "vector", metric: str = "dot") -> None:
        super().__init__(uri)
        from hubless.export.base import split_location

        lancedb = optional_import("lancedb", "attaching to LanceDB", "lancedb", "lancedb")
        location, table = split_location(uri, "lancedb", "lancedb://path/table")
        if metric not in ("dot", "cosine"):
            raise InvalidInput(f"metric must be 'dot' or 'cosine' (an inner product) for an attached LanceDB table; got {metric!r}")
        if not Path(location).is_dir():
            raise NotFound(f"no LanceDB database at {location}")
        db = lancedb.connect(location)
        try:
            self.table = db.open_table(table)
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            raise NotFound(f"no table {table!r} in LanceDB database {location}: {exc}") from None
        names = self.table.schema.names
        for name in (id_field, vector_field):
            if name not in names:
                raise InvalidInput(
                    f"LanceDB table {uri} has no column {name!r} (columns: {', '.join(names)}); name it with id_field= / vector_field="
                )
        self.id_field, self.vector_field, self.metric = id_field, vector_field, metric
        self.cosine = metric == "cosine"
        self._dim = int(self.table.schema.field(vector_field).type.list_size)

    @property
    def dim(self) -> int:
        return self._dim

    def count(self) -> int:
        self.table.checkout_latest()  # the collection's latest version (writers add versions)
        return int(self.table.count_rows())

    def _batches(self, columns: list[str], batch: int, where: str | None = None):
        self.table.checkout_latest()
        query = self.table.search().select(columns).limit(None)
        if where is not None:
            query = query.where(where)
        yield from query.to_batches(batch)

    def _vectors(self, column) -> np.ndarray:
        import pyarrow as pa

        flat = column.flatten() if isinstance(column, (pa.FixedSizeListArray, pa.ListArray)) else column.combine_chunks().flatten()
        return np.asarray(flat.to_numpy(zero_copy_only=False), np.float32).reshape(len(column), self._dim)

    def scan(self, batch: int = BATCH):
        for part in self._batches([self.id_field, self.vector_field], batch):
            ids = part.column(0).to_numpy().astype(np.int64)
            vectors = self._vectors(part.column(1))
            self._count(ids.size, vectors.size)
            yield ids, vectors

    def scan_ids(self, batch: int = BATCH):
        for part in self._batches([self.id_field], batch):
            ids = part.column(0).to_numpy().astype(np.int64)
            self._count(ids.size)
            yield ids

    def _fetch(self, ids):
        where = f"{self.id_field} IN ({', '.join(str(int(i)) for i in ids.tolist())})"
        got, parts = [], []
        for part in self._batches([self.id_field, self.vector_field], max(ids.size, 1), where):
            got.append(part.column(0).to_numpy().astype(np.int64))
            parts.append(self._vectors(part.column(1)))
        found = np.concatenate(got) if got else np.zeros(0, np.int64)
        vectors = np.concatenate(parts) if parts else np.zeros((0, self._dim), np.float32)
        self._count(found.size, vectors.size)
        return found, vectors

    def _payloads(self, ids):
        columns = [c for c in self.table.schema.names if c not in (self.id_field, self.vector_field)]
        if not columns:
            return {}
        where = f"{self.id_field} IN ({', '.join(str(int(i)) for i in ids.tolist())})"
        data = self.table.search().where(where).select([self.id_field, *columns]).limit(None).to_arrow()
        keys = data[self.id_field].to_pylist()
        values = {c: data[c].to_pylist() for c in columns}
        return {int(key): {c: values[c][n] for c in columns} for n, key in enumerate(keys)}

    def _search(self, queries, k, knobs):
        search = self.table.search(queries, vector_column_name=self.vector_field).distance_type(self.metric).limit(k)
        if knobs.get("nprobe") is not None:
            search = search.nprobes(int(knobs["nprobe"]))
        if knobs.get("refine_factor") is not None:
            search = search.refine_factor(int(knobs["refine_factor"]))
        res = search.select([self.id_field, "_distance"]).to_arrow()
        which = res["query_index"].to_numpy() if "query_index" in res.column_names else np.zeros(res.num_rows, np.int64)
        found = res[self.id_field].to_numpy().astype(np.int64)
        sims = 1.0 - res["_distance"].to_numpy().astype(np.float64)
        order = np.lexsort((found, -sims, which))
        which, found, sims = which[order], found[order], sims[order]
        slot = np.arange(order.size) - np.searchsorted(which, which)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        keep = slot < k
        scores[which[keep], slot[keep]] = sims[keep]
        ids[which[keep], slot[keep]] = found[keep]
        return scores, ids


# ---------------------------------------------------------------------------------------- Qdrant
class _QdrantPoints(Source):
    """What both Qdrant sources (a server's collection, an in-process shard) read alike: pages of
    points (``_pages``, each source's own call) turned into integer ids and vectors."""

    #: "collection" or "shard", in messages.
    holder = "collection"
    #: The vectors' dimension, read when the source opens.
    _dim: int

    def _pages(self, batch: int, with_vectors: bool):
        raise NotImplementedError

    def _vector(self, record) -> list[float]:
        raise NotImplementedError

    def _ids(self, records) -> np.ndarray:
        ids = [r.id for r in records]
        if any(not isinstance(i, int) for i in ids):
            raise InvalidInput(f"Qdrant {self.holder} {self.uri} has UUID point ids: hubless attaches to integer ids")
        return np.asarray(ids, np.int64)

    def scan(self, batch: int = BATCH):
        for records in self._pages(batch, True):
            ids = self._ids(records)
            vectors = np.asarray([self._vector(r) for r in records], np.float32).reshape(len(records), self._dim)
            self._count(ids.size, vectors.size)
            yield ids, vectors

    def scan_ids(self, batch: int = BATCH):
        for records in self._pages(batch, False):
            ids = self._ids(records)
            self._count(ids.size)
            yield ids


class QdrantSource(_QdrantPoints):
    """A collection of a Qdrant server (see the module docstring)."""

    kind = "qdrant"
    knobs = {"ef_search": "HNSW candidates kept per query (hnsw_ef)", "exact": "scan every point (true/false)"}

    def __init__(self, uri: str, *, vector_field: str | None = None) -> None:
        super().__init__(uri)
        from hubless.export.base import parse_uri
        from hubless.export.qdrant_server import connect, qdrant_models

        parsed = parse_uri(uri)
        self.models = qdrant_models()
        self.client = connect(parsed.location)
        self.collection = parsed.table
        if not self.client.collection_exists(self.collection):
            raise NotFound(f"no collection {self.collection!r} on the Qdrant server {parsed.location}")
        vectors = self.client.get_collection(self.collection).config.params.vectors
        if isinstance(vectors, dict):
            if vector_field is None:
                if len(vectors) != 1:
                    raise InvalidInput(f"Qdrant collection {uri} has named vectors {', '.join(vectors)}: choose one with vector_field=")
                vector_field = next(iter(vectors))
            if vector_field not in vectors:
                raise InvalidInput(f"Qdrant collection {uri} has no vector {vector_field!r} (it has {', '.join(vectors)})")
            params = vectors[vector_field]
        else:
            if vector_field is not None:
                raise InvalidInput(f"Qdrant collection {uri} has one unnamed vector: leave vector_field out")
            params = vectors
        distance = str(getattr(params.distance, "value", params.distance)).lower()
        if distance not in ("dot", "cosine"):
            raise InvalidInput(f"Qdrant collection {uri} uses the {distance} distance: a correction attaches to Dot or Cosine")
        self.cosine = distance == "cosine"
        self.vector_field, self._dim = vector_field, int(params.size)

    @property
    def dim(self) -> int:
        return self._dim

    def count(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)

    def _vector(self, record) -> list[float]:
        v = record.vector
        return v[self.vector_field] if isinstance(v, dict) else v

    def _pages(self, batch: int, with_vectors: bool):
        offset = None
        while True:
            vectors: Any = ([self.vector_field] if self.vector_field else True) if with_vectors else False
            records, offset = self.client.scroll(self.collection, limit=batch, offset=offset, with_payload=False, with_vectors=vectors)
            if records:
                yield records
            if offset is None:
                return

    def _fetch(self, ids):
        vectors: Any = [self.vector_field] if self.vector_field else True
        records = self.client.retrieve(self.collection, ids=[int(i) for i in ids.tolist()], with_payload=False, with_vectors=vectors)
        found = self._ids(records) if records else np.zeros(0, np.int64)
        out = np.asarray([self._vector(r) for r in records], np.float32).reshape(len(records), self._dim)
        self._count(found.size, out.size)
        return found, out

    def _payloads(self, ids):
        records = self.client.retrieve(self.collection, ids=[int(i) for i in ids.tolist()], with_payload=True, with_vectors=False)
        return {int(r.id): dict(r.payload or {}) for r in records}

    def _search(self, queries, k, knobs):
        models = self.models
        exact = bool(knobs.get("exact", False))
        ef = knobs.get("ef_search")
        params = models.SearchParams(exact=exact, hnsw_ef=QDRANT_EF_FACTOR * k if ef is None else max(int(ef), k))
        requests = [
            models.QueryRequest(query=q, using=self.vector_field, limit=k, params=params, with_payload=False) for q in queries.tolist()
        ]
        answers = self.client.query_batch_points(self.collection, requests=requests)
        return _pad([[(p.score, int(p.id)) for p in a.points] for a in answers], k)


class QdrantEdgeSource(_QdrantPoints):
    """A shard of Qdrant's in-process engine (``qdrant-edge-py``): ``qdrant://dir/collection`` is
    the shard directory ``dir/collection`` (its ``edge_config.json`` gives the vectors' size and
    distance). The engine serves one process at a time."""

    holder = "shard"
    kind = "qdrant"
    knobs = {"ef_search": "HNSW candidates kept per query (hnsw_ef)", "exact": "scan every point (true/false)"}

    def __init__(self, uri: str, *, vector_field: str | None = None, shard=None) -> None:
        super().__init__(uri)
        import json

        from hubless.export.base import split_location

        self.qd = optional_import("qdrant_edge", "attaching to Qdrant in process", "qdrant", "qdrant_edge")
        location, name = split_location(uri, "qdrant", "qdrant://path/collection")
        folder = Path(location) / name
        try:
            config = json.loads((folder / "edge_config.json").read_text())
        except (OSError, ValueError):
            hint = " (a collection hubless exported: search it with hubless search instead)" if (folder / "CURRENT").is_file() else ""
            raise NotFound(f"no Qdrant in-process shard at {folder} (no edge_config.json){hint}") from None
        vectors = config.get("vectors") or {}
        if vector_field is None:
            if len(vectors) != 1:
                raise InvalidInput(f"Qdrant shard {uri} has vectors {', '.join(map(repr, vectors))}: choose one with vector_field=")
            vector_field = next(iter(vectors))
        if vector_field not in vectors:
            raise InvalidInput(f"Qdrant shard {uri} has no vector {vector_field!r} (it has {', '.join(map(repr, vectors))})")
        params = vectors[vector_field]
        distance = str(params.get("distance", "")).lower()
        if distance not in ("dot", "cosine"):
            raise InvalidInput(f"Qdrant shard {uri} uses the {distance} distance: a correction attaches to Dot or Cosine")
        self.cosine = distance == "cosine"
        self.vector_field, self._dim = vector_field, int(params["size"])
        self._owned = shard is None
        if shard is not None:  # the process's own open shard (the engine lets one holder open it)
            self.shard = shard
            return
        try:
            self.shard = self.qd.EdgeShard.load(str(folder))
        except Exception as exc:
            from hubless.export.base import StoreUnavailable

            raise StoreUnavailable(
                f"cannot open the Qdrant shard {folder}: {exc} (Qdrant's in-process engine serves one process at a time)"
            ) from None

    @property
    def dim(self) -> int:
        return self._dim

    def count(self) -> int:
        return int(self.shard.info().points_count)  # kept by the shard: no scan (an exact count reads every point)

    def _vector(self, record) -> list[float]:
        v = record.vector
        return v[self.vector_field] if isinstance(v, dict) else v

    def _with(self) -> Any:
        return True if self.vector_field == "" else [self.vector_field]

    def _pages(self, batch: int, with_vectors: bool):
        offset = None
        while True:
            request = self.qd.ScrollRequest(
                offset=offset, limit=batch, with_vector=self._with() if with_vectors else False, with_payload=False
            )
            records, offset = self.shard.scroll(request)
            if records:
                yield records
            if offset is None:
                return

    def _fetch(self, ids):
        records = self.shard.retrieve([int(i) for i in ids.tolist()], False, self._with())
        found = self._ids(records) if records else np.zeros(0, np.int64)
        out = np.asarray([self._vector(r) for r in records], np.float32).reshape(len(records), self._dim)
        self._count(found.size, out.size)
        return found, out

    def _payloads(self, ids):
        records = self.shard.retrieve([int(i) for i in ids.tolist()], True, False)
        return {int(r.id): dict(r.payload or {}) for r in records}

    def _search(self, queries, k, knobs):
        qd = self.qd
        ef = knobs.get("ef_search")
        ef = QDRANT_EF_FACTOR * k if ef is None else max(int(ef), k)  # a beam as long as the list finds its last entries poorly
        params = qd.SearchParams(exact=True) if knobs.get("exact") else qd.SearchParams(hnsw_ef=ef)
        using = None if self.vector_field == "" else self.vector_field
        requests = [
            qd.QueryRequest(limit=k, query=qd.Query.Nearest(q, using=using), with_payload=False, params=params) for q in queries.tolist()
        ]
        answers = self.shard.query_batch(qd.QueryBatchRequest(requests))
        return _pad([[(p.score, int(p.id)) for p in hits] for hits in answers], k)

    def close(self) -> None:
        if self._owned:
            self.shard.close()


# ---------------------------------------------------------------------------------------- pgvector
class PgvectorSource(Source):
    """A PostgreSQL table with a pgvector column: ``postgresql://user@host:port/db/table``,
    columns ``id`` (an integer) and ``embedding`` (``id_field=`` / ``vector_field=`` to name
    others). Scanned by id with a cursor (``WHERE id > last ORDER BY id LIMIT batch``, vectors by
    binary COPY), searched with ``<#>`` (the negative inner product; ``metric="cosine"``: ``<=>``,
    1 - distance) through the table's index when it has one (``ef_search`` sets
    ``hnsw.ef_search``, ``nprobe`` ``ivfflat.probes``)."""

    kind = "postgresql"
    knobs = {"ef_search": "HNSW candidates kept per query (hnsw.ef_search)", "nprobe": "IVFFlat lists probed (ivfflat.probes)"}

    def __init__(self, uri: str, *, id_field: str = "id", vector_field: str = "embedding", metric: str = "dot") -> None:
        super().__init__(uri)
        import re

        from hubless.export.pgvector_store import PgvectorStore, connect

        parsed = PgvectorStore.parse(uri)
        for name in (id_field, vector_field):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,62}", name):
                raise InvalidInput(f"column name {name!r}: use letters, digits and underscores")
        if metric not in ("dot", "cosine"):
            raise InvalidInput(f"metric must be 'dot' or 'cosine' (an inner product) for an attached pgvector table; got {metric!r}")
        self.conn = connect(parsed.location, autocommit=True)
        self.table, self.id_field, self.vector_field, self.metric = parsed.table, id_field, vector_field, metric
        self.cosine = metric == "cosine"
        row = self.conn.execute(
            "SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a WHERE a.attrelid = to_regclass(%s) AND a.attname = %s",
            (f'"{self.table}"', vector_field),
        ).fetchone()
        if row is None:
            raise NotFound(f"no table {self.table!r} with a column {vector_field!r} in {parsed.location}")
        import re as _re

        match = _re.fullmatch(r"vector\((\d+)\)", row[0])
        if match is None:
            raise InvalidInput(f"column {vector_field!r} of {self.table!r} is {row[0]}, not a pgvector vector(d)")
        self._dim = int(match.group(1))

    @property
    def dim(self) -> int:
        return self._dim

    def _t(self) -> str:
        return f'"{self.table}"'

    def count(self) -> int:
        return int(self.conn.execute(f"SELECT count(*) FROM {self._t()}").fetchone()[0])

    def _copy(self, sql: str, params: tuple) -> tuple[np.ndarray, np.ndarray]:
        from psycopg import sql as psql

        with self.conn.cursor() as cur:
            buffer = bytearray()
            query = psql.SQL(sql).format(*[psql.Literal(p) for p in params])
            with cur.copy(psql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(query)) as copy:
                for chunk in copy:
                    buffer += chunk
        row = np.dtype([("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("v_len", ">i4"), ("v_dim", ">i2"), ("v_unused", ">i2"),
                        ("v", ">f4", (self._dim,))])  # fmt: skip
        body = np.frombuffer(bytes(buffer[19:-2]), dtype=row)  # after the header, before the trailer
        return body["id"].astype(np.int64), body["v"].astype(np.float32)

    def scan(self, batch: int = BATCH):
        last = None
        while True:
            where = "" if last is None else f"WHERE {self.id_field} > {{}} "
            sql = f"SELECT {self.id_field}::bigint, {self.vector_field} FROM {self._t()} {where}ORDER BY {self.id_field} LIMIT {{}}"
            ids, vectors = self._copy(sql, (batch,) if last is None else (last, batch))
            if ids.size == 0:
                return
            self._count(ids.size, vectors.size)
            yield ids, vectors
            last = int(ids[-1])

    def scan_ids(self, batch: int = BATCH):
        last = None
        while True:
            where = "" if last is None else f"WHERE {self.id_field} > %s "
            params = (batch,) if last is None else (last, batch)
            rows = self.conn.execute(f"SELECT {self.id_field} FROM {self._t()} {where}ORDER BY {self.id_field} LIMIT %s", params).fetchall()
            if not rows:
                return
            ids = np.fromiter((r[0] for r in rows), np.int64, len(rows))
            self._count(ids.size)
            yield ids
            last = int(ids[-1])

    def _fetch(self, ids):
        found, vectors = self._copy(
            f"SELECT {self.id_field}::bigint, {self.vector_field} FROM {self._t()} WHERE {self.id_field} = ANY({{}})", (ids.tolist(),)
        )
        self._count(found.size, vectors.size)
        return found, vectors

    def _payloads(self, ids):
        with self.conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {self._t()} WHERE {self.id_field} = ANY(%s)", (ids.tolist(),))
            names = [d.name for d in cur.description or []]
            rows = cur.fetchall()
        keep = [n for n, name in enumerate(names) if name not in (self.id_field, self.vector_field)]
        at = names.index(self.id_field)
        return {int(row[at]): {names[n]: row[n] for n in keep} for row in rows}

    def _search(self, queries, k, knobs):
        from hubless.export.pgvector_store import vector_text

        op = "<#>" if self.metric == "dot" else "<=>"
        sql = (
            f"SELECT q.i, t.id, t.dist FROM unnest(%s::text[]::vector[]) WITH ORDINALITY AS q(v, i) CROSS JOIN LATERAL "
            f"(SELECT {self.id_field}::bigint AS id, {self.vector_field} {op} q.v AS dist FROM {self._t()} "
            f"ORDER BY {self.vector_field} {op} q.v LIMIT %s) t"
        )
        with self.conn.transaction():
            if knobs.get("ef_search") is not None:
                self.conn.execute(f"SET LOCAL hnsw.ef_search = {max(int(knobs['ef_search']), k)}")
            if knobs.get("nprobe") is not None:
                self.conn.execute(f"SET LOCAL ivfflat.probes = {int(knobs['nprobe'])}")
            result = self.conn.execute(sql, (vector_text(queries), k)).fetchall()
        rows: list[list[tuple[float, int]]] = [[] for _ in range(len(queries))]
        for qi, item, dist in result:
            rows[qi - 1].append((-dist if op == "<#>" else 1.0 - dist, int(item)))
        return _pad(rows, k)

    def close(self) -> None:
        self.conn.close()


# ---------------------------------------------------------------------------------------- Chroma
class ChromaSource(Source):
    """A Chroma collection (embedded, ``chroma://path/collection``) whose ids are integers
    written as text; space ``ip`` (score 1 - distance) or ``cosine`` (1 - distance); ``l2`` is
    refused. Read with ``get`` in pages (``limit``/``offset``), searched with ``query``."""

    kind = "chroma"

    def __init__(self, uri: str, *, client=None) -> None:
        super().__init__(uri)
        from hubless.export.base import split_location

        chromadb = optional_import("chromadb", "attaching to Chroma", "chroma", "chromadb")
        location, name = split_location(uri, "chroma", "chroma://path/collection")
        if client is None:
            from chromadb.config import Settings

            if not Path(location).is_dir():
                raise NotFound(f"no Chroma database at {location}")
            path = str(Path(location).absolute())
            try:
                client = chromadb.PersistentClient(path=path, settings=Settings(anonymized_telemetry=False))
            except ValueError:  # this process opened it already with other settings: share that client
                client = chromadb.PersistentClient(path=path)
        try:
            self.collection = client.get_collection(name, embedding_function=None)
        except Exception as exc:  # chromadb raises its own NotFoundError / ValueError
            raise NotFound(f"no collection {name!r} in Chroma database {location}: {exc}") from None
        config = getattr(self.collection, "configuration_json", None) or {}
        space = ((config.get("hnsw") or {}).get("space")) or (self.collection.metadata or {}).get("hnsw:space") or "l2"
        if space not in ("ip", "cosine"):
            raise InvalidInput(f"Chroma collection {uri} uses the {space} space: a correction attaches to ip or cosine")
        self.cosine = space == "cosine"
        first = self.collection.get(limit=1, include=["embeddings"])
        if not first["ids"]:
            raise InvalidInput(f"Chroma collection {uri} is empty")
        self._dim = int(np.asarray(first["embeddings"]).shape[1])

    @property
    def dim(self) -> int:
        return self._dim

    def count(self) -> int:
        return int(self.collection.count())

    def _ids(self, texts) -> np.ndarray:
        try:
            return np.asarray([int(t) for t in texts], np.int64)
        except ValueError:
            raise InvalidInput(f"Chroma collection {self.uri} has ids that are not integers (e.g. {texts[0]!r})") from None

    def _pages(self, batch: int, include: list):
        offset = 0
        while True:
            page = self.collection.get(limit=batch, offset=offset, include=include)
            if not page["ids"]:
                return
            yield page
            offset += len(page["ids"])

    def scan(self, batch: int = BATCH):
        for page in self._pages(batch, ["embeddings"]):
            ids = self._ids(page["ids"])
            vectors = np.asarray(page["embeddings"], np.float32).reshape(ids.size, self._dim)
            self._count(ids.size, vectors.size)
            yield ids, vectors

    def scan_ids(self, batch: int = BATCH):
        for page in self._pages(batch, []):
            ids = self._ids(page["ids"])
            self._count(ids.size)
            yield ids

    def _fetch(self, ids):
        page = self.collection.get(ids=[str(int(i)) for i in ids.tolist()], include=["embeddings"])
        found = self._ids(page["ids"]) if page["ids"] else np.zeros(0, np.int64)
        vectors = (
            np.asarray(page["embeddings"], np.float32).reshape(found.size, self._dim)
            if found.size
            else np.zeros((0, self._dim), np.float32)
        )
        self._count(found.size, vectors.size)
        return found, vectors

    def _payloads(self, ids):
        page = self.collection.get(ids=[str(int(i)) for i in ids.tolist()], include=["metadatas", "documents"])
        out = {}
        for n, key in enumerate(page["ids"]):
            record = dict((page.get("metadatas") or [None] * len(page["ids"]))[n] or {})
            document = (page.get("documents") or [None] * len(page["ids"]))[n]
            if document is not None:
                record["document"] = document
            out[int(key)] = record
        return out

    def _search(self, queries, k, knobs):
        n = self.count()
        depth = min(k, n)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        if depth:
            res = self.collection.query(query_embeddings=queries, n_results=depth, include=["distances"])
            for i, (found, dist) in enumerate(zip(res["ids"], res["distances"])):
                ids[i, : len(found)] = self._ids(found) if found else []
                scores[i, : len(found)] = 1.0 - np.asarray(dist, np.float64)
        return scores, ids


# ---------------------------------------------------------------------------------------- Milvus
class MilvusSource(Source):
    """A Milvus Lite collection: ``milvus://path/file.db/collection`` (or ``milvus://dir/collection``
    for ``dir/milvus.db``, hubless's layout): its INT64 primary key and its one float vector field
    (``vector_field=`` when it has several), metric IP or COSINE (L2 is refused). Read with a
    query iterator, fetched with ``get``, searched with ``search`` (``ef_search`` sets ``ef``;
    Milvus Lite's beam is max(ef, limit), so ``ef`` hits are asked for and the best k kept).
    Milvus Lite opens its file in one process at a time: a process holding it passes its
    ``MilvusClient`` as ``client=``."""

    kind = "milvus"
    knobs = {"ef_search": "HNSW candidates kept per query (ef)"}

    def __init__(self, uri: str, *, vector_field: str | None = None, client=None) -> None:
        super().__init__(uri)
        from hubless.export.base import split_location

        optional_import("pymilvus", "attaching to Milvus", "milvus", "pymilvus")
        location, name = split_location(uri, "milvus", "milvus://path/file.db/collection")
        db = Path(location) if location.endswith(".db") else Path(location) / "milvus.db"
        if client is None:
            from hubless.export.milvus_store import shared_client

            if not db.exists():
                raise NotFound(f"no Milvus Lite database {db}")
            client = shared_client(db)
        self.client, self.name = client, name
        if not client.has_collection(name):
            raise NotFound(f"no collection {name!r} in Milvus Lite database {db}")
        fields = client.describe_collection(name)["fields"]

        def kind(f) -> str:
            return str(getattr(f.get("type"), "name", f.get("type")))

        primary = [f for f in fields if f.get("is_primary")]
        vectors = [f for f in fields if kind(f) == "FLOAT_VECTOR"]
        if not primary or kind(primary[0]) != "INT64":
            raise InvalidInput(f"Milvus collection {uri} needs an INT64 primary key for attach")
        if vector_field is None:
            if len(vectors) != 1:
                raise InvalidInput(f"Milvus collection {uri} has {len(vectors)} float vector fields: choose one with vector_field=")
            vector_field = vectors[0]["name"]
        field = next((f for f in vectors if f["name"] == vector_field), None)
        if field is None:
            raise InvalidInput(f"Milvus collection {uri} has no float vector field {vector_field!r}")
        self.id_field, self.vector_field = primary[0]["name"], vector_field
        self._dim = int(field["params"]["dim"])
        metric = None
        for index in client.list_indexes(name, field_name=vector_field) or []:
            metric = client.describe_index(name, index).get("metric_type")
        metric = (metric or "").upper()
        if metric not in ("IP", "COSINE"):
            raise InvalidInput(
                f"Milvus collection {uri} indexes {vector_field!r} with metric {metric or 'none'}: attach needs IP or COSINE"
            )
        self.metric, self.cosine = metric, metric == "COSINE"
        client.load_collection(name)

    @property
    def dim(self) -> int:
        return self._dim

    def count(self) -> int:
        result = self.client.query(self.name, filter="", output_fields=["count(*)"], consistency_level="Strong")
        return int(result[0]["count(*)"])

    def _iterate(self, batch: int, fields: list[str]):
        it = self.client.query_iterator(self.name, batch_size=batch, filter="", output_fields=fields, consistency_level="Strong")
        try:
            while True:
                page = it.next()
                if not page:
                    return
                yield page
        finally:
            it.close()

    def scan(self, batch: int = BATCH):
        for page in self._iterate(batch, [self.id_field, self.vector_field]):
            ids = np.asarray([r[self.id_field] for r in page], np.int64)
            vectors = np.asarray([r[self.vector_field] for r in page], np.float32).reshape(ids.size, self._dim)
            self._count(ids.size, vectors.size)
            yield ids, vectors

    def scan_ids(self, batch: int = BATCH):
        for page in self._iterate(batch, [self.id_field]):
            ids = np.asarray([r[self.id_field] for r in page], np.int64)
            self._count(ids.size)
            yield ids

    def _fetch(self, ids):
        rows = self.client.get(self.name, ids=[int(i) for i in ids.tolist()], output_fields=[self.vector_field])
        found = np.asarray([r[self.id_field] for r in rows], np.int64)
        vectors = np.asarray([r[self.vector_field] for r in rows], np.float32).reshape(found.size, self._dim)
        self._count(found.size, vectors.size)
        return found, vectors

    def _payloads(self, ids):
        rows = self.client.get(self.name, ids=[int(i) for i in ids.tolist()], output_fields=["*"])
        return {int(r[self.id_field]): {k: v for k, v in r.items() if k not in (self.id_field, self.vector_field)} for r in rows}

    def _search(self, queries, k, knobs):
        ef = max(int(knobs.get("ef_search") or k), k)
        result = self.client.search(
            self.name,
            queries.tolist(),
            limit=min(ef, 16384),
            anns_field=self.vector_field,
            search_params={"metric_type": self.metric, "params": {"ef": ef}},
            consistency_level="Strong",
        )
        return _pad([sorted(((h["distance"], int(h["id"])) for h in hits), key=lambda t: (-t[0], t[1])) for hits in result], k)


# ---------------------------------------------------------------------------------------- opening
def open_source(source, **options) -> Source:
    """The collection ``source`` names: a FAISS index file (a path, or a ``faiss.Index``), a
    ``lancedb://`` table or a ``qdrant+http(s)://`` collection; ``options`` are the source's own
    (``id_field``, ``vector_field``, ``metric``)."""
    if isinstance(source, Source):
        return source
    if not isinstance(source, (str, Path)):
        try:
            import faiss
        except ImportError:  # pragma: no cover - faiss is a dependency of the index
            faiss = None
        if faiss is not None and isinstance(source, faiss.Index):
            return FaissSource("<in-memory FAISS index>", index=source, **options)
        raise InvalidInput(f"source must be a FAISS index file, a faiss.Index or a store URI; got {type(source).__name__}")
    text = str(source)
    scheme, sep, _ = text.partition("://")
    kinds: dict[str, type[Source]] = {
        "lancedb": LanceSource,
        "qdrant": QdrantEdgeSource,
        "qdrant+http": QdrantSource,
        "qdrant+https": QdrantSource,
        "postgresql": PgvectorSource,
        "postgres": PgvectorSource,
        "chroma": ChromaSource,
        "milvus": MilvusSource,
    }
    if sep:
        if scheme not in kinds:
            raise InvalidInput(
                f"cannot attach to {text!r}: attach supports a FAISS index file, lancedb://path/table, "
                "qdrant://path/collection (in process), qdrant+http://host:port/collection, "
                "postgresql://user@host:port/db/table, chroma://path/collection and milvus://path/file.db/collection"
            )
        return kinds[scheme](text, **options)
    allowed = {"id_field", "vector_field", "metric"} & set(options)
    if allowed:
        raise InvalidInput(f"option(s) {', '.join(sorted(allowed))} do not apply to a FAISS index file")
    return FaissSource(text, **options)
