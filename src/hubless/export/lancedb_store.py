"""LanceDB (embedded, a directory) store: write [r, bias] + plain r + metadata, search by dot product."""

from __future__ import annotations

import json
import warnings
from datetime import timedelta

import numpy as np

from hubless.errors import AlreadyExists, InvalidInput, MissingDependencyError, NotFound
from hubless.export.base import directory_lock as writer_lock  # noqa: F401  (one writer at a time: export, sync)


def _lancedb():
    try:
        import lancedb
    except ImportError:
        raise MissingDependencyError("exporting to LanceDB", "lancedb", "lancedb") from None
    return lancedb


def _tables(db) -> set[str]:
    """Every table name of the connection (all pages)."""
    names: set[str] = set()
    token = None
    while True:
        page = db.list_tables(page_token=token)
        names.update(page.tables)
        token = page.page_token
        if not token:
            return names


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
    partitions: int | None = None,
    sub_vectors: int | None = None,
    **_,
):
    """Stream the rows into ``table`` as one new LanceDB version: a first export creates the
    table, a re-export (``overwrite``) writes a new version of it that LanceDB commits atomically
    once every batch is written, so readers see the previous rows or the new ones, and an export
    that fails or is interrupted leaves the previous version as it was. Batches are written as
    they are made (memory stays at one batch). The replaced version's files are then removed.
    ``ann`` ("IVF_PQ", "IVF_FLAT") builds a LanceDB ANN index on the corrected vectors with the
    dot metric; its candidates are re-scored exactly at search time (refine)."""
    import pyarrow as pa

    from hubless.progress import progress_bar

    if ann is not None and ann.upper() not in ANN_TYPES:
        raise InvalidInput(f"unsupported LanceDB index {ann!r}; choose {' or '.join(ANN_TYPES)}")
    db = _lancedb().connect(location)
    exists = table in _tables(db)
    if exists and not overwrite:
        raise AlreadyExists(f"table {table!r} exists in {location}: pass overwrite=True (--overwrite) to replace it")
    n, d = augmented.shape
    meta_keys = sorted({k for r in metadata for k in r}) if metadata else []

    def chunk(lo, hi):
        cols = {
            "id": pa.array(np.arange(lo, hi, dtype=np.int64)),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(augmented[lo:hi].ravel()), d),
            "plain": pa.FixedSizeListArray.from_arrays(pa.array(plain[lo:hi].ravel()), plain.shape[1]),
        }
        for key in meta_keys:
            cols[f"meta_{key}"] = pa.array([None if r.get(key) is None else str(r.get(key)) for r in metadata[lo:hi]], pa.string())
        return pa.table(cols)

    schema = chunk(0, min(1, n)).schema.with_metadata({b"hubless": json.dumps(info).encode()})
    failure: list[BaseException] = []

    def batches():
        try:
            for lo in progress_bar(range(0, n, batch), None, desc="export"):
                yield from chunk(lo, min(lo + batch, n)).cast(schema).to_batches()
        except BaseException as exc:  # LanceDB reports it as its own RuntimeError: keep the original
            failure.append(exc)
            raise

    try:
        out = db.create_table(table, pa.RecordBatchReader.from_batches(schema, batches()), mode="overwrite" if exists else "create")
    except Exception:
        if failure:
            raise failure[0] from None
        raise
    if exists:
        with warnings.catch_warnings():  # LanceDB warns that readers of an old version fail: the old version is being replaced
            warnings.simplefilter("ignore", UserWarning)
            out.optimize(cleanup_older_than=timedelta(0))
    if ann is not None:  # the table is complete and searchable exactly before its ANN index exists
        out.create_index("vector", config=_ann_config(ann, n, d, partitions, sub_vectors))
    return out


ANN_TYPES = ("IVF_PQ", "IVF_FLAT")


def _ann_config(ann: str, n: int, d: int, partitions: int | None, sub_vectors: int | None):
    """The LanceDB index config: dot metric always (cosine would normalise [r, bias])."""
    from lancedb.index import IvfFlat, IvfPq

    kind = ann.upper()
    if kind not in ANN_TYPES:
        raise InvalidInput(f"unsupported LanceDB index {ann!r}; choose {' or '.join(ANN_TYPES)}")
    parts = partitions or max(1, int(np.sqrt(n) / 2))
    if kind == "IVF_FLAT":
        return IvfFlat(distance_type="dot", num_partitions=parts)
    return IvfPq(distance_type="dot", num_partitions=parts, num_sub_vectors=sub_vectors or _sub_vectors(d))


