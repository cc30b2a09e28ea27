"""hubless.export beyond the contract suite (tests/export/test_store_contract.py), on real PostgreSQL +
pgvector (pgserver, started here), Qdrant's engine in-process and the Qdrant server store (on
qdrant-client's engine): foreign and other-metric tables, the CLI, writers in several processes,
the writer lock's timeout, Qdrant's one-process limit, an unreachable server."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from hubless import Index
from hubless.export import export, search
from tests.conftest import QDRANT_TEST_URL

#: qdrant-client's local engine (standing in for a server) always scans, and warns when given search params.
pytestmark = pytest.mark.filterwarnings("ignore:Local mode performs exact")


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL with pgvector (the pgserver package), on a unix socket in a tmp dir."""
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server.get_uri()  # postgresql://postgres:@/postgres?host=<socket dir>
    server.cleanup()


def _store_uri(kind: str, tmp_path, postgres_uri: str | None, name: str | None = None) -> str:
    name = name or f"g_{uuid.uuid4().hex[:8]}"
    if kind in ("qdrant", "chroma"):
        return f"{kind}://{tmp_path}/{kind}/{name}"
    base, _, query = postgres_uri.partition("?")
    return f"{base}/{name}?{query}"


@pytest.fixture(params=["postgresql", "qdrant", "qdrant+http"])
def store(request, tmp_path):
    if request.param == "qdrant+http":  # the server store, on qdrant-client's engine (see conftest)
        request.getfixturevalue("qdrant_server")
        return lambda name=None: f"qdrant+{QDRANT_TEST_URL}/{name or 'g_' + uuid.uuid4().hex[:8]}"
    uri = request.getfixturevalue("postgres") if request.param == "postgresql" else None
    return lambda name=None: _store_uri(request.param, tmp_path, uri, name)


@pytest.fixture
def index(small_data):
    meta = [{"caption": f"item {i}"} for i in range(60)]
    return Index.build(small_data["gallery"], small_data["query_bank"], "nnn:alpha=0.75,k=8", factory="Flat", metadata=meta)


def test_a_store_written_with_another_metric_is_refused(tmp_path, postgres, small_data):
    import psycopg

    base, _, query = postgres.partition("?")
    with psycopg.connect(postgres) as conn:
        conn.execute("CREATE TABLE cosine_store (id bigint)")
        info = {"format_version": 1, "spec": "nnn", "metric": "cosine", "dim": 16, "bias_columns": 1, "n_items": 1}
        conn.execute(f"COMMENT ON TABLE cosine_store IS '{json.dumps(info)}'")
        conn.execute("CREATE TABLE foreign_table (id bigint)")
    with pytest.raises(ValueError, match="cosine would normalise"):
        search(f"{base}/cosine_store?{query}", small_data["queries"], top_k=3)
    with pytest.raises(ValueError, match="not written by hubless"):
        search(f"{base}/foreign_table?{query}", small_data["queries"], top_k=3)


