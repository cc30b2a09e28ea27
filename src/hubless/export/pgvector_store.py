"""PostgreSQL + pgvector store: [r, bias] and plain r as ``vector`` columns, searched by ``<#>``.

pgvector's ``<#>`` is the negative inner product, so ``ORDER BY vector <#> query`` ranks by the
corrected score and ``score = -distance``. An ANN variant adds an HNSW index with
``vector_ip_ops`` (inner product); a search then sets ``hnsw.ef_search`` for its transaction.
The table's comment holds hubless's metadata (format version, spec, model, metric, dims).
"""

from __future__ import annotations

import atexit
import contextlib
import json

import numpy as np

from hubless.errors import AlreadyExists, InvalidInput, MissingDependencyError, NotFound

#: HNSW candidates examined per query (pgvector's default is 40); at least 4 x top_k.
EF_SEARCH = 100
ANN_TYPES = ("HNSW",)


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise MissingDependencyError("exporting to PostgreSQL", "psycopg", "pgvector") from None
    return psycopg


def _ident(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise InvalidInput(f"table name {name!r}: use letters, digits and underscores only")
    return '"' + name + '"'


def _vector_text(rows: np.ndarray) -> list[str]:
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
            ("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"),
            ("v_len", ">i4"), ("v_dim", ">i2"), ("v_unused", ">i2"), ("v", ">f4", (da,)),
            ("p_len", ">i4"), ("p_dim", ">i2"), ("p_unused", ">i2"), ("p", ">f4", (dp,)),
        ],
    )  # fmt: skip
    fixed["fields"], fixed["id_len"], fixed["id"] = 4, 8, ids
    fixed["v_len"], fixed["v_dim"], fixed["v"] = 4 + 4 * da, da, augmented
    fixed["p_len"], fixed["p_dim"], fixed["p"] = 4 + 4 * dp, dp, plain
    header = b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
    null = (-1).to_bytes(4, "big", signed=True)

    def meta(i: int) -> bytes:
        if metadata is None or metadata[i] is None:
            return null
        body = b"\x01" + json.dumps(metadata[i]).encode()  # jsonb binary: version 1, then the text
        return len(body).to_bytes(4, "big") + body

    rows = fixed.view(np.uint8).reshape(n, -1)
    return header + b"".join(rows[i].tobytes() + meta(i) for i in range(n)) + (-1).to_bytes(2, "big", signed=True)


_OPEN: dict[str, object] = {}  # dsn -> a connection kept for searches (one per process and database)


@atexit.register
def _close_kept() -> None:
    """Close what searches kept open (at interpreter exit)."""
    for kept in _OPEN.values():
        kept.close()
    _OPEN.clear()


def _connect(dsn: str, *, autocommit: bool = False):
    psycopg = _psycopg()
    try:
        return psycopg.connect(dsn, autocommit=autocommit)
    except psycopg.OperationalError as exc:
        raise ConnectionError(f"cannot connect to PostgreSQL at {dsn}: {str(exc).strip().splitlines()[0]}") from None


def _search_connection(dsn: str):
    """The kept connection for ``dsn`` (reconnected when it was closed or broken)."""
    conn = _OPEN.get(dsn)
    if conn is None or conn.closed or conn.broken:
        conn = _OPEN[dsn] = _connect(dsn)
    return conn


@contextlib.contextmanager
def writer_lock(location: str, table: str):
    """One writer at a time per table (export, sync): a PostgreSQL session advisory lock on the
    table's name, held on a connection of its own (the server releases it if this process
    dies); waits ``HUBLESS_LOCK_TIMEOUT`` s (60) like an index's lock."""
    from hubless.index.lock import wait_for_lock

    key = f"hubless export {table}"
    conn = _connect(location, autocommit=True)
    try:
        wait_for_lock(
            lambda: conn.execute("SELECT pg_try_advisory_lock(hashtext(%s))", (key,)).fetchone()[0],
            f"table {table!r} in {location} is being written by another export or sync (",
        )
        yield
    finally:
        conn.close()  # ends the session, and with it the lock


def _exists(conn, table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (_ident(table),)).fetchone()[0]


def write(
    location: str,
    table: str,
    augmented: np.ndarray,
    plain: np.ndarray,
    metadata,
    info: dict,
    *,
    overwrite: bool,
    batch: int = 8192,
    ann: str | None = None,
    **_,
):
    """Write into a new table, then swap it in under ``table`` in one transaction (the previous
    table stays intact if anything fails before). ``ann="HNSW"`` adds an inner-product HNSW index."""
    from hubless.progress import progress_bar

    if ann is not None and ann.upper() not in ANN_TYPES:
        raise InvalidInput(f"unsupported pgvector index {ann!r}; choose {' or '.join(ANN_TYPES)}")
    tmp = f"{table}__hubless_tmp"
    n, d = augmented.shape
    with _connect(location) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        if _exists(conn, table) and not overwrite:
            raise AlreadyExists(f"table {table!r} exists in {location}: pass overwrite=True (--overwrite) to replace it")
        conn.execute(f"DROP TABLE IF EXISTS {_ident(tmp)}")
        conn.execute(f"CREATE TABLE {_ident(tmp)} (id bigint PRIMARY KEY, vector vector({d}), plain vector({plain.shape[1]}), meta jsonb)")
        conn.commit()
        with conn.cursor() as cur:
            for lo in progress_bar(range(0, n, batch), None, desc="export"):
                hi = min(lo + batch, n)
                with cur.copy(f"COPY {_ident(tmp)} (id, vector, plain, meta) FROM STDIN WITH (FORMAT BINARY)") as copy:
                    copy.write(_binary_rows(np.arange(lo, hi), augmented[lo:hi], plain[lo:hi], None if not metadata else metadata[lo:hi]))
        conn.commit()
        if ann is not None:  # built before the swap: the old table serves until the new one is ready
            conn.execute(f"CREATE INDEX ON {_ident(tmp)} USING hnsw (vector vector_ip_ops)")
        conn.execute(f"COMMENT ON TABLE {_ident(tmp)} IS %s".replace("%s", _literal(conn, json.dumps(info))))
        conn.execute(f"DROP TABLE IF EXISTS {_ident(table)}")
        conn.execute(f"ALTER TABLE {_ident(tmp)} RENAME TO {_ident(table)}")
        conn.commit()
    return location, table


