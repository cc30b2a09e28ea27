"""The Qdrant server store (``qdrant+http://host:port/collection``, hubless.export.qdrant_server)
through qdrant-client. No Qdrant server can be started here (none on PyPI), so the client the
store keeps for the test URL is qdrant-client's own local engine in a tmp dir, which serves the
same client API (collections, aliases, batch queries, scroll); the HTTP transport to a real
server is untested. The generic store tests (exact search = Index.search, every served method,
the CLI) run on this store too, in tests/export/test_export_stores.py; these are its own.
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from hubless import Index
from hubless.export import export, search, sync
from tests.conftest import QDRANT_TEST_URL

#: qdrant-client's local engine always scans, and says so when given search params.
pytestmark = pytest.mark.filterwarnings("ignore:Local mode performs exact")


@pytest.fixture
def server(qdrant_server):
    return qdrant_server


def _uri(name: str | None = None) -> str:
    return f"qdrant+{QDRANT_TEST_URL}/{name or 'g_' + uuid.uuid4().hex[:8]}"


@pytest.fixture
def index(small_data):
    meta = [{"caption": f"item {i}"} for i in range(60)]
    return Index.build(small_data["gallery"], small_data["query_bank"], "nnn:alpha=0.75,k=8", factory="Flat", metadata=meta)


def test_plain_server_search_is_uncorrected(server, index, small_data):
    uri = _uri()
    export(index, uri, ann="HNSW")
    q = small_data["queries"]
    got_i = search(uri, q, top_k=10, corrected=False, exact=True).ids
    want = np.argsort(-(q @ small_data["gallery"].T), axis=1, kind="stable")[:, :10]
    np.testing.assert_array_equal(got_i, want)
    # the default (HNSW) search path answers too; the local engine scans, so it equals exact here
    np.testing.assert_array_equal(search(uri, q, top_k=10, ef_search=64)[1], index.search(q, 10)[1])


def test_the_collection_is_an_alias_switched_on_overwrite(server, index, small_data):
    uri = _uri("gal")
    export(index, uri)
    first = {a.collection_name for a in server.get_aliases().aliases if a.alias_name == "gal"}
    export(index, uri, overwrite=True)
    second = {a.collection_name for a in server.get_aliases().aliases if a.alias_name == "gal"}
    assert first and second and first != second
    names = {c.name for c in server.get_collections().collections}
    assert names == first | second  # the previous physical collection serves its readers until the next export
    export(index, uri, overwrite=True)
    third = {a.collection_name for a in server.get_aliases().aliases if a.alias_name == "gal"}
    assert {c.name for c in server.get_collections().collections} == second | third


def test_clear_errors_for_existing_missing_mismatched_and_foreign_collections(server, index, small_data):
    from qdrant_client import models

    uri = _uri("gal")
    export(index, uri)
    with pytest.raises(FileExistsError, match="overwrite"):
        export(index, uri)
    with pytest.raises(ValueError, match="dimension"):
        search(uri, np.ones((2, 8), np.float32), top_k=3)
    with pytest.raises(LookupError, match="no collection 'missing_one'"):
        search(_uri("missing_one"), small_data["queries"], top_k=3)
    with pytest.raises(ValueError, match="unsupported Qdrant server index"):
        export(index, _uri(), ann="IVF")
    server.create_collection("foreign", vectors_config=models.VectorParams(size=16, distance=models.Distance.DOT))
    with pytest.raises(ValueError, match="not written by hubless"):
        search(_uri("foreign"), small_data["queries"], top_k=3)


def test_a_collection_with_another_metric_is_refused(server, index, small_data):
    from hubless.export.qdrant_server import INFO_ID

    uri = _uri("gal")
    export(index, uri)
    name = next(a.collection_name for a in server.get_aliases().aliases if a.alias_name == "gal")
    info = json.loads(server.retrieve(name, [INFO_ID], with_payload=True)[0].payload["hubless"])
    server.set_payload(name, {"hubless": json.dumps({**info, "metric": "cosine"})}, points=[INFO_ID])
    with pytest.raises(ValueError, match="cosine would normalise"):
        search(uri, small_data["queries"], top_k=3)


def test_an_interrupted_export_keeps_the_previous_collection(server, index, small_data, monkeypatch):
    uri = _uri("gal")
    export(index, uri)
    before = search(uri, small_data["queries"], top_k=10, exact=True)
    import hubless.progress
    from tests.conftest import interrupt_after_first

    monkeypatch.setattr(hubless.progress, "progress_bar", interrupt_after_first)
    with pytest.raises(KeyboardInterrupt):
        export(index, uri, overwrite=True, batch=16)
    monkeypatch.undo()
    after = search(uri, small_data["queries"], top_k=10, exact=True)
    np.testing.assert_array_equal(after[1], before[1])
    assert len(server.get_collections().collections) == 1  # the half-written one was dropped
    export(index, uri, overwrite=True, batch=16)
    np.testing.assert_array_equal(search(uri, small_data["queries"], top_k=10, exact=True)[1], before[1])


def test_sync_after_add_and_remove_equals_a_fresh_export(server, index, small_data):
    uri = _uri()
    export(index, uri)
    index.add(small_data["gallery_bank"][:5], metadata=[{"caption": f"new {i}"} for i in range(5)])
    index.remove([3])
    counts = sync(index, uri)
    assert counts == {"written": 5, "removed": 1, "unchanged": 59}  # by the items' stable ids: only what changed
    q = small_data["queries"]
    want_s, want_i = index.search(q, top_k=10)
    got_s, got_i = search(uri, q, top_k=10, exact=True)[:2]
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_allclose(got_s, want_s, atol=1e-5)


@pytest.mark.parametrize("kind", ["qdrant", "qdrant+http"])
def test_an_export_failing_on_bad_metadata_midway_keeps_the_previous_collection(kind, server, index, small_data, tmp_path, monkeypatch):
    """A real failing input: item 30's caption is not valid Unicode (a lone surrogate), met in the
    second batch after the first was written. Both Qdrant stores, in-process and server."""
    uri = f"qdrant://{tmp_path}/edge/gal" if kind == "qdrant" else _uri("gal")
    export(index, uri)
    before = search(uri, small_data["queries"], top_k=10, exact=True)
    meta = [{"caption": f"other {i}"} for i in range(60)]
    meta[30]["caption"] = "broken \ud800"
    with pytest.raises(ValueError, match="metadata 'caption' of item 30 is not valid Unicode"):  # an index refuses it
        Index.build(small_data["gallery"], small_data["gallery_bank"], "nnn:alpha=0.5,k=4", factory="Flat", metadata=meta)
    bad = Index.build(small_data["gallery"], small_data["gallery_bank"], "nnn:alpha=0.5,k=4", factory="Flat")
    monkeypatch.setattr(Index, "metadata", property(lambda self: meta))  # a store is given such records anyway
    with pytest.raises(ValueError, match="metadata 'caption' of item 30 is not valid Unicode"):
        export(bad, uri, overwrite=True, batch=16)
    monkeypatch.undo()
    after = search(uri, small_data["queries"], top_k=10, exact=True)
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_allclose(after[0], before[0])
    assert after.metadata[int(after.ids[0, 0])]["caption"].startswith("item ")
    if kind == "qdrant":  # only the previous version's directory is left
        assert len([p for p in (tmp_path / "edge" / "gal").iterdir() if p.is_dir()]) == 1
    else:
        assert len(server.get_collections().collections) == 1


def test_an_export_switching_the_alias_during_a_sync_wins_whole(server, index, small_data, monkeypatch):
    """A server has no lock hubless can hold across clients: an export (another client) that
    switches the alias between a sync's read and its writes must not receive the sync's diff."""
    from hubless.export.qdrant_server import QdrantServerStore

    uri = _uri()
    export(index, uri)
    other = Index.build(small_data["gallery_bank"][:60], small_data["query_bank"], "nnn:alpha=0.75,k=8", factory="Flat")
    read_rows = QdrantServerStore.read_rows

    def read_then_export(self):
        got = read_rows(self)
        export(other, uri, overwrite=True)  # lands between the sync's read and its writes
        return got

    monkeypatch.setattr(QdrantServerStore, "read_rows", read_then_export)
    index.add(small_data["gallery_bank"][60:65], metadata=[{"caption": f"new {i}"} for i in range(5)])
    assert sync(index, uri)["written"] == 5
    monkeypatch.undo()
    q = small_data["queries"]
    np.testing.assert_array_equal(search(uri, q, 10, exact=True)[1], other.search(q, 10)[1])
    assert search(uri, q, 70, exact=True)[1].max() < 60  # none of the sync's rows in the export's collection
