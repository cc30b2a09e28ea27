"""PostgreSQL + pgvector: ``postgresql://user:password@host:port/database/table`` (libpq options after ``?``).

Columns: ``id bigint`` (the item id), ``vector vector(d+1)`` = [r, bias(r)], ``plain vector(d)``
and ``meta jsonb``, written by binary COPY. pgvector's ``<#>`` is the negative inner product, so
``ORDER BY vector <#> query`` ranks by the corrected score and ``score = -distance``. ``ann="HNSW"``
adds an HNSW index with ``vector_ip_ops``; a search sets ``hnsw.ef_search`` (the ``ef_search``
knob, at most 1000 in pgvector) for its transaction. The table's comment holds hubless's info.
An export writes ``_hubless_tmp_<hash>`` (its ANN index included) and swaps it in under the
table's name in one transaction: readers see the old or the new table; a failed or killed
export leaves the temp table, which the next export drops.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import threading
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from hubless.errors import InvalidInput, NotFound, optional_import
from hubless.export.base import StoreUnavailable, StoreURI, VectorStore, check_name, register, without_password
from hubless.export.store_options import positive_int_or_none
from hubless.export.store_rows import Rows


def _psycopg():
    return optional_import("psycopg", "exporting to PostgreSQL", "pgvector", "psycopg")


def _ident(name: str) -> str:
    return '"' + name + '"'


def vector_text(rows: np.ndarray) -> list[str]:
    """pgvector's text form of each (query) row, '[x,y,...]' (float32 round-trip precision)."""
    return ["[" + ",".join(f"{x:.9g}" for x in r) + "]" for r in rows.astype(np.float32).tolist()]


def _binary_rows(ids: np.ndarray, augmented: np.ndarray, plain: np.ndarray, metadata) -> bytes:
    """A whole binary COPY stream of rows (id, vector, plain, meta): the fixed-size fields of
    every row laid out by one numpy structured array (big-endian, pgvector's binary format:
    int16 dim, int16 0, float4 values), the jsonb metadata appended to each row."""
    n, da = augmented.shape
    dp = plain.shape[1]
    fixed = np.zeros(
        n,
        dtype=[
            ("fields", ">i2"),
            ("id_len", ">i4"),
            ("id", ">i8"),
            ("v_len", ">i4"),
            ("v_dim", ">i2"),
            ("v_unused", ">i2"),
            ("v", ">f4", (da,)),
            ("p_len", ">i4"),
            ("p_dim", ">i2"),
            ("p_unused", ">i2"),
            ("p", ">f4", (dp,)),
        ],
    )
    fixed["fields"], fixed["id_len"], fixed["id"] = 4, 8, ids
    fixed["v_len"], fixed["v_dim"], fixed["v"] = 4 + 4 * da, da, augmented
    fixed["p_len"], fixed["p_dim"], fixed["p"] = 4 + 4 * dp, dp, plain
    header = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
    null = (-1).to_bytes(4, "big", signed=True)

    def meta(i: int) -> bytes:
        if metadata is None or not metadata[i]:
            return null
        body = b"\x01" + json.dumps(metadata[i], allow_nan=False).encode()  # jsonb binary: version 1, then the text
        return len(body).to_bytes(4, "big") + body

    rows = fixed.view(np.uint8).reshape(n, -1)
    return header + b"".join(rows[i].tobytes() + meta(i) for i in range(n)) + (-1).to_bytes(2, "big", signed=True)


_OPEN: dict[tuple, Any] = {}  # (dsn, thread) -> a connection kept for searches


@atexit.register
def _close_kept() -> None:
    """Close what searches kept open (at interpreter exit)."""
    for kept in _OPEN.values():
        kept.close()
    _OPEN.clear()


def connect(dsn: str, *, autocommit: bool = False):
    psycopg = _psycopg()
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL at {without_password(dsn)}: {str(exc).strip().splitlines()[0]}") from None


def _search_connection(dsn: str):
    """The kept connection for ``dsn`` (reconnected when it was closed or broken)."""
    key = (dsn, threading.get_ident())  # a connection runs one transaction at a time: one per thread
    conn = _OPEN.get(key)
    if conn is None or conn.closed or conn.broken:
        conn = _OPEN[key] = connect(dsn)
    return conn


def _literal(conn, text: str) -> str:
    """A SQL string literal (COMMENT takes no parameters)."""
    from psycopg import sql

    return sql.Literal(text).as_string(conn)


