"""A LanceDB table as an attached collection: ``lancedb://dir/table``, columns ``id`` and
``vector`` (``id_field=`` / ``vector_field=`` to name others), scanned in record batches,
searched with LanceDB's dot (or ``metric="cosine"``) distance turned back into a similarity
(1 - distance). A table without a vector index on the column (or a search with ``exact=True``,
LanceDB's ``bypass_vector_index``) searches exactly; the table's version
(:meth:`LanceSource.version`) marks every write. Ids: an integer column (refused otherwise)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hubless.attached.sources.base import BATCH, SOURCES, Source, as_ids, sql_band
from hubless.errors import InvalidInput, NotFound, optional_import

__all__ = ["LanceSource"]


@SOURCES.register
class LanceSource(Source):
    """A LanceDB table (see the module docstring)."""

    kind = "lancedb"
    payload_writes = True
    band_search = True
    schemes = ("lancedb",)
    uri_form = "lancedb://path/table"
    knobs = {
        "nprobe": "IVF partitions probed per query",
        "refine_factor": "candidates re-scored exactly, x k",
        "exact": "scan every row, without the vector index (true/false)",
    }

    def __init__(self, uri: str, *, id_field: str = "id", vector_field: str = "vector", metric: str = "dot") -> None:
        super().__init__(uri)
        from hubless.export.base import split_location

        lancedb = optional_import("lancedb", "attaching to LanceDB", "lancedb", "lancedb")
        location, table = split_location(uri, "lancedb", "lancedb://path/table")
        self.local = Path(location)
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
        id_type = self.table.schema.field(id_field).type
        if not pa_integer(id_type):
            raise InvalidInput(
                f"LanceDB table {uri}: its id column {id_field!r} is {id_type}, not an integer column (attach keeps int64 ids)"
            )
        self.id_field, self.vector_field, self.metric = id_field, vector_field, metric
        self.cosine = metric == "cosine"
        self._dim = int(self.table.schema.field(vector_field).type.list_size)

    @property
    def dim(self) -> int:
        return self._dim

    def version(self) -> int:
        self.table.checkout_latest()
        return int(self.table.version)

    def _vector_index(self) -> bool:
        return any(self.vector_field in index.columns for index in self.table.list_indices())

    @property
    def beam_knob(self) -> str | None:
        return "nprobe" if self._vector_index() else None

    def searches_exactly(self, knobs: dict) -> bool:
        return bool(knobs.get("exact")) or not self._vector_index()

    def beam_ladder(self, k: int) -> list[int]:
        return [2**p for p in range(11)] if self._vector_index() else []

    def _ids(self, column) -> np.ndarray:
        return as_ids(column.to_numpy(), f"LanceDB table {self.uri}")

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
            ids = self._ids(part.column(0))
            vectors = self._vectors(part.column(1))
            self._count(ids.size, vectors.size)
            yield ids, vectors

    def scan_ids(self, batch: int = BATCH):
        for part in self._batches([self.id_field], batch):
            ids = self._ids(part.column(0))
            self._count(ids.size)
            yield ids

    def _fetch(self, ids):
        where = f"{self.id_field} IN ({', '.join(str(int(i)) for i in ids.tolist())})"
        got, parts = [], []
        for part in self._batches([self.id_field, self.vector_field], max(ids.size, 1), where):
            got.append(self._ids(part.column(0)))
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

    def _add_payload_fields(self, fields):
        import pyarrow as pa

        self.table.checkout_latest()
        schema = self.table.schema
        for name in fields:
            if name not in schema.names:
                self.table.add_columns({name: "CAST(NULL AS FLOAT)"})  # a new column, no row rewritten
            elif not pa.types.is_floating(schema.field(name).type):
                raise InvalidInput(f"LanceDB table {self.uri} has a column {name!r} of type {schema.field(name).type}, not a float")

    def _write_payload(self, ids, values, fields):
        import pyarrow as pa

        columns = {self.id_field: pa.array(ids, pa.int64()), **{f: pa.array(values[:, c], pa.float32()) for c, f in enumerate(fields)}}
        self.table.merge_insert(self.id_field).when_matched_update_all().execute(pa.table(columns))  # these columns only

    def _search(self, queries, k, knobs):
        return self._query(queries, k, knobs, None)

    def _search_band(self, queries, k, band, knobs):
        return self._query(queries, k, knobs, sql_band(band))

    def _query(self, queries, k, knobs, where):
        search = self.table.search(queries, vector_column_name=self.vector_field).distance_type(self.metric).limit(k)
        if knobs.get("exact"):
            search = search.bypass_vector_index()
        if where is not None:
            search = search.where(where, prefilter=True)
        if knobs.get("nprobe") is not None:
            search = search.nprobes(int(knobs["nprobe"]))
        if knobs.get("refine_factor") is not None:
            search = search.refine_factor(int(knobs["refine_factor"]))
        res = search.select([self.id_field, "_distance"]).to_arrow()
        which = res["query_index"].to_numpy() if "query_index" in res.column_names else np.zeros(res.num_rows, np.int64)
        found = as_ids(res[self.id_field].to_numpy(), f"LanceDB table {self.uri}")
        sims = 1.0 - res["_distance"].to_numpy().astype(np.float64)
        order = np.lexsort((found, -sims, which))
        which, found, sims = which[order], found[order], sims[order]
        slot = np.arange(order.size) - np.searchsorted(which, which)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        filled = np.zeros((len(queries), k), bool)
        keep = slot < k
        scores[which[keep], slot[keep]] = sims[keep]
        ids[which[keep], slot[keep]] = found[keep]
        filled[which[keep], slot[keep]] = True
        return scores, ids, filled


def pa_integer(kind) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(kind))
