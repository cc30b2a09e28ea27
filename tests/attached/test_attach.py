"""Attaching a correction to a collection the user already has (hubless.attached), one contract
for every source, on the real engines: FAISS (IndexFlatIP, IndexIVFFlat, IndexHNSWFlat wrapped
in IndexIDMap2 with the user's ids), LanceDB and Qdrant (qdrant-client's own engine standing in
for a server). Small collections.

Attached search equals exact corrected search (brute force here) when k' covers the collection;
certified answers are exact; ids are the store's; a changed collection is refused until
updated; an update reads only the added items and equals a fresh attach.
"""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from hubless.attached import AttachedCollection, attach, read_sidecar, update
from hubless.errors import AlreadyExists, Conflict, HublessError, InvalidInput, InvalidType
from tests.conftest import QDRANT_TEST_URL, unit_rows

pytestmark = pytest.mark.filterwarnings("ignore:Local mode performs exact")

D = 16
KINDS = ["faiss-flat", "faiss-ivf", "faiss-hnsw", "lancedb", "qdrant", "qdrant-edge", "postgresql", "chroma", "milvus"]
EXACT_KINDS = ["faiss-flat", "lancedb", "qdrant", "qdrant-edge", "postgresql"]


def hub_prone(rng, n, d=D, hubs=6):
    """Unit rows where a few directions attract many items (so the correction matters)."""
    centres = unit_rows(rng, hubs, d)
    x = rng.standard_normal((n, d)) * 0.6 + centres[rng.integers(0, hubs, n)] * rng.lognormal(0, 0.6, (n, 1))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    n = 240
    return {
        "x": hub_prone(rng, n),
        "ids": rng.permutation(np.arange(n) * 5 + 11).astype(np.int64),  # the user's ids, not positions, not sorted
        "bank": hub_prone(rng, 300),
        "gallery_bank": hub_prone(rng, 100),
        "queries": hub_prone(rng, 30),
        "new": hub_prone(rng, 12),
    }