def test_cli_export_and_search_on_postgres_and_qdrant(store, index, small_data, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app

    index.save(tmp_path / "idx")
    np.save(tmp_path / "q.npy", small_data["queries"])
    uri = store()
    runner = CliRunner()
    ok = runner.invoke(app, ["export", str(tmp_path / "idx"), "--to", uri])
    assert ok.exit_code == 0, ok.output
    result = runner.invoke(app, ["search", uri, "--queries", str(tmp_path / "q.npy"), "--top-k", "5", "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    assert [[h["id"] for h in line["hits"]] for line in lines] == index.search(small_data["queries"], 5)[1].tolist()


def test_cli_search_never_prints_the_password_of_a_store_uri(postgres, index, small_data, tmp_path):
    """The table `hubless search` prints is titled with the store's URI without its credentials
    (the local server trusts its socket, so the password given is not checked, only carried)."""
    from typer.testing import CliRunner

    from hubless.cli.main import app

    base, _, query = postgres.partition("?")
    uri = f"{base.replace('postgres:@', 'postgres:s3cret-word@', 1)}/g_{uuid.uuid4().hex[:8]}?{query}"
    assert "s3cret-word" in uri
    index.save(tmp_path / "idx")
    np.save(tmp_path / "q.npy", small_data["queries"][:2])
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(tmp_path / "idx"), "--to", uri]).exit_code == 0
    as_param = uri.replace("postgres:s3cret-word@", "postgres:@", 1) + "&password=s3cret-word"  # the same store, libpq's other form
    for given in (uri, as_param):
        result = runner.invoke(app, ["search", given, "--queries", str(tmp_path / "q.npy"), "--top-k", "3"])
        assert result.exit_code == 0, result.output
        assert "s3cret-word" not in result.output and "top 3" in result.output


@pytest.mark.parametrize(
    ("uri", "kept", "shown"),
    [
        ("postgresql://alice:s3c:r%40t@host:5432/db/t", "postgresql://alice@host:5432/db/t", "postgresql://host:5432/db/t"),
        ("postgresql://user:@/db/t?host=/tmp/s", "postgresql://user@/db/t?host=/tmp/s", "postgresql:///db/t?host=/tmp/s"),
        (
            "postgresql://u@h/db/t?password=zz&sslmode=require",
            "postgresql://u@h/db/t?sslmode=require",
            "postgresql://h/db/t?password=...&sslmode=require",
        ),
        (
            "postgresql://h/db/t?sslmode=require&PASSWORD=zz",
            "postgresql://h/db/t?sslmode=require",
            "postgresql://h/db/t?sslmode=require&PASSWORD=...",
        ),
        ("lancedb:///data/db/table", "lancedb:///data/db/table", "lancedb:///data/db/table"),
        ("faiss:///data//a:b@c/i.faiss", "faiss:///data//a:b@c/i.faiss", "faiss:///data//c/i.faiss"),  # a path, kept
        ("/data//a:b@c/what?password=x.faiss", "/data//a:b@c/what?password=x.faiss", "/data//c/what?password=..."),
    ],
)
def test_the_credential_rules_of_a_store_address(uri, kept, shown):
    """What a sidecar records and its owner sees (the user kept, the password gone), and what
    anyone may see (no user info at all, a password parameter's value hidden)."""
    from hubless.export.base import hide_credentials, without_password

    assert (without_password(uri), hide_credentials(uri)) == (kept, shown)


def test_cli_sync_writes_only_the_new_rows(store, index, small_data, tmp_path):
    from typer.testing import CliRunner

    from hubless.cli.main import app
    from tests.conftest import unit_rows

    index.save(tmp_path / "idx")
    uri = store()
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(tmp_path / "idx"), "--to", uri]).exit_code == 0
    np.save(tmp_path / "new.npy", unit_rows(np.random.default_rng(4), 3, 16))
    added = runner.invoke(app, ["index", "add", str(tmp_path / "idx"), "--embeddings", str(tmp_path / "new.npy")])
    assert added.exit_code == 0, added.output
    result = runner.invoke(app, ["export", str(tmp_path / "idx"), "--to", uri, "--sync"])
    assert result.exit_code == 0, result.output
    assert "3 row(s) written, 0 removed, 60 unchanged" in result.output
    grown = Index.load(tmp_path / "idx")
    np.testing.assert_array_equal(search(uri, small_data["queries"], 10, exact=True)[1], grown.search(small_data["queries"], 10)[1])


def test_a_qdrant_collection_with_another_metric_is_refused(tmp_path, index, small_data):
    uri = f"qdrant://{tmp_path}/qd/g"
    export(index, uri)
    version = tmp_path / "qd" / "g" / (tmp_path / "qd" / "g" / "CURRENT").read_text().strip()
    info = json.loads((version / "hubless.json").read_text())
    (version / "hubless.json").write_text(json.dumps({**info, "metric": "cosine"}))
    with pytest.raises(ValueError, match="cosine would normalise"):
        search(uri, small_data["queries"], top_k=3)
    (version / "hubless.json").unlink()
    with pytest.raises(ValueError, match="not written by hubless"):
        search(uri, small_data["queries"], top_k=3)


