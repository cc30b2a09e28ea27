"""An attached collection served like an index (issue 42 item 4): the Searcher opens a sidecar
directory as an AttachedIndex, POST /search answers with the index answer's shape plus each
query's ``certified``, equal to AttachedCollection.search_certified; GET /indexes lists it; writes
are refused (409). And AttachedCollection.evaluate: recall@k against exact corrected search.
Real FAISS file and an embedded LanceDB table (the collections of tests/attached/test_attach.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hubless.attached import AttachedCollection, attach
from hubless.attached.certified import recall_at_k
from hubless.errors import Conflict, InvalidInput
from hubless.search import AttachedIndex, Searcher
from tests.attached.test_attach import Collection, hub_prone

pytest.importorskip("fastapi")
pytest.importorskip("pydantic_settings")
from starlette.testclient import TestClient  # noqa: E402

from hubless.service import create_app  # noqa: E402

SPEC = "nnn:alpha=0.75,k=8"


@pytest.fixture
def attached(request, tmp_path):
    rng = np.random.default_rng(3)
    x, bank = hub_prone(rng, 200), hub_prone(rng, 250)
    ids = rng.permutation(np.arange(200) * 7 + 5).astype(np.int64)
    coll = Collection(request.param, tmp_path)
    coll.create(x, ids)
    side = tmp_path / "side"
    attach(coll.uri, bank, SPEC, out=side, batch=64)
    return side, hub_prone(rng, 6), request.param


@pytest.mark.parametrize("attached", ["faiss-flat", "lancedb"], indirect=True)
def test_service_serves_an_attached_collection_like_an_index(attached):
    side, queries, kind = attached
    want = AttachedCollection.open(read_uri(side), side).search_certified(queries, 5, metadata=kind == "lancedb")
    with TestClient(base_url="http://localhost", app=create_app({"mine": side})) as c:
        listed = c.get("/indexes").json()
        assert [(i["name"], i["n_items"], i["method"], i["queries"]) for i in listed] == [("mine", 200, SPEC, ["embeddings", "item"])]
        assert c.get("/indexes/mine").json()["info"]["kind"] == "attached"
        r = c.post("/search", json={"index": "mine", "embeddings": queries.tolist(), "top_k": 5})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["index"] == "mine" and body["method"] == SPEC
        for row, record in enumerate(body["results"]):
            assert record["certified"] == bool(want.certified[row]) and record["exact"] == bool(want.exact[row])
            assert [h["id"] for h in record["hits"]] == want.ids[row].tolist()
            np.testing.assert_allclose([h["score"] for h in record["hits"]], want.scores[row], rtol=1e-6)
            if kind == "lancedb":  # the store's columns as metadata
                assert [h["metadata"] for h in record["hits"]] == [want.metadata[i] for i in want.ids[row].tolist()]
            else:  # a FAISS file keeps none
                assert all("metadata" not in h for h in record["hits"])
        b = c.post("/search/binary?index=mine&top_k=5", content=queries.astype("<f4").tobytes(),
                   headers={"content-type": "application/octet-stream"})  # fmt: skip
        assert [[h["id"] for h in rec["hits"]] for rec in b.json()["results"]] == want.ids.tolist()
        # compare: the store's own plain ranking; an item query reads the item's vector from the store
        r = c.post("/search", json={"index": "mine", "embeddings": queries[:2].tolist(), "top_k": 5, "compare": True, "weight": 0.0})
        plain = AttachedCollection.open(read_uri(side), side).source.search(queries[:2], 5)[1]
        assert [[h["id"] for h in rec["uncorrected"]] for rec in r.json()["results"]] == plain.tolist()
        assert [[h["id"] for h in rec["hits"]] for rec in r.json()["results"]] == plain.tolist()  # weight 0: plain
        item = int(want.ids[0, 0])
        assert c.post("/search", json={"index": "mine", "item": item, "top_k": 1}).json()["results"][0]["hits"][0]["id"] == item
        # refused, clearly: writes (409), filters and versions (422)
        w = c.post("/items/mine", json={"embeddings": queries[:1].tolist()})
        assert w.status_code == 409 and "attach --update" in w.json()["detail"]
        assert c.delete(f"/items/mine/{item}").status_code == 409
        f = c.post("/search", json={"index": "mine", "embeddings": queries[:1].tolist(), "where": {"caption": "item 5"}})
        assert f.status_code == 422 and "attached" in f.json()["detail"]
        assert c.post("/search", json={"index": "mine", "embeddings": queries[:1].tolist(), "version": 1}).status_code == 422


def read_uri(side):
    from hubless.attached import read_sidecar

    return read_sidecar(side).info["source"]["uri"]


@pytest.mark.parametrize("attached", ["faiss-flat"], indirect=True)
def test_searcher_and_evaluate_on_an_attached_collection(attached, tmp_path):
    side, queries, _ = attached
    searcher = Searcher({"mine": side})
    index = searcher.index("mine")
    assert isinstance(index, AttachedIndex) and index.ntotal == 200 and index.weight == 0.75
    result = searcher.search("mine", embeddings=queries, top_k=5)
    coll = index.collection
    want = coll.search_certified(queries, 5)
    np.testing.assert_array_equal(result.ids, want.ids)
    np.testing.assert_array_equal(result.certified, want.certified)
    with pytest.raises(InvalidInput, match="no versions"):
        searcher.search("mine", embeddings=queries, version=1)
    with pytest.raises(Conflict, match="read only"):
        index.add(queries)
    # evaluate: recall@k of the attached search against exact corrected search, and the certified share
    report = coll.evaluate(queries, 5)
    exact = coll.exact_search(queries, 5)
    assert report["recall"] == recall_at_k(want, exact) == 1.0  # an exact store: certified answers are the exact ones
    assert report["certified"] == want.certified.mean() and report["queries"] == 6 and report["top_k"] == 5
    assert report["exact"] == want.exact.mean() == 1.0 and report["wrong_exact"] == 0
    narrow = coll.evaluate(queries, 5, candidates=5, max_candidates=5, weight=0.3)
    assert 0.0 <= narrow["recall"] <= 1.0 and narrow["candidates"] == 5.0


def test_recall_at_k_counts_the_exact_ids_found():
    from hubless import Hits

    found = Hits.padded(np.zeros((2, 3)), [[1, 2, 3], [4, 5, -1]])
    exact = Hits.padded(np.zeros((2, 3)), [[3, 2, 9], [5, -1, -1]])
    assert recall_at_k(found, exact) == pytest.approx((2 / 3 + 1.0) / 2)


def test_a_served_sidecar_reopens_its_collection_with_the_options_it_was_attached_with(tmp_path):
    import lancedb
    import pyarrow as pa

    rng = np.random.default_rng(5)
    x, bank, queries = hub_prone(rng, 120), hub_prone(rng, 150), hub_prone(rng, 3)
    ids = np.arange(120, dtype=np.int64) * 3 + 1
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), x.shape[1])
    lancedb.connect(str(tmp_path / "ldb")).create_table("docs", pa.table({"key": pa.array(ids), "emb": emb, "tag": [f"t{i}" for i in ids]}))
    uri = f"lancedb://{tmp_path / 'ldb'}/docs"
    attached = attach(uri, bank, SPEC, out=tmp_path / "side", id_field="key", vector_field="emb")
    assert attached.sidecar.info["source"]["options"] == {"id_field": "key", "vector_field": "emb"}
    result = Searcher({"mine": tmp_path / "side"}).search("mine", embeddings=queries, top_k=4)
    want = attached.search_certified(queries, 4, metadata=True)
    np.testing.assert_array_equal(result.ids, want.ids)
    assert [result.metadata[int(i)]["tag"] for i in want.ids[0]] == [f"t{i}" for i in want.ids[0]]


@pytest.mark.parametrize("attached", ["faiss-flat"], indirect=True)
def test_the_hubness_panel_counts_attached_searches_and_says_it_has_no_bank(attached):
    side, queries, _ = attached
    want = AttachedCollection.from_sidecar(side).search(queries, 3)[1]
    with TestClient(base_url="http://localhost", app=create_app({"mine": side})) as c:
        assert c.get("/hubness/mine").json()["served"]["queries"] == 0
        assert c.post("/search", json={"index": "mine", "embeddings": queries.tolist(), "top_k": 3}).status_code == 200
        c.post(
            "/search/binary?index=mine&top_k=3",
            content=queries[:2].astype("<f4").tobytes(),
            headers={"content-type": "application/octet-stream"},
        )
        body = c.get("/hubness/mine").json()
    assert body["n_bank_queries"] == 0 and "attached collection" in body["note"] and "saved without" not in body["note"]
    served = body["served"]
    assert served["queries"] == len(queries) + 2
    first = np.concatenate([want[:, 0], want[:2, 0]])  # N_1 of what was served: the attached answers' top hits
    top_id, top_count = np.unique(first, return_counts=True)
    assert served["n1_max"] == top_count.max() and served["hubs"][0]["n1"] == top_count.max()
    assert served["hubs"][0]["id"] in top_id[top_count == top_count.max()].tolist()
