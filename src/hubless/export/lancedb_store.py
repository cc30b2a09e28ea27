"""LanceDB (embedded, a directory): ``lancedb://path/table``.

Columns: ``id`` (int64, the item id), ``vector`` = [r, bias(r)] (searched with the "dot"
distance, 1 - q.r, turned back into q.r), ``plain`` = r, and one typed column ``meta_<key>`` per
metadata key. The hubless info is schema metadata (on the ``id`` field). A re-export writes a new
version of the table, committed atomically by LanceDB once every batch is written: readers see
the previous rows or the new ones; the previous version's files are kept until the next export
(a reader that opened it keeps reading it), older versions and the files of a killed export are
removed by the next export.

ANN (``ann=``): ``IVF_FLAT`` or ``IVF_PQ`` on ``vector``, the dot metric, searched in ``nprobe``
partitions with ``refine_factor x k`` candidates re-scored exactly. For IVF_PQ the bias gets
sub-vectors of its own: ``vector`` is [r, bias, 0...] with the bias part zero-padded to the
sub-vector width s (a divisor of d), so PQ codes r in d/s sub-vectors and the bias in its own
(256 levels for one number: near exact), whatever d is (d + 1 prime, e.g. 256 or 768, included).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from hubless.errors import InvalidInput, NotFound, optional_import
from hubless.export.base import StaleRead, VectorStore, directory_lock, register
from hubless.export.store_options import positive_int_or_none
from hubless.export.store_rows import Rows

META = "meta_"
ARROW_TYPES = {"int": "int64", "float": "float64", "bool": "bool", "string": "string", "list<string>": "list<string>", "null": "string"}


def _lancedb():
    return optional_import("lancedb", "exporting to LanceDB", "lancedb", "lancedb")


def _arrow_type(kind: str):
    import pyarrow as pa

    return {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "list<string>": pa.list_(pa.string())}.get(kind, pa.string())


@dataclass(frozen=True)
class LanceDBOptions:
    """LanceDB export options (ANN only)."""

    partitions: int | None = field(default=None, metadata={"help": "IVF partitions (default sqrt(n)/2)", "ann": ("IVF_FLAT", "IVF_PQ")})
    sub_vectors: int | None = field(
        default=None, metadata={"help": "IVF_PQ sub-vectors (default: 4 dims each, the bias alone)", "ann": ("IVF_PQ",)}
    )

    def __post_init__(self):
        positive_int_or_none(self.partitions, "partitions")
        positive_int_or_none(self.sub_vectors, "sub_vectors")


def pq_layout(d: int, bias: int, sub_vectors: int | None = None) -> tuple[int, int]:
    """(sub-vector width s, zero padding) so that r splits into d/s sub-vectors and the bias
    columns, padded to s, into sub-vectors of their own. Default s: 4 when it divides d, else
    2, else 1; ``sub_vectors`` picks the s that gives that many."""
    choices = [s for s in range(1, d + 1) if d % s == 0]
    if sub_vectors is None:
        s = next(s for s in (4, 2, 1) if d % s == 0)
    else:
        fits = [s for s in choices if d // s + -(-bias // s) == sub_vectors]
        if not fits:
            valid = sorted({d // s + -(-bias // s) for s in choices if s <= 64})
            raise InvalidInput(f"sub_vectors={sub_vectors} cannot keep the bias in sub-vectors of its own for d={d}; choose one of {valid}")
        s = fits[0]
    return s, (-bias) % s


@register
class LanceDBStore(VectorStore):
    schemes = ("lancedb",)
    label = "LanceDB"
    extra = "lancedb"
    ann_types = {"IVF_FLAT": "nprobe", "IVF_PQ": "nprobe"}
    knob_range = {"nprobe": (20, 4096)}
    search_options = {"refine_factor": "candidates re-scored exactly, as a multiple of top_k (default 10)"}
    Options = LanceDBOptions

    def writer_lock(self):
        return directory_lock(self.location, self.table)

    def _db(self):
        return _lancedb().connect(self.location)

    def _tables(self, db) -> set[str]:
        names: set[str] = set()
        token = None
        while True:
            page = db.list_tables(page_token=token)
            names.update(page.tables)
            token = page.page_token
            if not token:
                return names

    def exists(self) -> bool:
        return Path(self.location).is_dir() and self.table in self._tables(self._db())

    @contextlib.contextmanager
    def reading(self):
        """One table handle (one LanceDB version) for the info and the rows of a search."""
        self._pinned: Any = self._open()
        try:
            yield
        except Exception as exc:
            if "Not found" in str(exc) or "not found" in str(exc):  # a version the exports after next removed
                raise StaleRead(str(exc)) from None
            raise
        finally:
            self._pinned = None

    def _open(self):
        pinned = getattr(self, "_pinned", None)
        if pinned is not None:
            return pinned
        db = self._db() if Path(self.location).is_dir() else None
        if db is None or self.table not in self._tables(db):
            raise NotFound(f"no table {self.table!r} in LanceDB store {self.location}")
        return db.open_table(self.table)

    def layout(self, d: int, bias: int, ann, options) -> dict:
        if ann != "IVF_PQ":
            return {}
        s, pad = pq_layout(d, bias, getattr(options, "sub_vectors", None))
        return {"pad": pad, "sub_vector_dim": s} if pad else {"sub_vector_dim": s}

    def knob_limit(self, knob: str, info: dict) -> int:
        return int((info.get("ann") or {}).get("partitions") or self.knob_range[knob][1])

    # ------------------------------------------------------------------ writing
    def _arrow(self, rows: Rows, columns: dict, pad: int):
        import pyarrow as pa

        aug = rows.augmented if not pad else np.hstack([rows.augmented, np.zeros((len(rows), pad), np.float32)])
        cols = {
            "id": pa.array(rows.ids.astype(np.int64)),
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(aug).ravel()), aug.shape[1]),
            "plain": pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(rows.plain).ravel()), rows.plain.shape[1]),
        }
        meta = rows.metadata or [{}] * len(rows)
        for key, kind in columns.items():
            cols[META + key] = pa.array([r.get(key) for r in meta], _arrow_type(kind))
        return pa.table(cols)

    def write_table(self, rows: Rows, info: dict, options, *, batch: int, ann: str | None) -> None:
        import pyarrow as pa

        columns = info["metadata_columns"]
        pad = int(info["layout"].get("pad", 0))
        db = _lancedb().connect(self.location)
        exists = self.table in self._tables(db)
        schema = self._arrow(rows.slice(0, 0), columns, pad).schema
        schema = schema.with_metadata({b"hubless": json.dumps(info).encode()})
        failure: list[BaseException] = []

        def batches():
            try:
                for part in rows.batches(batch):
                    yield from self._arrow(part, columns, pad).cast(schema).to_batches()
            except BaseException as exc:  # LanceDB reports it as its own RuntimeError: keep the original
                failure.append(exc)
                raise

        try:
            tbl = db.create_table(
                self.table, pa.RecordBatchReader.from_batches(schema, batches()), mode="overwrite" if exists else "create"
            )
        except Exception:
            if failure:
                raise failure[0] from None
            raise
        if ann is not None:  # on the new version; searches of it run exactly until the index exists
            n, width = rows.augmented.shape[0], rows.augmented.shape[1] + pad
            parts = options.partitions or max(1, int(np.sqrt(n) / 2))
            parts = min(parts, n)
            tbl.create_index("vector", config=self._ann_config(ann, parts, width, info["layout"]))
            info["ann"]["partitions"] = parts
            self.write_info(info, tbl)

    def _ann_config(self, ann: str, parts: int, width: int, layout: dict):
        from lancedb.index import IvfFlat, IvfPq

        if ann == "IVF_FLAT":
            return IvfFlat(distance_type="dot", num_partitions=parts)
        return IvfPq(distance_type="dot", num_partitions=parts, num_sub_vectors=width // int(layout["sub_vector_dim"]))

    def clean_leftovers(self) -> None:
        """Versions before the current one, and files no version references (a killed export's)."""
        if not Path(self.location).is_dir():
            return
        db = self._db()
        if self.table not in self._tables(db):
            stray = Path(self.location) / f"{self.table}.lance"
            if stray.is_dir():  # a first export killed before its first commit
                shutil.rmtree(stray, ignore_errors=True)
            return
        tbl = db.open_table(self.table)
        current = max(tbl.list_versions(), key=lambda v: v["version"])
        stamp = current["timestamp"]
        age = (datetime.now(stamp.tzinfo) if stamp.tzinfo else datetime.now()) - stamp
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            tbl.optimize(cleanup_older_than=max(age - timedelta(milliseconds=1), timedelta(0)), delete_unverified=True)

    # ------------------------------------------------------------------ info
    def read_info(self) -> dict:
        tbl = self._open()
        return self._info_of(tbl)

    def _info_of(self, tbl) -> dict:
        schema = tbl.schema
        raw = (schema.field("id").metadata or {}).get(b"hubless") if "id" in schema.names else None
        raw = raw or (schema.metadata or {}).get(b"hubless")
        if raw is None:
            raise InvalidInput(f"table {self.table!r} in {self.location} was not written by hubless export (no hubless metadata)")
        return json.loads(raw)

    def write_info(self, info: dict, tbl=None) -> None:
        tbl = tbl or self._open()
        tbl.update_field_metadata({"path": "id", "metadata": {"hubless": json.dumps(info)}})

    # ------------------------------------------------------------------ reading
    def native_knobs(self, knob: str, value: int, k: int, options: dict) -> dict:
        from hubless._validation import check_positive_int

        refine = options.get("refine_factor")
        return {"nprobes": value, "refine_factor": 10 if refine is None else check_positive_int(refine, "refine_factor")}

    def query(self, vectors: np.ndarray, k: int, *, column: str, exact: bool, knobs: dict):
        tbl = self._open()
        meta_cols = [name for name in tbl.schema.names if name.startswith(META)]
        scores = np.full((len(vectors), k), -np.inf, np.float32)
        ids = np.full((len(vectors), k), -1, np.int64)
        search = tbl.search(np.asarray(vectors, np.float32), vector_column_name=column).distance_type("dot").limit(k)
        if exact or column != "vector" or not knobs:
            search = search.bypass_vector_index()
        else:
            search = search.nprobes(int(knobs["nprobes"])).refine_factor(int(knobs["refine_factor"]))
        res = search.select(["id", "_distance", *meta_cols]).to_arrow()
        which = res["query_index"].to_numpy() if "query_index" in res.column_names else np.zeros(res.num_rows, np.int64)
        order = np.lexsort((res["id"].to_numpy(), res["_distance"].to_numpy(), which))  # per query: best first, ties by id
        which, found = which[order], res["id"].to_numpy()[order]
        slot = np.arange(order.size) - np.searchsorted(which, which)  # rank within its query
        ids[which, slot] = found
        scores[which, slot] = 1.0 - res["_distance"].to_numpy()[order]
        cols = {c[len(META) :]: [values[n] for n in order] for c in meta_cols for values in [res[c].to_pylist()]}
        rows: list[list[dict]] = [[] for _ in range(len(vectors))]
        for n, (i, j) in enumerate(zip(which.tolist(), found.tolist())):
            rows[i].append({"id": int(j), **{c: vals[n] for c, vals in cols.items()}})
        return scores, ids, rows

    def read_rows(self):
        tbl = self._open()
        info = self._info_of(tbl)
        width = int(info["dim"]) + int(info["bias_columns"])
        meta_cols = [name for name in tbl.schema.names if name.startswith(META)]
        data = tbl.to_arrow().select(["id", "vector", *meta_cols]).sort_by("id")
        ids = data["id"].to_numpy().astype(np.int64)
        vectors = data["vector"].combine_chunks().flatten().to_numpy().astype(np.float32).reshape(len(ids), -1)[:, :width]
        meta = None
        if meta_cols:
            values = {c[len(META) :]: data[c].to_pylist() for c in meta_cols}
            meta = [{k: v[i] for k, v in values.items()} for i in range(len(ids))]
        return ids, vectors, meta

    # ------------------------------------------------------------------ changes
    def apply_changes(self, rows: Rows, removed: np.ndarray, info: dict) -> None:
        """Upsert rows (merge on id) and delete ``removed``: LanceDB versions; an interrupted
        sync is completed by running it again. New metadata keys become new nullable columns."""
        tbl = self._open()
        columns = info["metadata_columns"]
        self._add_columns(tbl, columns)
        if len(rows):
            new = self._arrow(rows, columns, int(info["layout"].get("pad", 0)))
            full = [f.name for f in tbl.schema]
            for name in full:  # a column no longer in the index's metadata: null for new rows
                if name not in new.column_names:
                    new = new.append_column(name, pa_nulls(tbl.schema.field(name).type, len(rows)))
            new = new.select(full).cast(tbl.schema)
            tbl.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(new)
        if len(removed):
            for lo in range(0, len(removed), 10_000):
                tbl.delete(f"id IN ({', '.join(str(int(i)) for i in removed[lo : lo + 10_000])})")
        self.write_info(info, tbl)

    def _add_columns(self, tbl, columns: dict) -> None:
        import pyarrow as pa

        have = {f.name: f.type for f in tbl.schema}
        new = [pa.field(META + k, _arrow_type(t)) for k, t in columns.items() if META + k not in have]
        if new:
            tbl.add_columns(new)
        for key, kind in columns.items():
            old = have.get(META + key)
            if old is not None and old != _arrow_type(kind):
                if old == pa.string() and kind != "list<string>" and tbl.count_rows(f"`{META + key}` IS NOT NULL") == 0:
                    tbl.alter_columns({"path": META + key, "data_type": _arrow_type(kind)})
                elif old == pa.int64() and kind == "float":
                    tbl.alter_columns({"path": META + key, "data_type": pa.float64()})
                else:
                    raise InvalidInput(
                        f"metadata {key!r} is now {kind} but {self.uri} stores it as {old}: export again with overwrite=True (--overwrite)"
                    )

    def drop_table(self) -> bool:
        if not self.exists():
            return False
        self._db().drop_table(self.table)
        return True


def pa_nulls(dtype, n: int):
    import pyarrow as pa

    return pa.nulls(n, dtype)
