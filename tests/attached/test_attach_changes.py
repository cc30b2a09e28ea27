"""A sidecar that knows its collection (issue 52 item 3), on the real engines: a vector changed in
place, ids swapped, a reserve item changed or deleted, a file rewritten under an open handle or a
running service. The full check finds and repairs exactly what changed (the answers then equal
brute force over the collection as it is); an open handle refuses, or re-checks, before its next
answer; a reserve item is never served from its stale copy."""

from __future__ import annotations

import numpy as np
import pytest

from hubless.attached import AttachedCollection, attach, read_sidecar, update
from hubless.errors import Conflict
from tests.attached.test_attach import Collection, brute_force_nnn, exact_top, hub_prone

pytestmark = pytest.mark.filterwarnings("ignore:Local mode performs exact")

SPEC = "nnn:alpha=0.75,k=8"
STORES = ["faiss-flat", "lancedb", "qdrant-edge", "chroma", pytest.param("postgresql", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def pg_dsn(tmp_path_factory):
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


@pytest.fixture
def collection(request, tmp_path):
    made = Collection(request.param, tmp_path)
    if request.param == "postgresql":
        made.pg_dsn = request.getfixturevalue("pg_dsn")
    return made


@pytest.fixture
def data():
    rng = np.random.default_rng(21)
    return {
        "x": hub_prone(rng, 240),
        "bank": hub_prone(rng, 300),
        "queries": hub_prone(rng, 40),
        "ids": rng.permutation(240).astype(np.int64) * 7 + 11,
    }


def exact_now(x, ids, data):
    return exact_top(brute_force_nnn(x, data["bank"], data["queries"], 0.75, 8), ids, 10)[0]


@pytest.mark.parametrize("collection", STORES, indirect=True)
def test_an_in_place_change_is_found_by_the_full_check_and_repaired(collection, data, tmp_path):
    x, ids = data["x"].copy(), data["ids"]
    collection.create(x, ids)
    side = tmp_path / "side"
    attached = attach(collection.uri, data["bank"], SPEC, out=side, batch=64, **collection.options)
    sample = set(read_sidecar(side).ids[np.arange(0, 240, 240 // 32)].tolist())
    victim = next(int(i) for i in ids if int(i) not in sample)  # outside the first rotating sample
    hub = data["queries"].mean(axis=0)
    x[np.flatnonzero(ids == victim)] = hub / np.linalg.norm(hub)  # a hub: it enters many exact top-10s
    collection.replace([victim], x[ids == victim])
    want = exact_now(x, ids, data)
    assert (want == victim).any(axis=1).sum() >= 5  # the change matters
    # the open handle refuses before its next answer: a version mark changed (FAISS, LanceDB, pgvector),
    # or (Qdrant, Chroma: no mark) the changed item is among the hits, read and compared with its digest
    with pytest.raises(Conflict, match="changed since it was attached"):
        attached.search(data["queries"], 10)
    report = update(side, collection.uri, data["bank"], batch=64, **collection.options)  # the default update
    if not report["full"]:  # a rotating sample: this change is outside it
        assert (report["added"], report["removed"], report["changed"], report["checked"]) == (0, 0, 0, 32)
        report = update(side, collection.uri, data["bank"], full=True, batch=64, **collection.options)
    assert report["full"] and (report["added"], report["removed"], report["changed"], report["refit"]) == (0, 0, 1, None)
    assert report["checked"] == 240
    repaired = AttachedCollection.open(collection.uri, side, **collection.options)
    result = repaired.search_certified(data["queries"], 10)
    np.testing.assert_array_equal(result.ids, want)  # the answers are the exact ones again
    np.testing.assert_array_equal(repaired.exact_search(data["queries"], 10).ids, want)
    if repaired.source.searches_exactly({}):
        assert result.certified.all() and result.exact.mean() >= 0.9
    else:  # Chroma's HNSW: certified relative to its plain ranking, never claimed exact
        assert result.certified.all() and not result.exact.any()
    # nothing changed since: the full check finds nothing, refits nothing
    again = update(side, collection.uri, data["bank"], full=True, batch=64, **collection.options)
    assert (again["added"], again["removed"], again["changed"], again["refit"]) == (0, 0, 0, None)


@pytest.mark.parametrize("collection", ["faiss-flat", "lancedb"], indirect=True)
def test_swapped_ids_and_every_vector_replaced_are_found_by_the_full_check(collection, data, tmp_path):
    x, ids = data["x"].copy(), data["ids"]
    collection.create(x, ids)
    side = tmp_path / "side"
    attach(collection.uri, data["bank"], SPEC, out=side, **collection.options)
    a, b = int(ids[3]), int(ids[7])
    x[[3, 7]] = x[[7, 3]]  # two ids swap their vectors: the id set and the count are unchanged
    collection.replace([a, b], x[[3, 7]])
    report = update(side, collection.uri, data["bank"], full=True, **collection.options)
    assert (report["changed"], report["added"], report["removed"]) == (2, 0, 0)
    np.testing.assert_array_equal(AttachedCollection.open(collection.uri, side).search(data["queries"], 10).ids, exact_now(x, ids, data))
    # every vector but a sample's replaced: more than a quarter changed, so everything is refitted
    rng = np.random.default_rng(4)
    keep = np.zeros(240, bool)
    keep[::8] = True
    x[~keep] = hub_prone(rng, int((~keep).sum()))
    collection.replace(ids[~keep], x[~keep])
    report = update(side, collection.uri, data["bank"], full=True, **collection.options)
    assert report["refit"] and report["changed"] == int((~keep).sum())
    result = AttachedCollection.open(collection.uri, side).search_certified(data["queries"], 10)
    np.testing.assert_array_equal(result.ids, exact_now(x, ids, data))


@pytest.mark.parametrize("collection", ["qdrant-edge", "chroma"], indirect=True)
def test_a_reserve_item_changed_or_deleted_in_the_store_is_not_served_from_its_stale_copy(collection, data, tmp_path):
    """A store without a version mark: the reserve's copy of a vector is compared with the store's
    vector before it is served."""
    x, ids = data["x"], data["ids"]
    collection.create(x, ids)
    attached = attach(collection.uri, data["bank"], SPEC, out=tmp_path / "side", **collection.options)
    reserve = attached.reserve_ids
    item = int(reserve[0])
    query = x[ids == item]  # the item's own vector: it is its own top-1
    assert attached.search(query, 1).ids[0, 0] == item
    collection.replace([item], -query)  # negated in the store; the sidecar's copy is the old vector
    with pytest.raises(Conflict, match=f"reserve item {item} was changed in place"):
        attached.search(query, 1)
    collection.replace([item], query)  # back as it was: served again
    assert attached.search(query, 1).ids[0, 0] == item
    other = int(reserve[1])
    collection.remove([other])  # deleted, and another item added: the count is the same
    collection.add(hub_prone(np.random.default_rng(1), 1), np.array([10**9], np.int64))
    with pytest.raises(Conflict, match="changed since it was attached"):
        attached.search(x[ids == other], 1)


def test_a_faiss_file_rewritten_under_an_open_handle_is_checked_before_the_next_answer(data, tmp_path):
    coll = Collection("faiss-flat", tmp_path)
    x, ids = data["x"].copy(), data["ids"]
    coll.create(x, ids)
    attached = attach(coll.uri, data["bank"], SPEC, out=tmp_path / "side")
    first = attached.search(data["queries"], 10)
    coll.create(x, ids)  # written again, the same content: a new mark, every vector compared, served
    again = attached.search(data["queries"], 10)
    np.testing.assert_array_equal(again.ids, first.ids)
    assert again.exact.all()
    x[5] = -x[5]
    coll.replace([ids[5]], x[5:6])  # one vector changed: refused, naming the change
    with pytest.raises(Conflict, match="1 changed"):
        attached.search(data["queries"], 10)
    with pytest.raises(Conflict, match="1 changed"):
        AttachedCollection.open(coll.uri, tmp_path / "side")


def test_a_running_service_rechecks_a_rewritten_file_before_it_answers(data, tmp_path):
    pytest.importorskip("fastapi")
    from starlette.testclient import TestClient

    from hubless.service import create_app

    coll = Collection("faiss-flat", tmp_path)
    x, ids = data["x"].copy(), data["ids"]
    coll.create(x, ids)
    side = tmp_path / "side"
    attach(coll.uri, data["bank"], SPEC, out=side)
    body = {"index": "mine", "embeddings": data["queries"][:3].tolist(), "top_k": 5}
    with TestClient(base_url="http://localhost", app=create_app({"mine": side})) as client:
        answer = client.post("/search", json=body)
        assert answer.status_code == 200 and all(r["exact"] and r["certified"] for r in answer.json()["results"])
        x[0] = -x[0]
        coll.replace([ids[0]], x[:1])
        refused = client.post("/search", json=body)
        assert refused.status_code == 409 and "attach --update" in refused.json()["detail"]
        update(side, coll.uri, data["bank"])  # the sidecar in step again: the server reads it, serves, exact
        answer = client.post("/search", json=body)
        assert answer.status_code == 200 and all(r["exact"] for r in answer.json()["results"])
        want = exact_top(brute_force_nnn(x, data["bank"], data["queries"][:3], 0.75, 8), ids, 5)[0]
        assert [[h["id"] for h in r["hits"]] for r in answer.json()["results"]] == want.tolist()


def test_a_sidecar_written_before_digests_is_served_never_claimed_exact_and_its_update_reattaches(data, tmp_path):
    """A sidecar of an earlier hubless (no digests.npy, no scale.npy; its open checks the old
    32-item sample hash): served as before, certified but never claimed exact, and its update
    attaches again (every vector read once) to record the digests."""
    import json

    from hubless.attached import sidecar as sidecar_module
    from hubless.attached.sources.base import open_source, sample_hash

    coll = Collection("faiss-flat", tmp_path)
    x, ids = data["x"], data["ids"]
    coll.create(x, ids)
    side = tmp_path / "side"
    sorted_ids = attach(coll.uri, data["bank"], SPEC, out=side).sidecar.ids
    version = next(side.glob("v-*"))
    for name in ("digests.npy", "scale.npy"):
        (version / name).unlink()
    info = json.loads((version / "attach.json").read_text())
    info = {k: v for k, v in info.items() if k != "info_sha256"}
    for name in ("digests.npy", "scale.npy"):
        del info["files_sha256"][name]
    info["fingerprint"]["sample_ids"], info["fingerprint"]["sample_sha256"] = sample_hash(open_source(coll.uri), sorted_ids)
    info.pop("beam"), info["source"].pop("version")
    (version / "attach.json").write_text(json.dumps({**info, "info_sha256": sidecar_module._info_sha256(info)}))
    old = AttachedCollection.open(coll.uri, side)
    assert old.sidecar.digests is None
    result = old.search_certified(data["queries"], 10)
    np.testing.assert_array_equal(result.ids, exact_now(x, ids, data))
    assert result.certified.all() and not result.exact.any()
    report = update(side, coll.uri, data["bank"])
    assert "no digests" in report["refit"] and report["read_items"] == 240
    again = AttachedCollection.open(coll.uri, side).search_certified(data["queries"], 10)
    assert again.exact.mean() >= 0.9 and read_sidecar(side).digests is not None