def _literal(conn, text: str) -> str:
    """A SQL string literal (COMMENT takes no parameters)."""
    from psycopg import sql

    return sql.Literal(text).as_string(conn)


def open_table(location: str, table: str):
    """(connection info, hubless metadata) of a table written by :func:`write`."""
    conn = _search_connection(location)
    with conn.transaction():
        if not _exists(conn, table):
            raise NotFound(f"no table {table!r} in PostgreSQL store {location}")
        comment = conn.execute("SELECT obj_description(to_regclass(%s), 'pg_class')", (_ident(table),)).fetchone()[0]
    try:
        info = json.loads(comment or "")
    except ValueError:
        info = None
    if not isinstance(info, dict) or "format_version" not in info:
        raise InvalidInput(f"table {table!r} in {location} was not written by hubless export (no hubless metadata in its comment)")
    return (location, table), info


def query(handle, vectors: np.ndarray, k: int, column: str = "vector", *, exact: bool = False, ef_search: int = EF_SEARCH, **_):
    """Top-k by inner product per query, all queries in one round trip: (scores, ids, rows)."""
    location, table = handle
    if column not in ("vector", "plain"):
        raise InvalidInput(f"unknown column {column!r}")
    scores = np.full((len(vectors), k), -np.inf, np.float32)
    ids = np.full((len(vectors), k), -1, np.int64)
    rows: list[list[dict]] = [[] for _ in range(len(vectors))]
    ties = ", id" if exact else ""  # lower id first, as hubless; an ORDER BY beyond the distance bypasses the HNSW index
    sql_text = (
        f"SELECT q.i, t.id, t.dist, t.meta FROM unnest(%s::text[]::vector[]) WITH ORDINALITY AS q(v, i) CROSS JOIN LATERAL "
        f"(SELECT id, meta, {column} <#> q.v AS dist FROM {_ident(table)} ORDER BY {column} <#> q.v{ties} LIMIT %s) t "
        "ORDER BY q.i, t.dist, t.id"
    )
    conn = _search_connection(location)
    with conn.transaction():
        if exact:
            conn.execute("SET LOCAL enable_indexscan = off")
        else:
            conn.execute(f"SET LOCAL hnsw.ef_search = {max(int(ef_search), 4 * k)}")
        result = conn.execute(sql_text, (_vector_text(vectors), k)).fetchall()
    slot = np.zeros(len(vectors), np.int64)
    for qi, item, dist, meta in result:
        i = qi - 1
        j = slot[i]
        ids[i, j], scores[i, j] = item, -dist
        rows[i].append({"id": int(item), **(meta or {})})
        slot[i] += 1
    return scores, ids, rows


def read_rows(handle) -> tuple[np.ndarray, np.ndarray]:
    """(ids, [r, bias] rows) stored in the table, by id (one binary COPY, parsed by numpy)."""
    location, table = handle
    conn = _search_connection(location)
    with conn.transaction(), conn.cursor() as cur:
        dim = cur.execute(f"SELECT vector_dims(vector) FROM {_ident(table)} LIMIT 1").fetchone()
        if dim is None:
            return np.empty(0, np.int64), np.empty((0, 0), np.float32)
        buffer = bytearray()
        with cur.copy(f"COPY (SELECT id, vector FROM {_ident(table)} ORDER BY id) TO STDOUT (FORMAT BINARY)") as copy:
            for chunk in copy:
                buffer += chunk
    d = dim[0]
    row = np.dtype([("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("v_len", ">i4"), ("v_dim", ">i2"), ("v_unused", ">i2"),
                    ("v", ">f4", (d,))])  # fmt: skip
    body = np.frombuffer(bytes(buffer[19:-2]), dtype=row)  # after the header, before the trailer
    return body["id"].astype(np.int64), body["v"].astype(np.float32)


def apply_changes(handle, ids: np.ndarray, augmented: np.ndarray, plain: np.ndarray, metadata, removed: np.ndarray, info: dict) -> None:
    """Replace rows ``ids`` (inserting new ones), delete ``removed``, update the comment: one transaction."""
    location, table = handle
    with _connect(location) as conn:
        with conn.transaction(), conn.cursor() as cur:
            gone = np.concatenate([ids, removed]).astype(np.int64).tolist()
            cur.execute(f"DELETE FROM {_ident(table)} WHERE id = ANY(%s)", (gone,))
            if len(ids):
                with cur.copy(f"COPY {_ident(table)} (id, vector, plain, meta) FROM STDIN WITH (FORMAT BINARY)") as copy:
                    copy.write(_binary_rows(ids, augmented, plain, metadata))
            cur.execute(f"COMMENT ON TABLE {_ident(table)} IS %s".replace("%s", _literal(conn, json.dumps(info))))
