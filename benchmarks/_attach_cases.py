"""The odd-data cases of ``benchmarks/attach.py`` (issue 52): does an attached answer claimed
``exact`` ever differ from exact corrected search? Per store and case, every attachable method is
attached to a plain collection written as a user would, its answers compared with
:meth:`~hubless.attached.AttachedCollection.exact_search` (a full scan with the sidecar's
biases, ties to the lower id).

Cases: ``plain`` (the user's sparse ids), ``negative ids`` (half of them below 0, -1 among
them; Qdrant's ids are unsigned: not there), ``norms off unit`` (each vector scaled by a factor
in [0.999, 1.001], on stores ranking by the raw inner product), ``duplicates`` (a third of the
vectors twice, the copy with the lower id inserted last), ``changed in place`` (1% of the
vectors replaced under the same ids after attaching, hubs among them: whether the open
collection refused before its next answer, then the full check, then the answers).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hubless.attached import AttachedCollection, attach, update
from hubless.errors import Conflict

METHODS = [
    "nnn:alpha=0.75,k=16",
    "is:beta=15.0",
    "csls:k=10",
    "dis:beta=15.0,k_activation=2",
    "dualis",
    "dualdis:ungated=exp",
    "dn:lam=0.5",
]
CASES = ["plain", "negative ids", "norms off unit", "duplicates", "changed in place"]
#: stores that rank by the raw inner product (the norms case), and that take negative ids
RAW = {"faiss-flat", "faiss-hnsw", "lancedb", "postgresql", "milvus", "qdrant", "chroma"}
SIGNED = {"faiss-flat", "faiss-hnsw", "lancedb", "postgresql", "milvus", "chroma"}


class Writer:
    """A plain collection of one kind, written and changed as a user would (never through hubless)."""

    def __init__(self, kind: str, folder: Path, dim: int, pg_dsn: str | None) -> None:
        self.kind, self.folder, self.dim, self.pg_dsn = kind, folder, dim, pg_dsn
        self.options: dict = {}

    def create(self, x: np.ndarray, ids: np.ndarray) -> str:
        kind, d = self.kind, self.dim
        if kind.startswith("faiss"):
            import faiss

            inner = faiss.IndexFlatIP(d) if kind == "faiss-flat" else faiss.IndexHNSWFlat(d, 32, faiss.METRIC_INNER_PRODUCT)
            self.index = faiss.IndexIDMap2(inner)
            self.index.add_with_ids(x, ids)
            self.uri = str(self.folder / "c.faiss")
            faiss.write_index(self.index, self.uri)
        elif kind == "lancedb":
            import lancedb

            self.table = lancedb.connect(str(self.folder / "ldb")).create_table("docs", self._arrow(x, ids))
            self.uri = f"lancedb://{self.folder / 'ldb'}/docs"
        elif kind == "qdrant":
            import qdrant_edge as qd

            config = qd.EdgeConfig(vectors=qd.EdgeVectorParams(size=d, distance=qd.Distance.Dot))
            self.shard = qd.EdgeShard.create(str(self.folder / "qd" / "docs"), config)
            self._upsert(x, ids)
            self.uri, self.options = f"qdrant://{self.folder / 'qd'}/docs", {"shard": self.shard}
        elif kind == "postgresql":
            import psycopg

            self.table_name = f"docs_{abs(hash(str(self.folder))) % 10**8}"
            with psycopg.connect(self.pg_dsn, autocommit=True) as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute(f"CREATE TABLE {self.table_name} (id bigint PRIMARY KEY, embedding vector({d}))")
            self._pg_write(x, ids, insert=True)
            base, _, query = self.pg_dsn.partition("?")
            self.uri = f"{base}/{self.table_name}" + (f"?{query}" if query else "")
        elif kind == "milvus":
            from pymilvus import DataType, MilvusClient

            self.milvus = MilvusClient(str(self.folder / "user.db"))
            schema = MilvusClient.create_schema(auto_id=False)
            schema.add_field("id", DataType.INT64, is_primary=True)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=d)
            index = self.milvus.prepare_index_params()
            index.add_index("vector", index_type="FLAT", metric_type="IP")  # declared FLAT: every vector scored
            self.milvus.create_collection("docs", schema=schema, index_params=index, consistency_level="Strong")
            self._milvus_write(x, ids, upsert=False)
            self.uri, self.options = f"milvus://{self.folder / 'user.db'}/docs", {"client": self.milvus}
        else:  # chroma, space ip (HNSW)
            import chromadb

            client = chromadb.PersistentClient(path=str(self.folder / "chroma"))
            self.coll = client.create_collection("docs", configuration={"hnsw": {"space": "ip"}}, embedding_function=None)
            for lo in range(0, len(ids), 4096):
                self.coll.add(ids=[str(int(i)) for i in ids[lo : lo + 4096]], embeddings=x[lo : lo + 4096])
            self.uri = f"chroma://{self.folder / 'chroma'}/docs"
        return self.uri

    def replace(self, ids: np.ndarray, x: np.ndarray) -> None:
        """The vectors of ``ids`` replaced in place (the same ids)."""
        kind = self.kind
        if kind.startswith("faiss"):
            import faiss

            all_ids = faiss.vector_to_array(self.index.id_map)
            inner = faiss.downcast_index(self.index.index)
            vectors = inner.reconstruct_n(0, inner.ntotal)
            order = np.argsort(all_ids)
            vectors[order[np.searchsorted(all_ids[order], ids)]] = x
            self.create(vectors, all_ids)
        elif kind == "lancedb":
            self.table.merge_insert("id").when_matched_update_all().execute(self._arrow(x, ids))
        elif kind == "qdrant":
            self._upsert(x, ids)
        elif kind == "postgresql":
            self._pg_write(x, ids, insert=False)
        elif kind == "milvus":
            self._milvus_write(x, ids, upsert=True)
        else:
            self.coll.update(ids=[str(int(i)) for i in ids], embeddings=x)

    def _arrow(self, x, ids):
        import pyarrow as pa

        vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(x, np.float32).ravel()), self.dim)
        return pa.table({"id": pa.array(np.asarray(ids, np.int64)), "vector": vectors})

    def _upsert(self, x, ids):
        import qdrant_edge as qd

        for lo in range(0, len(ids), 4096):
            points = [qd.Point(int(i), v.tolist(), None) for i, v in zip(ids[lo : lo + 4096], x[lo : lo + 4096])]
            self.shard.update(qd.UpdateOperation.upsert_points(points))
        self.shard.flush()

    def _pg_write(self, x, ids, *, insert: bool):
        import psycopg

        rows = [(int(i), "[" + ",".join(f"{v:.9g}" for v in row) + "]") for i, row in zip(ids, np.asarray(x).tolist())]
        with psycopg.connect(self.pg_dsn, autocommit=True) as conn, conn.cursor() as cur:
            if insert:
                with cur.copy(f"COPY {self.table_name} (id, embedding) FROM STDIN") as copy:
                    for row in rows:
                        copy.write_row(row)
            else:
                cur.executemany(f"UPDATE {self.table_name} SET embedding = %s::vector WHERE id = %s", [(v, i) for i, v in rows])

    def _milvus_write(self, x, ids, *, upsert: bool):
        rows = [{"id": int(i), "vector": v.tolist()} for i, v in zip(ids, np.asarray(x, np.float32))]
        for lo in range(0, len(rows), 4096):
            (self.milvus.upsert if upsert else self.milvus.insert)("docs", rows[lo : lo + 4096])


def case_data(case: str, x: np.ndarray, ids: np.ndarray, rng) -> tuple[np.ndarray, np.ndarray]:
    """The collection of ``case`` (vectors, ids in insertion order) from the plain one."""
    if case == "negative ids":
        ids = ids - int(np.median(ids))  # about half below 0
        ids = ids - (ids[0] + 1)  # -1 among them (the first item's)
    elif case == "norms off unit":
        x = (x * rng.uniform(0.999, 1.001, (len(x), 1))).astype(np.float32)
    elif case == "duplicates":
        n = len(x)
        dup = rng.choice(n, n // 3, replace=False)
        x = np.concatenate([x, x[dup]])
        extra = ids.max() + 3 * np.arange(1, dup.size + 1)
        ids = np.concatenate([ids, ids[dup]])
        ids[dup] = extra  # the copy inserted last keeps the lower id
    return np.ascontiguousarray(x, np.float32), ids.astype(np.int64)


def compare(attached: AttachedCollection, queries: np.ndarray, **options) -> dict:
    """The attached answers against exact corrected search: claimed exact, claimed exact and
    different, certified and different."""
    got = attached.search_certified(queries, 10, **options)
    want = attached.exact_search(queries, 10)
    differ = (got.ids != want.ids).any(axis=1) | (got.found != want.found).any(axis=1)
    return {
        "queries": got.n_queries,
        "exact": int(got.exact.sum()),
        "exact_wrong": int((got.exact & differ).sum()),
        "certified": int(got.certified.sum()),
        "certified_wrong": int((got.certified & differ).sum()),
    }


def run_store_case(kind, case, x, ids, bank, gallery_bank, queries, folder: Path, pg_dsn, rng, methods) -> dict:
    """Every method attached to one collection of ``kind`` and ``case``: the summed counts, and
    for the changed case what the open collection did and what the full check found."""
    x, ids = case_data(case, x, ids, rng)
    if kind not in SIGNED:  # Qdrant's point ids are unsigned
        ids = ids - ids.min()
    writer = Writer(kind, folder, x.shape[1], pg_dsn)
    uri = writer.create(x, ids)
    total = {
        "queries": 0,
        "exact": 0,
        "exact_wrong": 0,
        "certified": 0,
        "certified_wrong": 0,
        "refused": 0,
        "found": 0,
        "attached": 0,
        "unseen_wrong": 0,
    }
    sidecars = []
    for n, spec in enumerate(methods):
        side = folder / f"side{n}"
        sidecars.append((side, attach(uri, bank, spec, out=side, gallery_bank=gallery_bank, progress=False, **writer.options)))
    if case == "changed in place":
        victims = rng.choice(len(ids), max(1, len(ids) // 100), replace=False)
        hub = queries.mean(axis=0)
        new = np.asarray(x[victims][::-1], np.float32).copy()  # other items' vectors, and a hub
        new[0] = hub / np.linalg.norm(hub)
        writer.replace(ids[victims], new)
        for side, attached in sidecars:
            try:
                before = attached.search_certified(queries, 10)
            except Conflict:
                total["refused"] += 1
                before = None
            report = update(side, uri, bank, gallery_bank=gallery_bank, full=True, progress=False, **writer.options)
            total["found"] += report["changed"]
            if before is not None:  # answered under an unseen change: what it claimed, against the truth
                want = AttachedCollection.open(uri, side, **writer.options).exact_search(queries, 10)
                total["unseen_wrong"] += int((before.exact & (before.ids != want.ids).any(axis=1)).sum())
    for side, _ in sidecars:
        opened = AttachedCollection.open(uri, side, **writer.options)
        for key, value in compare(opened, queries).items():
            total[key] += value
        total["attached"] += 1
    for closer in ("shard",):
        if hasattr(writer, closer):
            getattr(writer, closer).close()
    return total


def run_cases(args, make_data, full_size: bool) -> None:
    """Part B of the benchmark: the table of answers claimed exact that differ, per store and case."""
    import tempfile

    from _table import print_table

    stores = [s for s in args.case_stores.split(",") if s]
    methods = METHODS if args.case_methods == "all" else args.case_methods.split(";")
    x, ids, bank, gallery_bank, queries = make_data(args.case_n, args.case_dim, args.case_queries)
    print(
        f"\n## Odd data: answers claimed exact that differ from exact corrected search\n"
        f"{args.case_n:,} x {args.case_dim}, {args.case_queries} queries, {len(methods)} methods ({', '.join(methods)}); "
        "each cell: claimed exact that differ / claimed exact (certified that differ / certified), summed over the methods"
    )
    pg = None
    if "postgresql" in stores:
        import pgserver

        pg = pgserver.get_server(tempfile.mkdtemp(prefix="hubless-bench-pg-"), cleanup_mode="stop")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for kind in stores:
                rows = []
                for case in CASES:
                    if (case == "negative ids" and kind not in SIGNED) or (case == "norms off unit" and kind not in RAW):
                        rows.append((case, "not applicable (the store refuses it)", ""))
                        continue
                    folder = Path(tmp) / f"{kind}-{CASES.index(case)}"
                    folder.mkdir()
                    started = time.perf_counter()
                    got = run_store_case(kind, case, x, ids, bank, gallery_bank, queries, folder, None if pg is None else pg.get_uri(),
                                         np.random.default_rng(7), methods)  # fmt: skip
                    n = got["queries"]
                    cell = f"{got['exact_wrong']} / {got['exact']} of {n} ({got['certified_wrong']} / {got['certified']})"
                    if case == "changed in place":
                        cell += (
                            f"; before the update: {got['refused']} of {got['attached']} refused, {got['unseen_wrong']} claimed exact that "
                            f"differ; the full check found {got['found'] // max(got['attached'], 1)} changed"
                        )
                    rows.append((case, cell + f"; {time.perf_counter() - started:.0f} s", "0 claimed exact that differ"))
                print(f"\n### {kind}")
                print_table(rows, full_size=full_size, size="the issue's")
    finally:
        if pg is not None:
            pg.cleanup()
