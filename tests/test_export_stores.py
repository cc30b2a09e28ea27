"""hubless.export against real PostgreSQL + pgvector (pgserver, started here), the real Qdrant
engine (qdrant-edge-py, in-process) and the Qdrant server store (on qdrant-client's engine): exact store search equals Index.search (Flat), the ANN
variants reach their documented recall, bad stores give clear errors, and an interrupted export
leaves the previous table or collection intact."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from hubless import Index
from hubless.export import export, search
from tests.conftest import QDRANT_TEST_URL


@pytest.fixture(scope="session")
def postgres(tmp_path_factory):
    """A real PostgreSQL with pgvector (the pgserver package), on a unix socket in a tmp dir."""
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server.get_uri()  # postgresql://postgres:@/postgres?host=<socket dir>
    server.cleanup()


def _store_uri(kind: str, tmp_path, postgres_uri: str | None, name: str | None = None) -> str:
    name = name or f"g_{uuid.uuid4().hex[:8]}"
    if kind == "qdrant":
        return f"qdrant://{tmp_path}/qd/{name}"
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


def test_exact_store_search_equals_the_index(store, index, small_data):
    uri = store()
    export(index, uri)
    q = small_data["queries"]
    for alpha in (None, 0.3):
        w = {} if alpha is None else {"alpha": alpha}
        want_s, want_i = index.search(q, top_k=10, **w)
        got_s, got_i, meta = search(uri, q, top_k=10, exact=True, **w)
        np.testing.assert_array_equal(got_i, want_i)
        np.testing.assert_allclose(got_s, want_s, atol=1e-5)
    assert meta[0][0] == {"id": int(got_i[0, 0]), "caption": f"item {got_i[0, 0]}"}


def test_plain_store_search_is_uncorrected(store, index, small_data):
    uri = store()
    export(index, uri)
    q = small_data["queries"]
    _, got_i, _ = search(uri, q, top_k=5, corrected=False, exact=True)
    want = np.argsort(-(q @ small_data["gallery"].T), axis=1, kind="stable")[:, :5]
    np.testing.assert_array_equal(got_i, want)


def test_clear_errors_for_existing_missing_and_mismatched_stores(store, index, small_data):
    uri = store()
    export(index, uri)
    with pytest.raises(FileExistsError, match="overwrite"):
        export(index, uri)
    export(index, uri, overwrite=True)
    with pytest.raises(ValueError, match="dimension"):
        search(uri, np.ones((2, 8), np.float32), top_k=3)
    with pytest.raises(LookupError, match="no (table|collection) 'missing_one'"):
        search(store("missing_one"), small_data["queries"], top_k=3)


def test_an_interrupted_export_keeps_the_previous_store(store, index, small_data, monkeypatch):
    uri = store()
    export(index, uri)
    before = search(uri, small_data["queries"], top_k=10, exact=True)[1]
    import hubless.progress
    from tests.conftest import interrupt_after_first

    monkeypatch.setattr(hubless.progress, "progress_bar", interrupt_after_first)
    with pytest.raises(KeyboardInterrupt):
        export(index, uri, overwrite=True, batch=16)
    monkeypatch.undo()
    np.testing.assert_array_equal(search(uri, small_data["queries"], top_k=10, exact=True)[1], before)
    export(index, uri, overwrite=True, batch=16)  # and the next export succeeds over the leftovers
    np.testing.assert_array_equal(search(uri, small_data["queries"], top_k=10, exact=True)[1], before)


@pytest.mark.parametrize("kind, recall", [("postgresql", 0.95), ("qdrant", 0.95)])
def test_hnsw_variants_reach_their_documented_recall(kind, recall, tmp_path, request):
    rng = np.random.default_rng(22)
    g, b, q = (rng.standard_normal((n, 31)).astype(np.float32) for n in (4000, 3000, 50))
    index = Index.build(g, b, "nnn:alpha=0.75,k=8", "Flat")
    pg = request.getfixturevalue("postgres") if kind == "postgresql" else None
    uri = _store_uri(kind, tmp_path, pg)
    export(index, uri, ann="HNSW")
    _, exact_ids = index.search(q, 10)
    _, ids, _ = search(uri, q, 10)
    got = np.mean([len(set(a) & set(e)) for a, e in zip(ids, exact_ids)]) / 10
    assert got >= recall, got
    np.testing.assert_array_equal(search(uri, q, 10, exact=True)[1], exact_ids)


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
    assert [[h["id"] for h in line["results"]] for line in lines] == index.search(small_data["queries"], 5)[1].tolist()


@pytest.mark.parametrize("spec", ["nnn:alpha=0.75,k=8", "is:beta=15.0"])
@pytest.mark.parametrize("kind", ["lancedb", "postgresql", "qdrant"])
def test_sync_after_add_remove_and_bank_growth_equals_a_fresh_export(kind, spec, tmp_path, request, small_data):
    from hubless.export import sync
    from hubless.export.query import _backend, parse_uri
    from tests.conftest import unit_rows

    pg = request.getfixturevalue("postgres") if kind == "postgresql" else None

    run = uuid.uuid4().hex[:6]  # one PostgreSQL database serves every test: names of this run only

    def uri_of(name):
        return f"lancedb://{tmp_path}/lance/{name}" if kind == "lancedb" else _store_uri(kind, tmp_path, pg, f"{name}_{run}")

    def rows(uri):
        u = parse_uri(uri)
        backend = _backend(u.scheme)
        return backend.read_rows(backend.open_table(u.location, u.table)[0])

    rng = np.random.default_rng(3)
    meta = [{"caption": f"item {i}"} for i in range(60)]
    index = Index.build(small_data["gallery"], small_data["query_bank"], spec, factory="Flat", metadata=meta)
    live = uri_of("live")
    export(index, live)
    steps = [
        (lambda: index.add(unit_rows(rng, 5, 16), [{"caption": f"new {i}"} for i in range(5)]), {"written": 5, "removed": 0}),
        (lambda: index.remove([3]), {"written": 61, "removed": 1}),  # ids are positions: rows after 3 move up
        (lambda: index.add_query_bank(unit_rows(rng, 40, 16)), None),  # every bias may change
    ]
    q = small_data["queries"]
    for step, (change, counts) in enumerate(steps):
        change()
        done = sync(index, live)
        if counts is not None:
            assert {k: done[k] for k in counts} == counts
        fresh = uri_of(f"fresh{step}")
        export(index, fresh)
        got_ids, got = rows(live)
        want_ids, want = rows(fresh)
        np.testing.assert_array_equal(got_ids, want_ids)
        np.testing.assert_array_equal(got, want)
        s_live, i_live, m_live = search(live, q, top_k=10, exact=True)
        s_fresh, i_fresh, m_fresh = search(fresh, q, top_k=10, exact=True)
        np.testing.assert_array_equal(i_live, i_fresh)
        want_s, want_i = index.search(q, 10)
        np.testing.assert_array_equal(i_live, want_i)
        np.testing.assert_allclose(s_live, want_s, rtol=1e-4, atol=1e-5)  # the synced query state (IS's bank size)
        assert m_live == m_fresh
    assert sync(index, live)["written"] == 0  # nothing changed: nothing written
    other = Index.build(small_data["gallery"], small_data["query_bank"], "dn", factory="Flat")
    with pytest.raises(ValueError, match="export it again with overwrite"):
        sync(other, live)


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


@pytest.mark.parametrize("spec", ["dn:lam=0.4", "is:beta=15.0", "dualis", "baseline"])
def test_every_constant_weight_method_is_served_with_the_index_scores(spec, store, small_data):
    d = small_data
    index = Index.build(d["gallery"], d["query_bank"], spec, factory="Flat", gallery_bank=d["gallery_bank"])
    uri = store()
    export(index, uri)
    want_s, want_i = index.search(d["queries"], top_k=10)
    got_s, got_i, _ = search(uri, d["queries"], top_k=10, exact=True)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("spec", ["dis:k_activation=1", "csls"])
def test_methods_needing_raw_neighbours_are_refused_with_the_reason(spec, store, small_data):
    d = small_data
    index = Index.build(d["gallery"], d["query_bank"], spec, factory="Flat")
    uri = store()
    export(index, uri)
    with pytest.raises(ValueError, match="raw neighbours"):
        search(uri, d["queries"], top_k=10)


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


@pytest.mark.parametrize("kind", ["lancedb", "postgresql", "qdrant"])
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
    root = Path(__file__).resolve().parents[1]
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
    got_s, got_i, _ = search(uri, small_data["queries"], top_k=10, exact=True)
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)


@pytest.mark.parametrize("kind", ["lancedb", "postgresql", "qdrant"])
def test_a_writer_waiting_too_long_for_the_store_lock_gets_a_clear_error(kind, tmp_path, request, small_data, monkeypatch):
    from hubless.export.query import _backend, parse_uri
    from hubless.index.lock import IndexLockedError

    pg = request.getfixturevalue("postgres") if kind == "postgresql" else None
    name = f"l_{uuid.uuid4().hex[:6]}"
    uri = f"lancedb://{tmp_path}/lance/{name}" if kind == "lancedb" else _store_uri(kind, tmp_path, pg, name)
    index = Index.build(small_data["gallery"], small_data["query_bank"], "nnn", factory="Flat")
    export(index, uri)
    u = parse_uri(uri)
    monkeypatch.setenv("HUBLESS_LOCK_TIMEOUT", "0.3")
    with _backend(u.scheme).writer_lock(u.location, u.table):  # another writer holds it
        with pytest.raises(IndexLockedError, match="HUBLESS_LOCK_TIMEOUT"):
            export(index, uri, overwrite=True)
    export(index, uri, overwrite=True)  # released: the next writer goes ahead
    np.testing.assert_array_equal(search(uri, small_data["queries"], top_k=5, exact=True)[1], index.search(small_data["queries"], 5)[1])