def test_the_first_searches_of_an_embedded_qdrant_store_from_many_threads_load_it_once(tmp_path, index, small_data, monkeypatch):
    """Threads of one process (a served store under concurrent requests) all search a store
    none of them has opened yet: the shard is loaded once and every search answers (a second
    load used to hit Qdrant's own file lock: "open in another process", a 503 in the service).
    The load is slowed so that the threads meet in it."""
    import threading
    import time
    import types
    from concurrent.futures import ThreadPoolExecutor

    from hubless.export import qdrant_store

    uri = f"qdrant://{tmp_path}/qd/g"
    export(index, uri)
    for key in [k for k in qdrant_store._OPEN if k.startswith(str(tmp_path))]:  # as a new server finds it
        qdrant_store._OPEN.pop(key).close()
    real = qdrant_store._qdrant()
    loads = []

    def slow_load(path):
        loads.append(threading.get_ident())
        time.sleep(0.3)
        return real.EdgeShard.load(path)

    engine = types.SimpleNamespace(**{name: getattr(real, name) for name in dir(real) if not name.startswith("__")})
    engine.EdgeShard = types.SimpleNamespace(load=slow_load)
    monkeypatch.setattr(qdrant_store, "_qdrant", lambda: engine)
    queries = small_data["queries"]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: search(uri, np.roll(queries, i, axis=0), 5)[1], range(4)))
    assert len(loads) == 1
    for i, ids in enumerate(answers):
        np.testing.assert_array_equal(ids, search(uri, np.roll(queries, i, axis=0), 5)[1])


@pytest.mark.parametrize("kind", ["lancedb", "postgresql", "qdrant", "chroma"])  # Milvus Lite: one process at a time
def test_concurrent_exports_and_syncs_of_one_store_all_land_whole(kind, tmp_path, request, small_data):
    """Two processes export (overwrite) and sync the same table at once, several times: the
    store's writer lock serialises them, none fails, and the store ends equal to the index."""
    import subprocess
    import sys
    from pathlib import Path

    pg = request.getfixturevalue("postgres") if kind == "postgresql" else None
    name = f"c_{uuid.uuid4().hex[:6]}"
    uri = f"lancedb://{tmp_path}/lance/{name}" if kind == "lancedb" else _store_uri(kind, tmp_path, pg, name)
    index = Index.build(small_data["gallery"], small_data["query_bank"], "nnn:alpha=0.75,k=8", factory="Flat")
    index.save(tmp_path / "idx")
    root = Path(__file__).resolve().parents[2]
    script = f"""
import sys
sys.path.insert(0, {str(root)!r})
from hubless import Index
from hubless.export import export, sync
index = Index.load({str(tmp_path / "idx")!r})
for _ in range(4):
    export(index, {uri!r}, overwrite=True, batch=8)
    sync(index, {uri!r})
"""
    writers = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errors = [w.communicate(timeout=240)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0], errors
    want_s, want_i = index.search(small_data["queries"], 10)
    got_s, got_i = search(uri, small_data["queries"], top_k=10, exact=True)[:2]
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)


@pytest.mark.parametrize("kind", ["lancedb", "postgresql", "qdrant"])
def test_a_writer_waiting_too_long_for_the_store_lock_gets_a_clear_error(kind, tmp_path, request, small_data, monkeypatch):
    from hubless.export import open_store
    from hubless.index.lock import IndexLockedError

    pg = request.getfixturevalue("postgres") if kind == "postgresql" else None
    name = f"l_{uuid.uuid4().hex[:6]}"
    uri = f"lancedb://{tmp_path}/lance/{name}" if kind == "lancedb" else _store_uri(kind, tmp_path, pg, name)
    index = Index.build(small_data["gallery"], small_data["query_bank"], "nnn", factory="Flat")
    export(index, uri)
    monkeypatch.setenv("HUBLESS_LOCK_TIMEOUT", "0.3")
    with open_store(uri).writer_lock():  # another writer holds it
        with pytest.raises(IndexLockedError, match="HUBLESS_LOCK_TIMEOUT"):
            export(index, uri, overwrite=True)
    export(index, uri, overwrite=True)  # released: the next writer goes ahead
    np.testing.assert_array_equal(search(uri, small_data["queries"], top_k=5, exact=True)[1], index.search(small_data["queries"], 5)[1])