class Collection:
    """A plain collection of one kind the test writes as a user would (never through hubless)."""

    def __init__(self, kind, tmp_path):
        self.kind, self.tmp = kind, tmp_path
        self.options = {}  # the source options a user passes for this collection

    def create(self, x, ids):
        kind = self.kind
        if kind.startswith("faiss"):
            import faiss

            if kind == "faiss-flat":
                inner = faiss.IndexFlatIP(D)
            elif kind == "faiss-ivf":
                inner = faiss.IndexIVFFlat(faiss.IndexFlatIP(D), D, 4, faiss.METRIC_INNER_PRODUCT)
                inner.train(x)
            else:
                inner = faiss.IndexHNSWFlat(D, 8, faiss.METRIC_INNER_PRODUCT)
            index = faiss.IndexIDMap2(inner)
            index.add_with_ids(x, ids)
            self.index = index
            self.uri = str(self.tmp / "c.faiss")
            self._write()
        elif kind == "lancedb":
            import lancedb

            db = lancedb.connect(str(self.tmp / "ldb"))
            self.table = db.create_table("docs", self._arrow(x, ids))
            self.uri = f"lancedb://{self.tmp / 'ldb'}/docs"
        elif kind == "postgresql":  # a table with a pgvector column (no index: exact)
            import uuid

            self.table = f"docs_{uuid.uuid4().hex[:8]}"
            with self._pg() as conn:
                conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                conn.execute(f"CREATE TABLE {self.table} (id bigint PRIMARY KEY, embedding vector({D}), caption text)")
            self._insert(x, ids)
            base, _, query = self.pg_dsn.partition("?")
            self.uri = f"{base}/{self.table}" + (f"?{query}" if query else "")  # the database, then the table
        elif kind == "chroma":  # space "ip", ids as text
            import chromadb

            self.chroma = chromadb.PersistentClient(path=str(self.tmp / "chroma"))
            self.coll = self.chroma.create_collection("docs", configuration={"hnsw": {"space": "ip"}}, embedding_function=None)
            self._insert(x, ids)
            self.uri = f"chroma://{self.tmp / 'chroma'}/docs"
        elif kind == "milvus":  # Milvus Lite, a FLAT index with the IP metric
            from pymilvus import MilvusClient

            self.milvus = MilvusClient(str(self.tmp / "user.db"))
            self.milvus.create_collection("docs", dimension=D, metric_type="IP", index_type="FLAT", consistency_level="Strong")
            self._insert(x, ids)
            self.uri = f"milvus://{self.tmp / 'user.db'}/docs"
            self.options = {"client": self.milvus}  # Milvus Lite: one client per file and process
        elif kind == "qdrant-edge":  # Qdrant's in-process engine, one unnamed vector, Cosine
            import qdrant_edge as qd

            config = qd.EdgeConfig(vectors=qd.EdgeVectorParams(size=D, distance=qd.Distance.Cosine))
            self.shard = qd.EdgeShard.create(str(self.tmp / "qd" / "docs"), config)
            self.options = {"shard": self.shard}  # the engine lets one holder open it: the user's own handle
            self._upsert(x, ids)
            self.uri = f"qdrant://{self.tmp / 'qd'}/docs"
        else:
            from qdrant_client import models

            self.client.create_collection("docs", vectors_config=models.VectorParams(size=D, distance=models.Distance.DOT))
            self._upsert(x, ids)
            self.uri = f"qdrant+{QDRANT_TEST_URL}/docs"
        return self.uri

    def _pg(self):
        import psycopg

        return psycopg.connect(self.pg_dsn, autocommit=True)

    def _insert(self, x, ids):
        if self.kind == "milvus":
            self.milvus.insert("docs", [{"id": int(i), "vector": v.tolist(), "caption": f"item {i}"} for i, v in zip(ids, x)])
            return
        if self.kind == "chroma":
            self.coll.add(ids=[str(int(i)) for i in ids], embeddings=x, metadatas=[{"caption": f"item {i}"} for i in ids])
            return
        rows = [(int(i), "[" + ",".join(f"{v:.9g}" for v in row) + "]", f"item {i}") for i, row in zip(ids, x.tolist())]
        with self._pg() as conn, conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {self.table} (id, embedding, caption) VALUES (%s, %s::vector, %s)", rows)

    def _write(self):
        import faiss

        faiss.write_index(self.index, self.uri)

    def _arrow(self, x, ids):
        import pyarrow as pa

        vectors = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), D)
        return pa.table({"id": pa.array(ids, pa.int64()), "vector": vectors, "caption": [f"item {i}" for i in ids.tolist()]})

    def _upsert(self, x, ids):
        if self.kind == "qdrant-edge":
            import qdrant_edge as qd

            self.shard.update(
                qd.UpdateOperation.upsert_points([qd.Point(int(i), v.tolist(), {"caption": f"item {i}"}) for i, v in zip(ids, x)])
            )
            self.shard.flush()
            return
        from qdrant_client import models

        points = [models.PointStruct(id=int(i), vector=v.tolist(), payload={"caption": f"item {i}"}) for i, v in zip(ids, x)]
        self.client.upsert("docs", points)

    def add(self, x, ids):
        if self.kind in ("postgresql", "chroma", "milvus"):
            self._insert(x, ids)
        elif self.kind.startswith("faiss"):
            self.index.add_with_ids(x, ids)
            self._write()
        elif self.kind == "lancedb":
            self.table.add(self._arrow(x, ids))
        else:
            self._upsert(x, ids)

    def replace(self, ids, x):
        """Replace the vectors of ``ids`` in place (the same ids, new vectors), as a user's own write would."""
        ids = np.asarray(ids, np.int64)
        if self.kind.startswith("faiss"):  # a FAISS file is rewritten whole, its items in the same order
            import faiss

            inner = faiss.downcast_index(self.index.index)
            all_ids = faiss.vector_to_array(self.index.id_map)
            vectors = inner.reconstruct_n(0, inner.ntotal)
            vectors[_positions(all_ids, ids)] = x
            self.create(vectors, all_ids)
        elif self.kind == "lancedb":
            import pyarrow as pa

            vectors = pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(x, np.float32).ravel(), pa.float32()), D)
            self.table.merge_insert("id").when_matched_update_all().execute(pa.table({"id": pa.array(ids, pa.int64()), "vector": vectors}))
        elif self.kind == "postgresql":
            with self._pg() as conn, conn.cursor() as cur:
                cur.executemany(
                    f"UPDATE {self.table} SET embedding = %s::vector WHERE id = %s",
                    [("[" + ",".join(f"{v:.9g}" for v in row) + "]", int(i)) for i, row in zip(ids, np.asarray(x).tolist())],
                )
        elif self.kind == "chroma":
            self.coll.update(ids=[str(int(i)) for i in ids], embeddings=np.asarray(x, np.float32))
        elif self.kind == "milvus":
            self.milvus.upsert("docs", [{"id": int(i), "vector": v.tolist(), "caption": f"item {i}"} for i, v in zip(ids, x)])
        else:
            self._upsert(np.asarray(x, np.float32), ids)

    def remove(self, ids):
        if self.kind in ("faiss-ivf", "faiss-hnsw"):  # HNSW has no remove_ids; an IVF under an id map is not renumbered: a user rebuilds
            import faiss

            index = faiss.downcast_index(self.index.index)
            keep = ~np.isin(faiss.vector_to_array(self.index.id_map), ids)
            x = index.reconstruct_n(0, index.ntotal)[keep]
            kept_ids = faiss.vector_to_array(self.index.id_map)[keep]
            self.create(x, kept_ids)
        elif self.kind.startswith("faiss"):
            self.index.remove_ids(np.asarray(ids, np.int64))
            self._write()
        elif self.kind == "lancedb":
            self.table.delete(f"id IN ({', '.join(str(int(i)) for i in ids)})")
        elif self.kind == "postgresql":
            with self._pg() as conn:
                conn.execute(f"DELETE FROM {self.table} WHERE id = ANY(%s)", ([int(i) for i in ids],))
        elif self.kind == "chroma":
            self.coll.delete(ids=[str(int(i)) for i in ids])
        elif self.kind == "milvus":
            self.milvus.delete("docs", ids=[int(i) for i in ids])
        elif self.kind == "qdrant-edge":
            import qdrant_edge as qd

            self.shard.update(qd.UpdateOperation.delete_points([int(i) for i in ids]))
            self.shard.flush()
        else:
            from qdrant_client import models

            self.client.delete("docs", points_selector=models.PointIdsList(points=[int(i) for i in ids]))