@dataclass(frozen=True)
class PgvectorOptions:
    """pgvector export options (HNSW only)."""

    m: int | None = field(default=None, metadata={"help": "HNSW links per node (pgvector's default 16)", "ann": ("HNSW",)})
    ef_construction: int | None = field(default=None, metadata={"help": "HNSW build beam (pgvector's default 64)", "ann": ("HNSW",)})

    def __post_init__(self):
        positive_int_or_none(self.m, "m")
        positive_int_or_none(self.ef_construction, "ef_construction")
        m, ef = self.m or 16, self.ef_construction or 64
        if not 2 <= m <= 100 or ef < 2 * m or ef > 1000:
            raise InvalidInput(f"pgvector HNSW needs 2 <= m <= 100 and 2 m <= ef_construction <= 1000; got m={m}, ef_construction={ef}")


@register
class PgvectorStore(VectorStore):
    schemes = ("postgresql", "postgres")
    label = "PostgreSQL + pgvector"
    extra = "pgvector"
    ann_types = {"HNSW": "ef_search"}
    knob_range = {"ef_search": (100, 1000)}  # pgvector's hnsw.ef_search is at most 1000
    Options = PgvectorOptions

    @classmethod
    def uri_form(cls, scheme=None) -> str:
        return f"{scheme or 'postgresql'}://user:password@host:port/database/table"

    @classmethod
    def parse(cls, uri: str) -> StoreURI:
        """The table is the last path segment; the rest is libpq's URI."""
        parts = urlsplit(uri)
        database, slash, table = parts.path.rstrip("/").rpartition("/")
        if not slash or not table or not database:
            raise InvalidInput(f"store URI {uri!r} needs a database and a table: {cls.uri_form(parts.scheme)}")
        return StoreURI(parts.scheme, urlunsplit((parts.scheme, parts.netloc, database, parts.query, "")), check_name(table, uri))

    @property
    def _tmp(self) -> str:
        return "_hubless_tmp_" + hashlib.sha1(self.table.encode()).hexdigest()[:16]

    @contextlib.contextmanager
    def writer_lock(self):
        """A PostgreSQL session advisory lock on the table's name, held on a connection of its
        own (the server releases it if this process dies); waits ``HUBLESS_LOCK_TIMEOUT`` s."""
        from hubless.index.lock import wait_for_lock

        key = f"hubless export {self.table}"
        conn = connect(self.location, autocommit=True)
        try:
            wait_for_lock(
                lambda: conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()[0],
                f"table {self.table!r} in {self.location} is being written by another export or sync (",
            )
            yield
        finally:
            conn.close()  # ends the session, and with it the lock

    @contextlib.contextmanager
    def reading(self):
        """One transaction holding the table's ACCESS SHARE lock for the info and the rows of a
        search: an export's swap (DROP + RENAME) waits for it, so both come from one table."""
        conn = _search_connection(self.location)
        with conn.transaction():
            if self._exists(conn, self.table):
                conn.execute(f"LOCK TABLE {_ident(self.table)} IN ACCESS SHARE MODE")
            yield

    def _exists(self, conn, name: str) -> bool:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_ident(name),)).fetchone()[0]

    def exists(self) -> bool:
        conn = _search_connection(self.location)
        with conn.transaction():
            return self._exists(conn, self.table)

    def clean_leftovers(self) -> None:
        with connect(self.location) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {_ident(self._tmp)}")

    def write_table(self, rows: Rows, info: dict, options, *, batch: int, ann: str | None) -> None:
        n, d = rows.augmented.shape
        tmp = _ident(self._tmp)
        with connect(self.location) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            conn.execute(f"CREATE TABLE {tmp} (id bigint PRIMARY KEY, vector vector({d}), plain vector({rows.plain.shape[1]}), meta jsonb)")
            conn.commit()  # a killed export leaves this table: the next one drops it
            with conn.cursor() as cur:
                for part in rows.batches(batch):
                    with cur.copy(f"COPY {tmp} (id, vector, plain, meta) FROM STDIN WITH (FORMAT BINARY)") as copy:
                        copy.write(_binary_rows(part.ids, part.augmented, part.plain, part.metadata))
            conn.commit()
            if ann is not None:  # built before the swap: the old table serves until the new one is ready
                params = {k: v for k, v in (("m", options.m), ("ef_construction", options.ef_construction)) if v is not None}
                with_ = f" WITH ({', '.join(f'{k} = {int(v)}' for k, v in params.items())})" if params else ""
                conn.execute(f"CREATE INDEX ON {tmp} USING hnsw (vector vector_ip_ops){with_}")
            conn.execute(f"COMMENT ON TABLE {tmp} IS {_literal(conn, json.dumps(info))}")
            conn.execute(f"DROP TABLE IF EXISTS {_ident(self.table)}")
            conn.execute(f"ALTER TABLE {tmp} RENAME TO {_ident(self.table)}")
            conn.commit()

    def read_info(self) -> dict:
        conn = _search_connection(self.location)
        with conn.transaction():
            if not self._exists(conn, self.table):
                raise NotFound(f"no table {self.table!r} in PostgreSQL store {self.location}")
            comment = conn.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (_ident(self.table),)).fetchone()[0]
        try:
            info = json.loads(comment or "")
        except ValueError:
            info = None
        if not isinstance(info, dict) or "format_version" not in info:
            raise InvalidInput(
                f"table {self.table!r} in {self.location} was not written by hubless export (no hubless metadata in its comment)"
            )
        return info

    def write_info(self, info: dict, conn=None) -> None:
        if conn is None:
            with connect(self.location) as own:
                own.execute(f"COMMENT ON TABLE {_ident(self.table)} IS {_literal(own, json.dumps(info))}")
            return
        conn.execute(f"COMMENT ON TABLE {_ident(self.table)} IS {_literal(conn, json.dumps(info))}")

    def native_knobs(self, knob: str, value: int, k: int, options: dict) -> dict:
        return {"ef_search": min(max(value, k), 1000)}  # pgvector returns at most ef_search rows

    def query(self, vectors: np.ndarray, k: int, *, column: str, exact: bool, knobs: dict):
        scores = np.full((len(vectors), k), -np.inf, np.float32)
        ids = np.full((len(vectors), k), -1, np.int64)
        rows: list[list[dict]] = [[] for _ in range(len(vectors))]
        ties = ", id" if exact else ""  # lower id first, as hubless; an ORDER BY beyond the distance bypasses the HNSW index
        sql_text = (
            f"SELECT q.i, t.id, t.dist, t.meta FROM unnest(%s::text[]::vector[]) WITH ORDINALITY AS q(v, i) CROSS JOIN LATERAL "
            f"(SELECT id, meta, {column} <#> q.v AS dist FROM {_ident(self.table)} ORDER BY {column} <#> q.v{ties} LIMIT %s) t "
            "ORDER BY q.i, t.dist, t.id"
        )
        conn = _search_connection(self.location)
        with conn.transaction():
            if exact or not knobs:
                conn.execute("SET LOCAL enable_indexscan = off")
            else:
                conn.execute(f"SET LOCAL hnsw.ef_search = {int(knobs['ef_search'])}")
            result = conn.execute(sql_text, (vector_text(vectors), k)).fetchall()
        slot = np.zeros(len(vectors), np.int64)
        for qi, item, dist, meta in result:
            i = qi - 1
            j = slot[i]
            ids[i, j], scores[i, j] = item, -dist
            rows[i].append({"id": int(item), **(meta or {})})
            slot[i] += 1
        return scores, ids, rows

    def read_rows(self):
        """(ids, [r, bias] rows, metadata) by id (one binary COPY parsed by numpy, one query for the metadata)."""
        conn = _search_connection(self.location)
        table = _ident(self.table)
        with conn.transaction(), conn.cursor() as cur:
            dim = cur.execute(f"SELECT vector_dims(vector) FROM {table} LIMIT 1").fetchone()
            if dim is None:
                return np.empty(0, np.int64), np.empty((0, 0), np.float32), []
            buffer = bytearray()
            with cur.copy(f"COPY (SELECT id, vector FROM {table} ORDER BY id) TO STDOUT (FORMAT BINARY)") as copy:
                for chunk in copy:
                    buffer += chunk
            meta = [m or {} for (m,) in cur.execute(f"SELECT meta FROM {table} ORDER BY id").fetchall()]
        d = dim[0]
        row = np.dtype(
            [
                ("fields", ">i2"),
                ("id_len", ">i4"),
                ("id", ">i8"),
                ("v_len", ">i4"),
                ("v_dim", ">i2"),
                ("v_unused", ">i2"),
                ("v", ">f4", (d,)),
            ]
        )
        body = np.frombuffer(bytes(buffer[19:-2]), dtype=row)  # after the header, before the trailer
        return body["id"].astype(np.int64), body["v"].astype(np.float32), meta

    def apply_changes(self, rows: Rows, removed: np.ndarray, info: dict) -> None:
        """Replace rows (inserting new ones), delete ``removed``, update the comment: one transaction."""
        table = _ident(self.table)
        with connect(self.location) as conn:
            with conn.transaction(), conn.cursor() as cur:
                gone = np.concatenate([rows.ids, removed]).astype(np.int64).tolist()
                cur.execute(f"DELETE FROM {table} WHERE id = ANY(%s)", (gone,))
                if len(rows):
                    with cur.copy(f"COPY {table} (id, vector, plain, meta) FROM STDIN WITH (FORMAT BINARY)") as copy:
                        copy.write(_binary_rows(rows.ids, rows.augmented, rows.plain, rows.metadata))
                self.write_info(info, cur)

    def drop_table(self) -> bool:
        with connect(self.location) as conn:
            existed = self._exists(conn, self.table)
            conn.execute(f"DROP TABLE IF EXISTS {_ident(self.table)}")
            conn.execute(f"DROP TABLE IF EXISTS {_ident(self._tmp)}")
        return bool(existed)