def _sub_vectors(d: int) -> int:
    """The most PQ sub-vectors (a divisor of ``d``) that keep at least 4 dimensions each."""
    return max(k for k in range(1, d + 1) if d % k == 0 and d // k >= 4) if d >= 4 else 1


def open_table(location: str, table: str):
    db = _lancedb().connect(location)
    if table not in _tables(db):
        raise NotFound(f"no table {table!r} in LanceDB store {location}")
    tbl = db.open_table(table)
    # a sync keeps the current metadata on the id column; an export writes it with the schema
    raw = (tbl.schema.field("id").metadata or {}).get(b"hubless") if "id" in tbl.schema.names else None
    raw = raw or (tbl.schema.metadata or {}).get(b"hubless")
    if raw is None:
        raise InvalidInput(f"table {table!r} in {location} was not written by hubless export (no hubless metadata)")
    return tbl, json.loads(raw)


def query(
    tbl, vectors: np.ndarray, k: int, column: str = "vector", *, exact: bool = False, nprobes: int = 20, refine_factor: int = 10, **_
):
    """Top-k by dot product per query, all queries in one request: (scores, ids, metadata rows).
    LanceDB's "dot" distance is 1 - q.r, turned back into the score q.r here. On a table with an
    ANN index the index finds ``refine_factor x k`` candidates in ``nprobes`` partitions,
    re-scored exactly; ``exact`` scans every row instead."""
    meta_cols = [name for name in tbl.schema.names if name.startswith("meta_")]
    scores = np.full((len(vectors), k), -np.inf, np.float32)
    ids = np.full((len(vectors), k), -1, np.int64)
    search = tbl.search(np.asarray(vectors, np.float32), vector_column_name=column).distance_type("dot").limit(k)
    search = search.bypass_vector_index() if exact or column != "vector" else search.nprobes(nprobes).refine_factor(refine_factor)
    res = search.select(["id", "_distance", *meta_cols]).to_arrow()
    which = res["query_index"].to_numpy() if "query_index" in res.column_names else np.zeros(res.num_rows, np.int64)
    order = np.lexsort((res["id"].to_numpy(), res["_distance"].to_numpy(), which))  # per query: best first, ties by id
    which, found = which[order], res["id"].to_numpy()[order]
    slot = np.arange(order.size) - np.searchsorted(which, which)  # rank within its query
    ids[which, slot] = found
    scores[which, slot] = 1.0 - res["_distance"].to_numpy()[order]
    cols = {c[5:]: [values[n] for n in order] for c in meta_cols for values in [res[c].to_pylist()]}
    rows = [[] for _ in range(len(vectors))]
    for n, (i, j) in enumerate(zip(which.tolist(), found.tolist())):
        rows[i].append({"id": int(j), **{c: vals[n] for c, vals in cols.items()}})
    return scores, ids, rows


def read_rows(tbl) -> tuple[np.ndarray, np.ndarray]:
    """(ids, [r, bias] rows) stored in the table, by id."""
    data = tbl.to_arrow().select(["id", "vector"]).sort_by("id")
    ids = data["id"].to_numpy()
    vectors = data["vector"].combine_chunks()
    return ids.astype(np.int64), vectors.flatten().to_numpy().astype(np.float32).reshape(len(ids), -1)


def apply_changes(tbl, ids: np.ndarray, augmented: np.ndarray, plain: np.ndarray, metadata, removed: np.ndarray, info: dict) -> None:
    """Upsert rows ``ids`` (merge on id) and delete ``removed``: two LanceDB versions; an
    interrupted sync is completed by running it again. The current hubless metadata (the query
    state after a bank grew, the item count) goes on the id column."""
    import pyarrow as pa

    if len(ids):
        meta_cols = [name for name in tbl.schema.names if name.startswith("meta_")]
        cols = {
            "id": pa.array(ids.astype(np.int64)),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(augmented.ravel()), augmented.shape[1]),
            "plain": pa.FixedSizeListArray.from_arrays(pa.array(plain.ravel()), plain.shape[1]),
        }
        for col in meta_cols:
            key = col[5:]
            cols[col] = pa.array(
                [None if not metadata or r.get(key) is None else str(r.get(key)) for r in (metadata or [{}] * len(ids))], pa.string()
            )
        new = pa.table(cols).cast(tbl.schema)
        tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(new)
    if len(removed):
        tbl.delete(f"id IN ({', '.join(str(int(i)) for i in removed)})")
    tbl.update_field_metadata({"path": "id", "metadata": {"hubless": json.dumps(info)}})  # e.g. a grown bank's size