def _positions(all_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The positions of ``ids`` in ``all_ids``."""
    order = np.argsort(all_ids)
    return order[np.searchsorted(all_ids[order], ids)]


@pytest.fixture(scope="module")
def pg_dsn(tmp_path_factory):
    """A real PostgreSQL with pgvector (pgserver) for this module: its libpq URI without a database."""
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server.get_uri()  # postgresql://user:@/postgres?host=...
    server.cleanup()


@pytest.fixture
def collection(request, tmp_path):
    kind = request.param
    made = Collection(kind, tmp_path)
    if kind == "qdrant":
        made.client = request.getfixturevalue("qdrant_server")
    if kind == "postgresql":
        made.pg_dsn = request.getfixturevalue("pg_dsn")
    return made


def brute_force_nnn(x, bank, queries, alpha, k):
    """NNN by its formula: s(q, r) - alpha * mean of the k largest s(b, r) over the bank."""
    bias = -np.sort(-(bank @ x.T), axis=0)[:k].mean(axis=0)
    return queries @ x.T - alpha * bias[None, :]


def exact_top(scores, ids, k):
    order = np.lexsort((np.broadcast_to(ids, scores.shape), -scores), axis=1)[:, :k]
    return ids[order], np.take_along_axis(scores, order, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("collection", KINDS, indirect=True)
def test_attached_search_equals_exact_corrected_search_when_candidates_cover_the_collection(collection, data, tmp_path):
    x, ids, q = data["x"], data["ids"], data["queries"]
    uri = collection.create(x, ids)
    attached = attach(uri, data["bank"], "nnn:alpha=0.75,k=8", out=tmp_path / "side", batch=50, **collection.options)
    n = len(ids)
    knobs = {"ef_search": 512} if collection.kind == "faiss-hnsw" else {"nprobe": 4} if collection.kind == "faiss-ivf" else {}
    result = attached.search_certified(q, 10, candidates=n, **knobs)
    want_ids, want_scores = exact_top(brute_force_nnn(x, data["bank"], q, 0.75, 8), ids, 10)
    np.testing.assert_array_equal(result.ids, want_ids)  # the store's ids, exact order
    np.testing.assert_allclose(result.scores, want_scores, atol=2e-5)
    assert result.certified.all()
    # metadata from the store (its payload or other columns), as the user wrote it, by id
    with_meta = attached.search_certified(q[:3], 5, candidates=n, metadata=True, **knobs)
    shown = sorted(set(with_meta.ids.ravel().tolist()))
    assert sorted(with_meta.metadata) == shown
    if collection.kind.startswith("faiss"):  # FAISS keeps no metadata
        assert all(record == {} for record in with_meta.metadata.values())
    else:
        assert [with_meta.metadata[i]["caption"] for i in shown] == [f"item {i}" for i in shown]
    # the attached collection's own brute force (what `--exact` measures against) agrees
    np.testing.assert_array_equal(attached.exact_search(q, 10, batch=64)[1], want_ids)
    # a per-call weight, as Index.search takes it
    scores, got = attached.search(q, 10, candidates=n, weight=0.3, **knobs)
    np.testing.assert_array_equal(got, exact_top(brute_force_nnn(x, data["bank"], q, 0.3, 8), ids, 10)[0])


SPECS = ["nnn:alpha=1.0,k=8", "dn:lam=0.5", "csls:k=5", "is:beta=15.0", "dis:beta=15.0,k_activation=2", "dualis", "dualdis:ungated=exp"]


@pytest.mark.slow
@pytest.mark.parametrize("collection", EXACT_KINDS, indirect=True)
def test_certified_answers_are_exact_for_every_attachable_method(collection, data, tmp_path):
    x, ids, q, gb = data["x"], data["ids"], data["queries"], data["gallery_bank"]
    uri = collection.create(x, ids)
    uncertified = 0
    for n, spec in enumerate(SPECS):
        # every other method without a reserve: the bound then uses the collection's smallest bias
        reserve = 0 if n % 2 else None
        attached = attach(
            uri, data["bank"], spec, out=tmp_path / "side", gallery_bank=gb, reserve=reserve, overwrite=True, **collection.options
        )
        assert attached.sidecar.info["reserve"]["size"] == (0 if n % 2 else 64)
        corr = hubless.make_correction(spec).fit(x, data["bank"], gb)
        want_scores, want_pos = corr.search(q, 10)
        # narrow: k' = 2k and no widening, so some queries stay uncertified; the certified ones are exact
        narrow = attached.search_certified(q, 10, candidates=20, max_candidates=20)
        np.testing.assert_array_equal(narrow.ids[narrow.certified], ids[want_pos][narrow.certified], err_msg=spec)
        bands, attached.bands = attached.bands, None  # the single bound alone (bands certify these small sets whole)
        single = attached.search_certified(q, 10, candidates=20, max_candidates=20)
        attached.bands = bands
        np.testing.assert_array_equal(single.ids[single.certified], ids[want_pos][single.certified], err_msg=spec)
        uncertified += int((~single.certified).sum())
        # default: widened until certified, all exact
        result = attached.search_certified(q, 10)
        assert result.certified.all(), (spec, result.candidates)
        np.testing.assert_array_equal(result.ids, ids[want_pos], err_msg=spec)
        np.testing.assert_allclose(result.scores, want_scores, rtol=1e-4, atol=2e-5, err_msg=spec)
        exact_scores, exact_ids = attached.exact_search(q, 10, batch=100)
        np.testing.assert_array_equal(exact_ids, ids[want_pos], err_msg=spec)
        np.testing.assert_allclose(exact_scores, want_scores, rtol=1e-4, atol=2e-5, err_msg=spec)
    assert uncertified > 0  # the narrow search did leave some uncertified: the certificate is not vacuous


@pytest.mark.parametrize("collection", KINDS, indirect=True)
def test_a_changed_collection_is_refused_until_updated_and_the_update_reads_only_what_changed(collection, data, tmp_path):
    x, ids, bank = data["x"], data["ids"], data["bank"]
    uri = collection.create(x, ids)
    side = tmp_path / "side"
    opts = collection.options
    attached = attach(uri, bank, "nnn:alpha=0.75,k=8", out=side, **opts)
    new_ids = np.arange(len(data["new"]), dtype=np.int64) * 7 + 100_000
    collection.add(data["new"], new_ids)
    with pytest.raises(Conflict, match="--update"):
        attached.search(data["queries"], 5)
    with pytest.raises(Conflict, match="--update"):
        AttachedCollection.open(uri, side, **opts)
    report = update(side, uri, bank, **opts)
    assert (report["added"], report["removed"], report["changed"], report["refit"]) == (len(new_ids), 0, 0, None)
    n_all = len(ids) + len(new_ids)
    faiss_file = collection.kind.startswith("faiss")
    if faiss_file:  # read whole by any update: every vector compared with its digest, the file's size counted
        import os

        assert report["full"] and report["read_items"] == report["checked"] + len(new_ids) == n_all
        assert report["bytes_read"] == os.path.getsize(uri)
    else:  # ids of every item, the added items' vectors, the rotating sample's 32 vectors: nothing else
        assert not report["full"] and report["read_items"] == len(new_ids) + 32 and report["checked"] == 32
        assert report["bytes_read"] <= 8 * n_all + (8 + 4 * D) * (len(new_ids) + 32)
    removed = ids[:9]
    collection.remove(removed)
    report = update(side, uri, bank, **opts)
    assert (report["added"], report["removed"], report["read_items"]) == (0, 9, n_all - 9 if faiss_file else 32)
    # equal to a fresh attach over the same items
    fresh = attach(uri, bank, "nnn:alpha=0.75,k=8", out=tmp_path / "fresh", **opts)
    updated = read_sidecar(side)
    np.testing.assert_array_equal(updated.ids, fresh.sidecar.ids)
    np.testing.assert_allclose(updated.bias, fresh.sidecar.bias, atol=1e-6)
    kept = np.concatenate([x[9:], data["new"]])
    kept_ids = np.concatenate([ids[9:], new_ids])
    knobs = {"ef_search": 512} if collection.kind == "faiss-hnsw" else {"nprobe": 4} if collection.kind == "faiss-ivf" else {}
    got = AttachedCollection.open(uri, side, **opts).search(data["queries"], 10, candidates=len(kept_ids), **knobs)[1]
    np.testing.assert_array_equal(got, exact_top(brute_force_nnn(kept, bank, data["queries"], 0.75, 8), kept_ids, 10)[0])


@pytest.mark.parametrize("collection", ["postgresql"], indirect=True)
def test_a_password_in_the_address_is_never_written_to_the_sidecar_or_shown(collection, data, tmp_path, monkeypatch):
    """A PostgreSQL role that logs in with a password only (scram-sha-256 in pg_hba.conf): the
    attach connects with the password in its address, the sidecar keeps the address without it,
    opening from the sidecar alone then takes the password from PGPASSWORD (refused, without
    showing it, when there is none), and an update given the full address knows the collection."""
    import pgserver

    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", str(tmp_path / "no-pgpass"))
    x, ids, bank = data["x"], data["ids"], data["bank"]
    uri = collection.create(x, ids)
    server = pgserver.get_server(collection.pg_dsn.split("host=")[1].split("&")[0], cleanup_mode=None)
    hba = server.pgdata / "pg_hba.conf"
    if "hubless_pw" not in hba.read_text():  # first match wins: this role's socket logins need its password
        hba.write_text("local all hubless_pw scram-sha-256\n" + hba.read_text())
    with collection._pg() as conn:
        conn.execute("DROP ROLE IF EXISTS hubless_pw")
        conn.execute("CREATE ROLE hubless_pw LOGIN SUPERUSER PASSWORD 's3cret-pw'")
        conn.execute("SELECT pg_reload_conf()")
    rest = uri.split("://", 1)[1].split("@", 1)[1]  # postgresql://user:@/postgres/table?host=...
    with_password = f"postgresql://hubless_pw:s3cret-pw@{rest}"
    without = f"postgresql://hubless_pw@{rest}"
    with pytest.raises(HublessError) as refused:  # the role really needs its password
        attach(without, bank, "nnn:alpha=0.75,k=8", out=tmp_path / "never", batch=50)
    assert "password" in str(refused.value)
    with pytest.raises(HublessError) as wrong:
        attach(with_password.replace("s3cret-pw", "wrong-pw"), bank, "nnn:alpha=0.75,k=8", out=tmp_path / "never", batch=50)
    assert "wrong-pw" not in str(wrong.value) and "hubless_pw" in str(wrong.value)
    assert not (tmp_path / "never").exists()

    side = tmp_path / "side"
    attached = attach(with_password, bank, "nnn:alpha=0.75,k=8", out=side, batch=50)
    assert "s3cret-pw" not in repr(attached)
    written = b"".join(p.read_bytes() for p in side.rglob("*") if p.is_file())
    assert b"s3cret-pw" not in written and b"hubless_pw" in written  # the user is kept, the password not
    assert read_sidecar(side).info["source"]["uri"] == without

    with pytest.raises(HublessError) as no_password:
        AttachedCollection.from_sidecar(side)
    assert "s3cret-pw" not in str(no_password.value) and "hubless_pw" in str(no_password.value)
    monkeypatch.setenv("PGPASSWORD", "s3cret-pw")
    got = AttachedCollection.from_sidecar(side).search(data["queries"], 10, candidates=len(ids))[1]
    np.testing.assert_array_equal(got, exact_top(brute_force_nnn(x, bank, data["queries"], 0.75, 8), ids, 10)[0])
    monkeypatch.delenv("PGPASSWORD")
    collection.add(data["new"], np.arange(12, dtype=np.int64) + 5000)
    report = update(side, with_password, bank, batch=50)  # the same collection, given with its password
    assert report["added"] == 12
    assert b"s3cret-pw" not in b"".join(p.read_bytes() for p in side.rglob("*") if p.is_file())


@pytest.mark.parametrize("collection", ["faiss-flat"], indirect=True)
def test_update_refits_gallery_wide_statistics_only_for_the_methods_that_have_them(collection, data, tmp_path):
    x, ids, bank = data["x"], data["ids"], data["bank"]
    uri = collection.create(x, ids)
    attach(uri, bank, "dis:beta=15.0,k_activation=2", out=tmp_path / "dis")
    attach(uri, bank, "dualis", out=tmp_path / "dualis", gallery_bank=data["gallery_bank"])
    new_ids = np.arange(len(data["new"]), dtype=np.int64) + 50_000
    collection.add(data["new"], new_ids)
    report = update(tmp_path / "dis", uri, bank)
    assert "activation sets" in report["refit"] and report["read_items"] == len(ids) + len(new_ids)
    report = update(tmp_path / "dualis", uri, bank, gallery_bank=data["gallery_bank"])
    assert report["refit"] is None and report["added"] == len(new_ids)  # DualIS: row-local biases, only the added ones fitted
    all_x, all_ids = np.concatenate([x, data["new"]]), np.concatenate([ids, new_ids])
    for name, spec, gb in (("dis", "dis:beta=15.0,k_activation=2", None), ("dualis", "dualis", data["gallery_bank"])):
        corr = hubless.make_correction(spec).fit(all_x, bank, gb)
        want = all_ids[corr.search(data["queries"], 10)[1]]
        got = AttachedCollection.open(uri, tmp_path / name).search(data["queries"], 10)[1]
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_bad_input_is_refused_naming_it_and_writes_no_sidecar(data, tmp_path):
    import faiss

    x, ids = data["x"], data["ids"]
    l2 = faiss.IndexIDMap2(faiss.IndexFlatL2(D))
    l2.add_with_ids(x, ids)
    faiss.write_index(l2, str(tmp_path / "l2.faiss"))
    with pytest.raises(InvalidInput, match="L2"):
        attach(str(tmp_path / "l2.faiss"), data["bank"], out=tmp_path / "s1")
    raw = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    raw.add_with_ids(x * 3, ids)
    with pytest.raises(InvalidInput, match="norm"):
        attach(raw, data["bank"], out=tmp_path / "s2")
    ok = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    ok.add_with_ids(x, ids)
    with pytest.raises(InvalidType, match="not additive"):
        attach(ok, data["bank"], "gc", out=tmp_path / "s3")
    with pytest.raises(InvalidInput, match="dimension"):
        attach(ok, data["bank"][:, :8], out=tmp_path / "s4")
    with pytest.raises(InvalidInput, match="not a bias"):
        attach(ok, data["bank"], "dualdis", gallery_bank=data["gallery_bank"], out=tmp_path / "s5")
    with pytest.raises(InvalidInput, match="attach supports"):
        attach("weaviate://x/y", data["bank"], out=tmp_path / "s6")
    assert not any((tmp_path / f"s{i}").exists() for i in range(1, 7))
    faiss.write_index(ok, str(tmp_path / "ok.faiss"))
    attach(str(tmp_path / "ok.faiss"), data["bank"], out=tmp_path / "good")
    with pytest.raises(InvalidInput, match="fingerprint"):
        update(tmp_path / "good", str(tmp_path / "ok.faiss"), data["bank"][::-1])


@pytest.mark.filterwarnings("ignore::hubless.UnnormalizedEmbeddingsWarning")
def test_a_raw_faiss_index_needs_unit_vectors_unless_normalize_is_off(data, tmp_path):
    import faiss

    x = data["x"] * np.linspace(0.5, 2.0, len(data["x"]), dtype=np.float32)[:, None]
    index = faiss.IndexFlatIP(D)  # no id map: ids are the positions
    index.add(x)
    attached = attach(index, data["bank"], "nnn:alpha=0.5,k=8,normalize=false", out=tmp_path / "side")
    corr = hubless.NNN(alpha=0.5, k=8, normalize=False).fit(x, data["bank"])
    np.testing.assert_array_equal(attached.search(data["queries"], 10)[1], corr.search(data["queries"], 10)[1])


def test_the_command_line_attaches_searches_and_updates(data, tmp_path):
    import json

    import faiss
    from typer.testing import CliRunner

    from hubless.cli.main import app

    runner = CliRunner()
    x, ids = data["x"], data["ids"]
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    index.add_with_ids(x, ids)
    path = str(tmp_path / "c.faiss")
    faiss.write_index(index, path)
    np.save(tmp_path / "bank.npy", data["bank"])
    np.save(tmp_path / "q.npy", data["queries"][:4])
    side = str(tmp_path / "side")
    result = runner.invoke(app, ["attach", path, "--query-bank", str(tmp_path / "bank.npy"), "-m", "nnn:alpha=0.75,k=8", "--out", side])
    assert result.exit_code == 0, result.output
    assert "attached nnn:alpha=0.75,k=8" in result.output
    result = runner.invoke(app, ["attach", path, "--out", side, "--search", str(tmp_path / "q.npy"), "--top-k", "3", "--exact"])
    assert result.exit_code == 0, result.output
    assert "recall@3 against exact corrected search: 1.0000" in result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    want = exact_top(brute_force_nnn(x, data["bank"], data["queries"][:4], 0.75, 8), ids, 3)[0]
    assert [line["ids"] for line in lines] == want.tolist() and all(line["certified"] for line in lines)
    result = runner.invoke(app, ["attach", path, "--out", side, "--search", str(tmp_path / "q.npy"), "--top-k", "3", "--metadata"])
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [[r["id"] for r in line["metadata"]] for line in lines] == want.tolist()  # a FAISS index keeps no more than ids
    index.add_with_ids(data["new"], np.arange(len(data["new"]), dtype=np.int64) + 10**6)
    faiss.write_index(index, path)
    result = runner.invoke(app, ["attach", path, "--out", side, "--search", str(tmp_path / "q.npy")])
    assert result.exit_code == 2 and "--update" in result.output
    result = runner.invoke(app, ["attach", path, "--query-bank", str(tmp_path / "bank.npy"), "--out", side, "--update"])
    assert result.exit_code == 0 and f"{len(data['new'])} added" in result.output, result.output
    result = runner.invoke(app, ["attach", path, "--out", side, "--update"])
    assert result.exit_code == 2 and "--query-bank" in result.output
    # JSON lines say both promises; the counts go to stderr
    result = runner.invoke(app, ["attach", path, "--out", side, "--search", str(tmp_path / "q.npy"), "--top-k", "3"])
    assert all(json.loads(line)["exact"] for line in result.stdout.splitlines() if line.startswith("{"))
    assert "certified 4 of 4 queries, exact 4 of 4" in result.output
    # a sidecar is replaced only with --overwrite, which says what it replaced
    bank_args = ["--query-bank", str(tmp_path / "bank.npy"), "--out", side]
    result = runner.invoke(app, ["attach", path, *bank_args, "-m", "is:beta=15.0"])
    assert (
        result.exit_code == 2
        and "holds a sidecar already (nnn:alpha=0.75,k=8 attached to" in result.output
        and "--overwrite" in result.output
    )
    result = runner.invoke(app, ["attach", path, *bank_args, "-m", "is:beta=15.0", "--overwrite"])
    assert result.exit_code == 0 and f"replaced the sidecar in {side} (nnn:alpha=0.75,k=8 attached to {path})" in result.output
    # another collection's sidecar: named as such, not "changed since"
    other = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    other.add_with_ids(x[:50], ids[:50])
    faiss.write_index(other, str(tmp_path / "other.faiss"))
    result = runner.invoke(app, ["attach", str(tmp_path / "other.faiss"), "--out", side, "--search", str(tmp_path / "q.npy")])
    assert result.exit_code == 2 and f"is attached to {path}, not {tmp_path / 'other.faiss'}" in result.output
    # a plain index without ids: attached, with a note; --update --full
    plain = faiss.IndexFlatIP(D)
    plain.add(x)
    faiss.write_index(plain, str(tmp_path / "plain.faiss"))
    result = runner.invoke(
        app, ["attach", str(tmp_path / "plain.faiss"), "--query-bank", str(tmp_path / "bank.npy"), "--out", str(tmp_path / "p")]
    )
    assert result.exit_code == 0 and "note: " in result.output and "its ids are its positions" in result.output
    result = runner.invoke(
        app,
        [
            "attach",
            str(tmp_path / "plain.faiss"),
            "--query-bank",
            str(tmp_path / "bank.npy"),
            "--out",
            str(tmp_path / "p"),
            "--update",
            "--full",
        ],
    )
    assert result.exit_code == 0 and "0 changed in place" in result.output and f"compared every vector {len(x)}" in result.output


def test_a_plain_index_whose_positions_shift_is_refitted_by_its_update(data, tmp_path):
    """ids that are positions: FAISS renumbers them on remove_ids; the update of a FAISS file
    compares every vector with its digest, so the shifted items are found and refitted."""
    import faiss

    x, bank, queries = data["x"], data["bank"], data["queries"]
    plain = faiss.IndexFlatIP(D)
    plain.add(x)
    path = str(tmp_path / "plain.faiss")
    faiss.write_index(plain, path)
    attached = attach(path, bank, "nnn:alpha=0.75,k=8", out=tmp_path / "side")
    assert "positions" in attached.sidecar.info["notes"][0]
    plain.remove_ids(np.array([5], np.int64))  # positions 6.. become 5..
    faiss.write_index(plain, path)
    report = update(tmp_path / "side", path, bank)
    kept = np.delete(x, 5, axis=0)
    assert report["full"] and report["removed"] == 1 and report["changed"] == len(x) - 6
    want = exact_top(brute_force_nnn(kept, bank, queries, 0.75, 8), np.arange(len(kept)), 10)[0]
    result = AttachedCollection.open(path, tmp_path / "side").search_certified(queries, 10)
    np.testing.assert_array_equal(result.ids, want)


@pytest.mark.parametrize("collection", ["faiss-flat"], indirect=True)
def test_queries_answered_in_blocks_equal_one_block(collection, data, tmp_path, monkeypatch):
    from hubless.attached import certified

    uri = collection.create(data["x"], data["ids"])
    attached = attach(uri, data["bank"], "dis:beta=15.0", out=tmp_path / "side")
    whole = attached.search_certified(data["queries"], 10)
    monkeypatch.setattr(certified, "ANSWER_ELEMENTS", 200)  # a few queries per round
    blocks = attached.search_certified(data["queries"], 10)
    np.testing.assert_array_equal(blocks.ids, whole.ids)
    np.testing.assert_array_equal(blocks.scores, whole.scores)
    np.testing.assert_array_equal(blocks.certified, whole.certified)


def test_the_sidecar_is_switched_atomically_and_names_what_it_belongs_to(data, tmp_path, monkeypatch):
    import faiss

    from hubless import _atomic as _io
    from hubless.errors import MissingFile

    x, ids, bank = data["x"], data["ids"], data["bank"]
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    index.add_with_ids(x, ids)
    path = str(tmp_path / "c.faiss")
    faiss.write_index(index, path)
    side = tmp_path / "side"
    with pytest.raises(MissingFile, match="no attached sidecar"):
        AttachedCollection.open(path, side)
    first = attach(path, bank, "nnn:alpha=0.75,k=8", out=side)
    # a failure while writing a new version leaves the previous one serving, and no leftover
    calls = []

    def failing(p, array):
        calls.append(p)
        if len(calls) == 2:
            raise OSError("disk full")
        return original(p, array)

    original = _io.save_npy
    monkeypatch.setattr(_io, "save_npy", failing)
    with pytest.raises(OSError, match="disk full"):
        attach(path, bank, "nnn:alpha=0.5,k=4", out=side, overwrite=True)
    monkeypatch.setattr(_io, "save_npy", original)
    kept = read_sidecar(side)
    assert kept.spec == first.spec and len(list(side.glob("v-*"))) == 1
    np.testing.assert_array_equal(kept.bias, first.sidecar.bias)
    # replacing a sidecar takes overwrite=True, and says what it replaced; anything else is never replaced
    with pytest.raises(AlreadyExists, match=r"holds a sidecar already \(nnn:alpha=0.75,k=8 attached to .*c.faiss\): pass overwrite=True"):
        attach(path, bank, "nnn:alpha=0.5,k=4", out=side)
    replaced = attach(path, bank, "nnn:alpha=0.5,k=4", out=side, overwrite=True).sidecar.info["replaced"]
    assert replaced["spec"] == "nnn:alpha=0.75,k=8" and replaced["source"] == path
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("the user's")
    with pytest.raises(AlreadyExists, match="is not a sidecar"):
        attach(path, bank, out=tmp_path / "mine", overwrite=True)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "the user's"
    # another collection (other ids): refused, naming the one the sidecar belongs to
    other = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    other.add_with_ids(x, ids + 1)
    faiss.write_index(other, str(tmp_path / "other.faiss"))
    with pytest.raises(Conflict, match=rf"sidecar {side} is attached to {path}, not {tmp_path / 'other.faiss'}"):
        AttachedCollection.open(str(tmp_path / "other.faiss"), side)
    with pytest.raises(Conflict, match="attached to"):
        update(side, str(tmp_path / "other.faiss"), bank)


@pytest.mark.parametrize("engine", ["server", "in-process"])
def test_both_qdrant_sources_choose_the_vector_alike(engine, tmp_path, request):
    """A Qdrant collection (qdrant-client's engine standing in for a server) and an in-process
    shard with two named vectors: without vector_field= the choice is asked for, a name it does
    not have and a distance other than Dot / Cosine are refused, the same messages for both; a
    named Dot vector is attached by its name."""
    from hubless.attached.sources.qdrant import QdrantEdgeSource, QdrantSource

    if engine == "server":
        from qdrant_client import models

        client = request.getfixturevalue("qdrant_server")
        client.create_collection(
            "two",
            vectors_config={"a": models.VectorParams(size=4, distance=models.Distance.DOT), "b": models.VectorParams(size=4, distance=models.Distance.EUCLID)},
        )  # fmt: skip
        uri, what, open_source = f"qdrant+{QDRANT_TEST_URL}/two", "Qdrant collection", QdrantSource
    else:
        import qdrant_edge as qd

        config = qd.EdgeConfig(
            vectors={
                "a": qd.EdgeVectorParams(size=4, distance=qd.Distance.Dot),
                "b": qd.EdgeVectorParams(size=4, distance=qd.Distance.Euclid),
            }
        )
        qd.EdgeShard.create(str(tmp_path / "qd" / "two"), config).flush()
        uri, what, open_source = f"qdrant://{tmp_path / 'qd'}/two", "Qdrant shard", QdrantEdgeSource
    with pytest.raises(InvalidInput, match=rf"^{what} \S+ has the named vectors '[ab]', '[ab]': choose one with vector_field=$"):
        open_source(uri)
    with pytest.raises(InvalidInput, match=rf"^{what} \S+ has no vector 'c' \(it has '[ab]', '[ab]'\)$"):
        open_source(uri, vector_field="c")
    with pytest.raises(InvalidInput, match=rf"^{what} \S+ uses the euclid distance: a correction attaches to Dot or Cosine$"):
        open_source(uri, vector_field="b")
    source = open_source(uri, vector_field="a")
    assert (source.vector_field, source.dim, source.cosine) == ("a", 4, False)
