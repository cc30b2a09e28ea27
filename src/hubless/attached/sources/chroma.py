"""An embedded Chroma collection with integer ids as an attached collection
(:class:`ChromaSource`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hubless.attached.sources.base import BATCH, SOURCES, Source, as_ids
from hubless.errors import InvalidInput, NotFound, optional_import

__all__ = ["ChromaSource"]


@SOURCES.register
class ChromaSource(Source):
    """A Chroma collection (embedded, ``chroma://path/collection``) whose ids are integers
    written as text; space ``ip`` (score 1 - distance) or ``cosine`` (1 - distance); ``l2`` is
    refused. Read with ``get`` in pages (``limit``/``offset``), searched with ``query``."""

    kind = "chroma"
    payload_writes = True
    band_search = True
    schemes = ("chroma",)
    uri_form = "chroma://path/collection"

    def __init__(self, uri: str, *, client=None) -> None:
        super().__init__(uri)
        from hubless.export.base import split_location

        chromadb = optional_import("chromadb", "attaching to Chroma", "chroma", "chromadb")
        location, name = split_location(uri, "chroma", "chroma://path/collection")
        self.local = Path(location)
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
            values = [int(t) for t in texts]
        except ValueError:
            raise InvalidInput(f"Chroma collection {self.uri} has ids that are not integers (e.g. {texts[0]!r})") from None
        return as_ids(values, f"Chroma collection {self.uri}")

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

    def _write_payload(self, ids, values, fields):
        records = [{f: float(v) for f, v in zip(fields, row)} for row in values.tolist()]
        self.collection.update(ids=[str(int(i)) for i in ids.tolist()], metadatas=records)  # merged into each item's metadata

    def _search(self, queries, k, knobs):
        return self._query(queries, k, None)

    def _search_band(self, queries, k, band, knobs):
        assert band.fields is not None  # searches_bands: only with the fields hubless wrote
        below = [{f: {"$lt": float(e)}} for f, e in zip(band.fields, band.edges)]  # Chroma has no test for a missing key
        return self._query(queries, k, below[0] if len(below) == 1 else {"$or": below})

    def _query(self, queries, k, where):
        n = self.count()
        depth = min(k, n)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        filled = np.zeros((len(queries), k), bool)
        if depth:
            res = self.collection.query(query_embeddings=queries, n_results=depth, where=where, include=["distances"])
            for i, (found, dist) in enumerate(zip(res["ids"], res["distances"])):
                ids[i, : len(found)] = self._ids(found) if found else []
                scores[i, : len(found)] = 1.0 - np.asarray(dist, np.float64)
                filled[i, : len(found)] = True
        return scores, ids, filled
