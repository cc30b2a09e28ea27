"""Qdrant collections as attached collections, both read alike (pages of points with integer
ids): ``qdrant+http://host:port/collection`` (and ``qdrant+https``), a collection of a Qdrant
server (through ``qdrant-client``; its unnamed vector or ``vector_field=``; Dot or Cosine
distance), and ``qdrant://dir/collection``, a shard of Qdrant's in-process engine
(``qdrant-edge-py``) in the directory ``dir/collection`` (the engine lets one holder open a
shard, so a process that holds it open passes its ``EdgeShard`` as ``shard=``). Both search with
``hnsw_ef`` = ``ef_search``, by default :data:`QDRANT_EF_FACTOR` k'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hubless.attached.sources.base import BATCH, SOURCES, Source, as_ids, pad_hits
from hubless.errors import InvalidInput, NotFound, optional_import

__all__ = ["QDRANT_EF_FACTOR", "QdrantEdgeSource", "QdrantSource", "choose_vector", "is_cosine"]

#: Qdrant's default beam for k' candidates: this many times k'. Measured at 100k x 256 (hub-prone
#: synthetic, Qdrant's default m 16, NNN): recall@10 of the attached search against exact
#: corrected search 0.959 with 2 k', 0.972 with 4 k', next to 0.974 for Qdrant's own plain top 10
#: (benchmarks/attach.py; docs/benchmarks/measured.md).
QDRANT_EF_FACTOR = 4


def choose_vector(what: str, named: dict[str, Any] | None, unnamed: Any, vector_field: str | None) -> tuple[str | None, Any]:
    """(name, parameters) of the vector a Qdrant collection or shard is attached by (``what``
    names it in the messages): one of its ``named`` vectors (name -> parameters), chosen by
    ``vector_field`` or the only one, or with ``named`` None its one ``unnamed`` vector. Both
    Qdrant sources choose here."""
    if named is None:
        if vector_field is not None:
            raise InvalidInput(f"{what} has one unnamed vector: leave vector_field out")
        return None, unnamed
    names = ", ".join(map(repr, named))
    if vector_field is None:
        if len(named) != 1:
            raise InvalidInput(f"{what} has the named vectors {names}: choose one with vector_field=")
        vector_field = next(iter(named))
    if vector_field not in named:
        raise InvalidInput(f"{what} has no vector {vector_field!r} (it has {names})")
    return vector_field, named[vector_field]


def is_cosine(what: str, distance: str) -> bool:
    """Whether a Qdrant vector's ``distance`` is Cosine (else Dot); any other distance is refused:
    a correction attaches to Dot or Cosine."""
    distance = distance.lower()
    if distance not in ("dot", "cosine"):
        raise InvalidInput(f"{what} uses the {distance} distance: a correction attaches to Dot or Cosine")
    return distance == "cosine"


def corrected_hits(ranked, probes, weights: np.ndarray, fields, k: int):
    """(scores, ids, found, last) of a formula query per query (``ranked``: its points, their
    score the formula's ``$score - w . fields``) and its plain probe at offset k' - 1 (``probes``:
    one point, or none when the store held fewer than k'): the plain score of each hit is the
    formula's value plus ``w . fields`` of the hit's payload."""
    rows = []
    for points, w in zip(ranked, weights.tolist()):
        rows.append([(p.score + sum(wc * float((p.payload or {}).get(f, 0.0)) for wc, f in zip(w, fields)), p.id) for p in points])
    scores, ids, found = pad_hits(rows, k)
    last = np.array([probe[0].score if probe else np.inf for probe in probes], np.float64)
    return scores, ids, found, last


class _QdrantPoints(Source):
    """What both Qdrant sources (a server's collection, an in-process shard) read alike: pages of
    points (``_pages``, each source's own call) turned into integer ids and vectors."""

    payload_writes = True
    band_search = True
    ranks_corrected = True

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
        return as_ids(ids, f"Qdrant {self.holder} {self.uri}")  # Qdrant's ids go to 2**64 - 1: refused past int64

    def _indexed(self) -> int:
        """How many vectors an HNSW index holds (0: every segment is searched by a full scan)."""
        raise NotImplementedError

    def searches_exactly(self, knobs: dict) -> bool:
        return bool(knobs.get("exact")) or self._indexed() == 0

    @property
    def beam_knob(self) -> str | None:
        return "ef_search" if self._indexed() else None

    def beam_ladder(self, k: int) -> list[int]:
        return [k * f for f in (1, 2, 4, 8, 16, 32)] if self._indexed() else []

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


@SOURCES.register
class QdrantSource(_QdrantPoints):
    """A collection of a Qdrant server (see the module docstring)."""

    kind = "qdrant"
    schemes = ("qdrant+http", "qdrant+https")
    uri_form = "qdrant+http://host:port/collection"
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
        what = f"Qdrant collection {uri}"
        self.vector_field, params = choose_vector(what, vectors if isinstance(vectors, dict) else None, vectors, vector_field)
        self.cosine = is_cosine(what, str(getattr(params.distance, "value", params.distance)))
        self._dim = int(params.size)

    @property
    def dim(self) -> int:
        return self._dim

    def count(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)

    def _indexed(self) -> int:
        return int(self.client.get_collection(self.collection).indexed_vectors_count or 0)

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

    def _add_payload_fields(self, fields):
        schema = self.client.get_collection(self.collection).payload_schema or {}
        for name in fields:  # a float index on each field: the band filters read it (hubless.attached.bands)
            if name not in schema:
                self.client.create_payload_index(self.collection, field_name=name, field_schema=self.models.PayloadSchemaType.FLOAT)

    def _write_payload(self, ids, values, fields):
        models = self.models
        operations = [
            models.SetPayloadOperation(set_payload=models.SetPayload(payload=dict(zip(fields, row)), points=[int(i)]))
            for i, row in zip(ids.tolist(), values.tolist())
        ]
        self.client.batch_update_points(self.collection, update_operations=operations)  # one request per batch

    def _search(self, queries, k, knobs):
        return self._query(queries, k, knobs, None)

    def _search_band(self, queries, k, band, knobs):
        models = self.models
        assert band.fields is not None  # searches_bands: only with the fields hubless wrote
        # some column below its edge: NOT (every column at or above it), so a point without the field is in the band
        beyond = [models.FieldCondition(key=f, range=models.Range(gte=e)) for f, e in zip(band.fields, band.edges)]
        return self._query(queries, k, knobs, models.Filter(must_not=[models.Filter(must=beyond)]))

    def _search_corrected(self, queries, k, kp, weights, fields, knobs):
        models = self.models
        params = self._params(kp, knobs)
        requests = []
        for q, w in zip(queries.tolist(), weights.tolist()):
            formula = models.SumExpression(sum=["$score", *(models.MultExpression(mult=[-wc, f]) for wc, f in zip(w, fields))])
            prefetch = models.Prefetch(query=q, using=self.vector_field, limit=kp, params=params)
            requests.append(
                models.QueryRequest(prefetch=prefetch, query=models.FormulaQuery(formula=formula), limit=k, with_payload=list(fields))
            )
            # the kp-th plain point (the certificate's s_k'), in the same request
            requests.append(
                models.QueryRequest(query=q, using=self.vector_field, limit=1, offset=kp - 1, params=params, with_payload=False)
            )
        answers = self.client.query_batch_points(self.collection, requests=requests)
        return corrected_hits([a.points for a in answers[0::2]], [a.points for a in answers[1::2]], weights, fields, k)

    def _params(self, k, knobs):
        ef = knobs.get("ef_search")
        return self.models.SearchParams(
            exact=bool(knobs.get("exact", False)), hnsw_ef=QDRANT_EF_FACTOR * k if ef is None else max(int(ef), k)
        )

    def _query(self, queries, k, knobs, where):
        models = self.models
        params = self._params(k, knobs)
        requests = [
            models.QueryRequest(query=q, using=self.vector_field, limit=k, params=params, filter=where, with_payload=False)
            for q in queries.tolist()
        ]
        answers = self.client.query_batch_points(self.collection, requests=requests)
        return pad_hits([[(p.score, p.id) for p in a.points] for a in answers], k)


@SOURCES.register
class QdrantEdgeSource(_QdrantPoints):
    """A shard of Qdrant's in-process engine (``qdrant-edge-py``): ``qdrant://dir/collection`` is
    the shard directory ``dir/collection`` (its ``edge_config.json`` gives the vectors' size and
    distance). The engine serves one process at a time."""

    holder = "shard"
    kind = "qdrant"
    schemes = ("qdrant",)
    uri_form = "qdrant://path/collection (in process)"
    knobs = {"ef_search": "HNSW candidates kept per query (hnsw_ef)", "exact": "scan every point (true/false)"}
    # measured at 100,000 x 256: a top-80 at hnsw_ef 80 took 0.87 ms before the write, 7.8 ms
    # after it (a scan), 1.05 ms after optimize() (113 s on 2 cores)
    payload_note = (
        "Qdrant's in-process engine answers the points whose payload changed by a scan until the shard is optimized: "
        "call shard.optimize() once (it rebuilds the HNSW index; the engine does not run its optimizer by itself)"
    )

    def __init__(self, uri: str, *, vector_field: str | None = None, shard=None) -> None:
        super().__init__(uri)
        import json

        from hubless.export.base import split_location

        self.qd = optional_import("qdrant_edge", "attaching to Qdrant in process", "qdrant", "qdrant_edge")
        location, name = split_location(uri, "qdrant", "qdrant://path/collection")
        self.local = Path(location)
        folder = Path(location) / name
        try:
            config = json.loads((folder / "edge_config.json").read_text())
        except (OSError, ValueError):
            hint = " (a collection hubless exported: search it with hubless search instead)" if (folder / "CURRENT").is_file() else ""
            raise NotFound(f"no Qdrant in-process shard at {folder} (no edge_config.json){hint}") from None
        what = f"Qdrant shard {uri}"
        self.vector_field, params = choose_vector(what, config.get("vectors") or {}, None, vector_field)
        self.cosine = is_cosine(what, str(params.get("distance", "")))
        self._dim = int(params["size"])
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

    def _indexed(self) -> int:
        return int(self.shard.info().indexed_vectors_count or 0)

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

    def _add_payload_fields(self, fields):
        schema = self.shard.info().payload_schema or {}
        for name in fields:  # a float index on each field: a band's filter reads it (hubless.attached.bands), no rebuild
            if name not in schema:
                self.shard.update(self.qd.UpdateOperation.create_field_index(name, self.qd.PayloadSchemaType.Float))

    def _write_payload(self, ids, values, fields):
        qd = self.qd
        for i, row in zip(ids.tolist(), values.tolist()):
            self.shard.update(qd.UpdateOperation.set_payload([int(i)], dict(zip(fields, row))))  # merged into the point's payload
        self.shard.flush()

    def _search(self, queries, k, knobs):
        return self._query(queries, k, knobs, None)

    def _search_band(self, queries, k, band, knobs):
        qd = self.qd
        assert band.fields is not None  # searches_bands: only with the fields hubless wrote
        # some column below its edge: NOT (every column at or above it), so a point without the field is in the band
        beyond = [qd.FieldCondition(f, range=qd.RangeFloat(gte=e)) for f, e in zip(band.fields, band.edges)]
        return self._query(queries, k, knobs, qd.Filter(must_not=[qd.Filter(must=beyond)]))

    def _search_corrected(self, queries, k, kp, weights, fields, knobs):
        qd = self.qd
        params = self._params(kp, knobs)
        using = None if self.vector_field == "" else self.vector_field
        requests = []
        for q, w in zip(queries.tolist(), weights.tolist()):
            terms = [qd.Expression.Mult([qd.Expression.Constant(-wc), qd.Expression.Variable(f)]) for wc, f in zip(w, fields)]
            formula = qd.Formula(qd.Expression.Sum([qd.Expression.Variable("$score"), *terms]), defaults=dict.fromkeys(fields, 0.0))
            prefetch = qd.Prefetch(limit=kp, query=qd.Query.Nearest(q, using=using), params=params)
            requests.append(qd.QueryRequest(limit=k, prefetches=[prefetch], query=formula, with_payload=list(fields)))
            # the kp-th plain point (the certificate's s_k'), in the same request
            requests.append(
                qd.QueryRequest(limit=1, offset=kp - 1, query=qd.Query.Nearest(q, using=using), params=params, with_payload=False)
            )
        answers = self.shard.query_batch(qd.QueryBatchRequest(requests))
        return corrected_hits(answers[0::2], answers[1::2], weights, fields, k)

    def _params(self, k, knobs):
        qd = self.qd
        ef = knobs.get("ef_search")
        ef = QDRANT_EF_FACTOR * k if ef is None else max(int(ef), k)  # a beam as long as the list finds its last entries poorly
        return qd.SearchParams(exact=True) if knobs.get("exact") else qd.SearchParams(hnsw_ef=ef)

    def _query(self, queries, k, knobs, where):
        qd = self.qd
        params = self._params(k, knobs)
        using = None if self.vector_field == "" else self.vector_field
        requests = [
            qd.QueryRequest(limit=k, query=qd.Query.Nearest(q, using=using), filter=where, with_payload=False, params=params)
            for q in queries.tolist()
        ]
        answers = self.shard.query_batch(qd.QueryBatchRequest(requests))
        return pad_hits([[(p.score, p.id) for p in hits] for hits in answers], k)

    def close(self) -> None:
        if self._owned:
            self.shard.close()
