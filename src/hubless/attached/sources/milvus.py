"""A Milvus Lite collection as an attached collection (:class:`MilvusSource`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hubless.attached.sources.base import BATCH, SOURCES, Source, pad_hits
from hubless.errors import InvalidInput, NotFound, optional_import

__all__ = ["MilvusSource"]


@SOURCES.register
class MilvusSource(Source):
    """A Milvus Lite collection: ``milvus://path/file.db/collection`` (or ``milvus://dir/collection``
    for ``dir/milvus.db``, hubless's layout): its INT64 primary key and its one float vector field
    (``vector_field=`` when it has several), metric IP or COSINE (L2 is refused). Read with a
    query iterator, fetched with ``get``, searched with ``search`` (``ef_search`` sets ``ef``;
    Milvus Lite's beam is max(ef, limit), so ``ef`` hits are asked for and the best k kept).
    Milvus Lite opens its file in one process at a time: a process holding it passes its
    ``MilvusClient`` as ``client=``."""

    kind = "milvus"
    payload_writes = True
    band_search = True
    schemes = ("milvus",)
    uri_form = "milvus://path/file.db/collection"
    knobs = {"ef_search": "HNSW candidates kept per query (ef)"}

    def __init__(self, uri: str, *, vector_field: str | None = None, client=None) -> None:
        super().__init__(uri)
        from hubless.export.base import split_location

        optional_import("pymilvus", "attaching to Milvus", "milvus", "pymilvus")
        location, name = split_location(uri, "milvus", "milvus://path/file.db/collection")
        self.local = Path(location)
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
        metric, self.index_type = None, ""
        for index in client.list_indexes(name, field_name=vector_field) or []:
            described = client.describe_index(name, index)
            metric, self.index_type = described.get("metric_type"), str(described.get("index_type") or "").upper()
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

    def searches_exactly(self, knobs: dict) -> bool:
        return self.index_type == "FLAT"  # a FLAT index scores every vector

    @property
    def beam_knob(self) -> str | None:
        return "ef_search" if self.index_type == "HNSW" else None

    def beam_ladder(self, k: int) -> list[int]:
        return sorted({min(k * f, 16384) for f in (1, 2, 4, 8, 16, 32)}) if self.index_type == "HNSW" else []

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

    def _add_payload_fields(self, fields):
        described = self.client.describe_collection(self.name)
        declared = {f["name"]: str(getattr(f.get("type"), "name", f.get("type"))) for f in described["fields"]}
        for name in fields:
            if name in declared and declared[name] not in ("FLOAT", "DOUBLE"):
                raise InvalidInput(f"Milvus collection {self.uri} has a field {name!r} of type {declared[name]}, not FLOAT")
            if name not in declared and not described.get("enable_dynamic_field"):
                raise InvalidInput(
                    f"Milvus collection {self.uri} has no field {name!r} and no dynamic fields: add a FLOAT field {name!r} "
                    "to its schema (or create it with enable_dynamic_field=True)"
                )

    def _write_payload(self, ids, values, fields):
        rows = [{self.id_field: int(i), **{f: float(v) for f, v in zip(fields, row)}} for i, row in zip(ids.tolist(), values.tolist())]
        self.client.upsert(self.name, rows, partial_update=True)  # these fields only: the vectors are kept

    def _search(self, queries, k, knobs):
        return self._query(queries, k, knobs, "")

    def _search_band(self, queries, k, band, knobs):
        assert band.fields is not None  # searches_bands: only with the fields hubless wrote
        return self._query(queries, k, knobs, " or ".join(f"{f} < {float(e)!r}" for f, e in zip(band.fields, band.edges)))

    def _query(self, queries, k, knobs, where: str):
        ef = max(int(knobs.get("ef_search") or k), k)
        result = self.client.search(
            self.name,
            queries.tolist(),
            filter=where,
            limit=min(ef, 16384),
            anns_field=self.vector_field,
            search_params={"metric_type": self.metric, "params": {"ef": ef}},
            consistency_level="Strong",
        )
        return pad_hits([sorted(((h["distance"], int(h["id"])) for h in hits), key=lambda t: (-t[0], t[1])) for hits in result], k)