def test_a_qdrant_store_open_in_one_process_is_refused_clearly_in_another_and_synced_by_copy(tmp_path, small_data):
    """Qdrant's in-process engine locks a shard's log: a second process's search gets a clear
    StoreUnavailable naming the limit, while its sync goes to a copy that becomes current."""
    import subprocess
    import sys
    from pathlib import Path

    uri = f"qdrant://{tmp_path}/qd/g"
    index = Index.build(small_data["gallery"], small_data["query_bank"], "nnn", factory="Flat")
    export(index, uri)
    search(uri, small_data["queries"], top_k=3)  # this process now holds the shard open
    index.add(small_data["gallery_bank"][:3])
    index.save(tmp_path / "idx")
    root = Path(__file__).resolve().parents[2]
    script = f"""
import sys
sys.path.insert(0, {str(root)!r})
import numpy as np
from hubless import Index
from hubless.errors import HublessError
from hubless.export import search, sync
try:
    search({uri!r}, np.ones((1, 16), np.float32), top_k=3)
except HublessError as exc:
    print("REFUSED", exc)
print("SYNC", sync(Index.load({str(tmp_path / "idx")!r}), {uri!r}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "REFUSED" in done.stdout and "one process at a time" in done.stdout and "qdrant+http" in done.stdout
    assert "'written': 3" in done.stdout
    np.testing.assert_array_equal(search(uri, small_data["queries"], 10, exact=True)[1], index.search(small_data["queries"], 10)[1])


def test_an_unreachable_qdrant_server_is_a_clean_hubless_error(small_data):
    from hubless.errors import Busy

    index = Index.build(small_data["gallery"], small_data["query_bank"], "nnn", factory="Flat")
    with pytest.raises(Busy, match="cannot reach the Qdrant server at http://127.0.0.1:1"):
        export(index, "qdrant+http://127.0.0.1:1/gallery")
    with pytest.raises(Busy, match="cannot reach the Qdrant server"):
        search("qdrant+http://127.0.0.1:1/gallery", small_data["queries"], 3)
    for address in (":6333", "host:abc", "host:99999"):  # refused as a URI, before any connection
        with pytest.raises(ValueError, match="not a server address"):
            export(index, f"qdrant+http://{address}/gallery")


def test_cli_search_passes_the_weight_by_its_name_and_the_knob_of_the_store(tmp_path, small_data):
    """`hubless search STORE --alpha` on a DN store sets lam; --ef-search reaches an HNSW store;
    --nprobe is refused there naming ef_search; --target-recall and --option reach export."""
    from typer.testing import CliRunner

    from hubless.cli.main import app

    d = small_data
    index = Index.build(d["gallery"], d["query_bank"], "dn:lam=0.4", factory="Flat")
    index.save(tmp_path / "idx")
    np.save(tmp_path / "q.npy", d["queries"])
    uri = f"qdrant://{tmp_path}/qd/dn"
    runner = CliRunner()
    ok = runner.invoke(app, ["export", str(tmp_path / "idx"), "--to", uri, "--ann", "HNSW", "--target-recall", "0.9", "--option", "m=8"])
    assert ok.exit_code == 0, ok.output
    assert "ef_search=" in ok.output and "recall@10" in ok.output
    result = runner.invoke(
        app, ["search", uri, "--queries", str(tmp_path / "q.npy"), "--top-k", "5", "--json", "--weight", "0.9", "--ef-search", "64"]
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.strip().splitlines()]
    assert [[h["id"] for h in line["hits"]] for line in lines] == index.search(d["queries"], 5, weight=0.9)[1].tolist()
    refused = runner.invoke(app, ["search", uri, "--queries", str(tmp_path / "q.npy"), "--nprobe", "4"])
    assert refused.exit_code == 2 and "nprobe" in refused.output and "ef_search" in refused.output
    bad = runner.invoke(app, ["export", str(tmp_path / "idx"), "--to", f"qdrant://{tmp_path}/qd/x", "--option", "nope=1"])
    assert bad.exit_code == 2 and "nope" in bad.output and "valid" in bad.output
