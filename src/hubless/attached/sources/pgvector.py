"""A PostgreSQL table with a pgvector column as an attached collection
(:class:`PgvectorSource`)."""

from __future__ import annotations

import re

import numpy as np

from hubless.attached.sources.base import BATCH, SOURCES, Source, pad_hits, sql_band
from hubless.errors import InvalidInput, NotFound

__all__ = ["PgvectorSource"]


@SOURCES.register
class PgvectorSource(Source):
    """A PostgreSQL table with a pgvector column: ``postgresql://user@host:port/db/table``,
    columns ``id`` (an integer) and ``embedding`` (``id_field=`` / ``vector_field=`` to name
    others). Scanned by id with a cursor (``WHERE id > last ORDER BY id LIMIT batch``, vectors by
    binary COPY), searched with ``<#>`` (the negative inner product; ``metric="cosine"``: ``<=>``,
    1 - distance) through the table's index when it has one (``ef_search`` sets
    ``hnsw.ef_search``, ``nprobe`` ``ivfflat.probes``)."""

    kind = "postgresql"
    payload_writes = True
    band_search = True
    ranks_corrected = True
    schemes = ("postgresql", "postgres")
    uri_form = "postgresql://user@host:port/db/table"
    knobs = {
        "ef_search": "HNSW candidates kept per query (hnsw.ef_search)",
        "nprobe": "IVFFlat lists probed (ivfflat.probes)",
        "exact": "scan every row, without the vector index (true/false)",
    }

    def __init__(self, uri: str, *, id_field: str = "id", vector_field: str = "embedding", metric: str = "dot") -> None:
        super().__init__(uri)
        from hubless.export.base import without_password
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
            raise NotFound(f"no table {self.table!r} with a column {vector_field!r} in {without_password(parsed.location)}")
        match = re.fullmatch(r"vector\((\d+)\)", row[0])
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

    def version(self) -> list[int]:
        """(count, the sum of the rows' ``xmin``): an insert, update or delete changes one (an
        updated row is a new row version with its writer's transaction id); one scan, as the count."""
        row = self.conn.execute(f"SELECT count(*), coalesce(sum(xmin::text::bigint), 0) FROM {self._t()}").fetchone()
        return [int(row[0]), int(row[1])]

    def _index_kind(self) -> str | None:
        """The access method of a vector index on the column ("hnsw", "ivfflat"), or None."""
        row = self.conn.execute(
            "SELECT am.amname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am am ON am.oid = c.relam "
            "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
            "WHERE i.indrelid = to_regclass(%s) AND a.attname = %s AND am.amname IN ('hnsw', 'ivfflat') LIMIT 1",
            (self._t(), self.vector_field),
        ).fetchone()
        return None if row is None else str(row[0])

    def searches_exactly(self, knobs: dict) -> bool:
        return bool(knobs.get("exact")) or self._index_kind() is None

    @property
    def beam_knob(self) -> str | None:
        return {"hnsw": "ef_search", "ivfflat": "nprobe"}.get(self._index_kind() or "")

    def beam_ladder(self, k: int) -> list[int]:
        kind = self._index_kind()
        if kind == "hnsw":  # pgvector's hnsw.ef_search is at most 1000
            return sorted({min(k * f, 1000) for f in (1, 2, 4, 8, 16, 32)})
        return [2**p for p in range(11)] if kind == "ivfflat" else []

    def _copy(self, sql: str, params: tuple) -> tuple[np.ndarray, np.ndarray]:
        from psycopg import sql as psql

        with self.conn.cursor() as cur:
            buffer = bytearray()
            query = psql.SQL(sql).format(*[psql.Literal(p) for p in params])
            with cur.copy(psql.SQL("COPY ({}) TO STDOUT (FORMAT BINARY)").format(query)) as copy:
                for chunk in copy:
                    buffer += chunk
        header = [("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("v_len", ">i4"), ("v_dim", ">i2"), ("v_unused", ">i2")]
        row = np.dtype([*header, ("v", ">f4", (self._dim,))])
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

    def _add_payload_fields(self, fields):
        for name in fields:
            self.conn.execute(f'ALTER TABLE {self._t()} ADD COLUMN IF NOT EXISTS "{name}" real')

    def _write_payload(self, ids, values, fields):
        sets = ", ".join(f'"{f}" = v."{f}"' for f in fields)
        columns = ", ".join(f'"{f}"' for f in fields)
        arrays = ", ".join(["%s::bigint[]", *["%s::real[]"] * len(fields)])
        self.conn.execute(
            f"UPDATE {self._t()} AS t SET {sets} FROM unnest({arrays}) AS v(id, {columns}) WHERE t.{self.id_field} = v.id",
            (ids.tolist(), *[values[:, c].tolist() for c in range(len(fields))]),
        )

    def _search(self, queries, k, knobs):
        return self._query(queries, k, knobs, None)

    def _search_band(self, queries, k, band, knobs):
        return self._query(queries, k, knobs, sql_band(band))

    def _search_corrected(self, queries, k, kp, weights, fields, knobs):
        from hubless.export.pgvector_store import vector_text

        op = "<#>" if self.metric == "dot" else "<=>"
        plain = "-(c.d)" if op == "<#>" else "1 - c.d"
        cols = [f"w{col}" for col in range(len(fields))]
        shift = " + ".join(f"q.{w} * coalesce(c.{f}, 0)" for w, f in zip(cols, fields))  # a row without the value: bias 0
        arrays = ", ".join(["%s::text[]::vector[]"] + ["%s::float8[]"] * len(cols))
        # per query: the index's top-kp (the subquery), re-ordered by the corrected score; its kp-th plain score and count alongside
        sql = (
            f"SELECT q.i, t.id, t.s, t.last, t.n FROM unnest({arrays}) WITH ORDINALITY AS q(v, {', '.join(cols)}, i) CROSS JOIN LATERAL "
            f"(SELECT c.id, {plain} AS s, min({plain}) OVER () AS last, count(*) OVER () AS n FROM "
            f"(SELECT {self.id_field}::bigint AS id, {self.vector_field} {op} q.v AS d, {', '.join(fields)} FROM {self._t()} "
            f"ORDER BY {self.vector_field} {op} q.v LIMIT %s) c ORDER BY {plain} - ({shift}) DESC, c.id LIMIT %s) t"
        )
        columns = [[float(v) for v in weights[:, col]] for col in range(len(cols))]
        with self.conn.transaction():
            self._set_knobs(knobs, kp)
            result = self.conn.execute(sql, (vector_text(queries), *columns, kp, k)).fetchall()
        rows: list[list[tuple[float, int]]] = [[] for _ in range(len(queries))]
        last = np.full(len(queries), np.inf)
        for qi, item, s, kth, count in result:
            rows[qi - 1].append((float(s), int(item)))
            last[qi - 1] = float(kth) if count >= kp else np.inf
        scores, ids, found = pad_hits(rows, k)
        return scores, ids, found, last

    def _set_knobs(self, knobs, k):
        if knobs.get("exact"):  # a sequential scan and a sort: every row scored
            self.conn.execute("SET LOCAL enable_indexscan = off")
        if knobs.get("ef_search") is not None:
            self.conn.execute(f"SET LOCAL hnsw.ef_search = {max(int(knobs['ef_search']), k)}")
        if knobs.get("nprobe") is not None:
            self.conn.execute(f"SET LOCAL ivfflat.probes = {int(knobs['nprobe'])}")

    def _query(self, queries, k, knobs, where):
        from hubless.export.pgvector_store import vector_text

        op = "<#>" if self.metric == "dot" else "<=>"
        sql = (
            f"SELECT q.i, t.id, t.dist FROM unnest(%s::text[]::vector[]) WITH ORDINALITY AS q(v, i) CROSS JOIN LATERAL "
            f"(SELECT {self.id_field}::bigint AS id, {self.vector_field} {op} q.v AS dist FROM {self._t()} "
            + ("" if where is None else f"WHERE {where} ")
            + f"ORDER BY {self.vector_field} {op} q.v LIMIT %s) t"
        )
        with self.conn.transaction():
            self._set_knobs(knobs, k)
            result = self.conn.execute(sql, (vector_text(queries), k)).fetchall()
        rows: list[list[tuple[float, int]]] = [[] for _ in range(len(queries))]
        for qi, item, dist in result:
            rows[qi - 1].append((-dist if op == "<#>" else 1.0 - dist, int(item)))
        return pad_hits(rows, k)

    def close(self) -> None:
        self.conn.close()
