"""A store written by ``hubless export`` served like an index (issue 40 item 2: "the service can
search a store as it searches an index"): the Searcher opens a store URI as a StoreIndex, POST
/search answers with the index answer's shape, its ids and scores those of hubless.export.search
in process (corrected by default, compare = the store's plain search, corrected=False), the
store's payload as the hits' metadata; GET /indexes and /indexes/{name} describe it (typed, the
scheme and table only); writes are refused with 409, versions, filters, reranking and item queries
with 422 (never a 500); no answer, error or log names the store's location or credentials. Real
embedded LanceDB and Qdrant (edge) stores exported from a small index; `hubless serve NAME=URI`
as a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
import hubless.export
from hubless.errors import Conflict, HublessError, InvalidInput, NotFound
from hubless.search import Searcher, StoreIndex
from tests.conftest import unit_rows

pytest.importorskip("fastapi")
pytest.importorskip("pydantic_settings")
from starlette.testclient import TestClient  # noqa: E402

from hubless.service import create_app  # noqa: E402

SPEC = "nnn:alpha=0.75,k=8"
SCHEMES = {"lancedb": "lancedb", "qdrant": "qdrant_edge"}


@pytest.fixture
def store(request, tmp_path):
    """(uri, queries, folder the store lives in): a store of ``request.param``'s kind exported
    from a 60-item NNN index with a caption per item."""
    pytest.importorskip(SCHEMES[request.param])
    rng = np.random.default_rng(7)
    index = hubless.Index.build(unit_rows(rng, 60, 16), unit_rows(rng, 120, 16), SPEC, factory="Flat",
                                metadata=[{"caption": f"item {i}", "n": i} for i in range(60)])  # fmt: skip
    folder = tmp_path / "secret-place"
    uri = f"{request.param}://{folder}/gal"
    hubless.export.export(index, uri)
    return uri, unit_rows(rng, 4, 16), str(folder)


def _rows(hits):
    """Per query, per found hit: {"id", **its stored metadata} (what the store's search answers)."""
    return [[{"id": int(j), **hits.metadata[int(j)]} for j in ids[found]] for ids, found in zip(hits.ids, hits.found)]


def _ids_scores_meta(records, key="hits"):
    ids = [[h["id"] for h in r[key]] for r in records]
    scores = [[h["score"] for h in r[key]] for r in records]
    meta = [[{"id": h["id"], **h["metadata"]} for h in r[key]] for r in records]
    return ids, scores, meta


@pytest.mark.parametrize("store", ["lancedb", "qdrant"], indirect=True)
def test_the_service_serves_a_store_like_an_index(store):
    uri, queries, folder = store
    with TestClient(base_url="http://localhost", app=create_app({"mine": uri})) as c:
        listed = c.get("/indexes").json()
        assert [(i["name"], i["n_items"], i["method"], i["queries"], i["factory"]) for i in listed] == [
            ("mine", 60, SPEC, ["embeddings"], None)
        ]
        assert listed[0]["weight"] == {"name": "alpha", "value": 0.75} and listed[0]["metadata_columns"] == ["caption", "n"]
        described = c.get("/indexes/mine").json()
        assert described["info"]["kind"] == "store" and described["info"]["table"] == "gal"
        assert described["store"] == {"scheme": uri.partition("://")[0], "table": "gal", "metric": "dot", "bias_columns": 1,
                                      "metadata_columns": {"caption": "string", "n": "int"}, "ann": None}  # fmt: skip
        for weight in (None, 0.3):
            body = {"embeddings": queries.tolist(), "top_k": 5, "compare": True, **({} if weight is None else {"weight": weight})}
            r = c.post("/search", json=body)
            assert r.status_code == 200, r.text
            assert r.json()["index"] == "mine" and r.json()["method"] == SPEC
            options = {} if weight is None else {"weight": weight}
            want = hubless.export.search(uri, queries, 5, **options)
            want_s, want_i, want_m = want.scores, want.ids, _rows(want)
            ids, scores, meta = _ids_scores_meta(r.json()["results"])
            assert ids == want_i.tolist() and meta == want_m
            np.testing.assert_allclose(scores, want_s, rtol=1e-6)
            plain = hubless.export.search(uri, queries, 5, corrected=False)  # compare: the store's plain search
            plain_s, plain_i, plain_m = plain.scores, plain.ids, _rows(plain)
            ids, scores, meta = _ids_scores_meta(r.json()["results"], "uncorrected")
            assert ids == plain_i.tolist() and meta == plain_m
            np.testing.assert_allclose(scores, plain_s, rtol=1e-6)
        b = c.post("/search/binary?index=mine&top_k=7", content=queries.astype("<f4").tobytes(),
                   headers={"content-type": "application/octet-stream"})  # fmt: skip
        assert [[h["id"] for h in rec["hits"]] for rec in b.json()["results"]] == hubless.export.search(uri, queries, 7)[1].tolist()
        big = c.post("/search", json={"embeddings": queries[:1].tolist(), "top_k": 100})  # beyond the gallery: its 60 items
        assert len(big.json()["results"][0]["hits"]) == 60
        assert c.get("/hubness/mine").json()["served"]["queries"] == 2 * len(queries) + len(queries) + 1
        shown = [c.get(p).text for p in ("/indexes", "/indexes/mine", "/health", "/hubness/mine", "/versions/mine", "/openapi.json")]
        assert not any(folder in text for text in shown)  # the store's location is never shown


@pytest.mark.parametrize("store", ["lancedb"], indirect=True)
def test_what_a_store_cannot_do_is_refused_clearly(store):
    uri, queries, folder = store
    q = queries[:1].tolist()
    with TestClient(base_url="http://localhost", app=create_app({"mine": uri}), raise_server_exceptions=False) as c:
        writes = [
            c.post("/items/mine", json={"embeddings": q}),
            c.delete("/items/mine/3"),
            c.post("/items/mine/delete", json={"ids": [3]}),
            c.post("/items/mine/metadata", json={"ids": [3], "set": {"caption": "x"}}),
            c.post("/bank/mine", json={"embeddings": q}),
            c.post("/versions/mine/1/restore"),
        ]
        for w in writes:
            assert w.status_code == 409 and "hubless export --sync" in w.json()["detail"], w.text
        refused = {
            "where": c.post("/search", json={"embeddings": q, "where": {"caption": "item 5"}}),
            "version": c.post("/search", json={"embeddings": q, "version": 1}),
            "rerank": c.post("/search", json={"embeddings": q, "rerank": True}),
            "item": c.post("/search", json={"item": 3}),
            "lookup": c.get("/items/mine/3"),
            "texts": c.post("/search", json={"texts": ["a dog"]}),  # the store records no model
            "dim": c.post("/search", json={"embeddings": [[0.1] * 8]}),
        }
        for what, r in refused.items():
            assert r.status_code == 422, (what, r.text)
            assert folder not in r.text
        assert "store" in refused["where"].json()["detail"] and "versions" in refused["version"].json()["detail"]
        assert "records no model" in refused["texts"].json()["detail"]
        hubless.export.drop(uri)  # the store goes away under the server: a clear 404, nothing of its location
        gone = c.post("/search", json={"embeddings": q})
        assert gone.status_code == 404 and folder not in gone.text and "gal" in gone.json()["detail"]
    with pytest.raises(NotFound) as err:  # in process too (no HTTP scrubbing): the scheme and table only
        StoreIndex.open(uri)
    assert "'gal'" in str(err.value) and folder not in str(err.value)


@pytest.mark.parametrize("store", ["qdrant"], indirect=True)
def test_the_searcher_searches_a_store_as_export_search_does(store):
    uri, queries, folder = store
    searcher = Searcher({"mine": uri})
    assert Searcher(uri).names == ["gal"]  # a bare URI is named after its table
    for weight in (None, 0.0, 0.5):
        got = searcher.search(embeddings=queries, top_k=6, weight=weight, compare=True)
        want = hubless.export.search(uri, queries, 6, **({} if weight is None else {"weight": weight}))
        want_s, want_i, want_m = want.scores, want.ids, _rows(want)
        np.testing.assert_array_equal(got.ids, want_i)
        np.testing.assert_allclose(got.scores, want_s, rtol=1e-6)
        np.testing.assert_array_equal(got.uncorrected[1], hubless.export.search(uri, queries, 6, corrected=False)[1])
        assert [[{"id": j, **got.metadata[j]} for j in row] for row in got.ids.tolist()] == want_m
    assert got.records()[0]["hits"][0]["metadata"] == {"caption": f"item {got.ids[0, 0]}", "n": int(got.ids[0, 0])}
    store_index = searcher.index("mine")
    assert isinstance(store_index, StoreIndex) and folder not in repr(store_index) and folder not in str(store_index.info())
    with pytest.raises(Conflict, match="export --sync"):
        store_index.add(queries)
    with pytest.raises(InvalidInput, match="versions"):
        searcher.search(embeddings=queries, version=1)
    with pytest.raises(InvalidInput, match="rescore"):
        searcher.search(embeddings=queries, rescore=True)
    with pytest.raises(
        InvalidInput, match="unknown search option"
    ):  # an exact store has no knob: the store refuses it, naming the valid ones
        searcher.search(embeddings=queries, nprobe=4)
    with pytest.raises(InvalidInput, match="records no model"):
        searcher.model_for("mine")


@pytest.mark.parametrize("store", ["qdrant", "lancedb"], indirect=True)
def test_concurrent_searches_and_a_re_export_under_the_server(store, monkeypatch):
    """8 threads search one served store at once (each answer equals export.search); a store
    exported again under the server is what the next description and search read."""
    from concurrent.futures import ThreadPoolExecutor

    import hubless.search.store_index as store_index

    uri, queries, _ = store
    batches = [np.roll(queries, i, axis=0) for i in range(16)]
    with TestClient(base_url="http://localhost", app=create_app({"mine": uri})) as c:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda q: c.post("/search", json={"embeddings": q.tolist(), "top_k": 5, "compare": True}), batches))
        for q, r in zip(batches, answers):
            assert [[h["id"] for h in rec["hits"]] for rec in r.json()["results"]] == hubless.export.search(uri, q, 5)[1].tolist()
        rng = np.random.default_rng(9)
        hubless.export.export(
            hubless.Index.build(unit_rows(rng, 30, 16), unit_rows(rng, 50, 16), "dn:lam=0.5", "Flat"), uri, overwrite=True
        )
        monkeypatch.setattr(store_index, "REFRESH_SECONDS", 0.0)  # read the description again at once (no sleep)
        listed = c.get("/indexes").json()[0]
        assert (listed["n_items"], listed["method"], listed["metadata_columns"]) == (30, "dn:lam=0.5", [])
        r = c.post("/search", json={"embeddings": queries.tolist(), "top_k": 5}).json()
        assert [[h["id"] for h in rec["hits"]] for rec in r["results"]] == hubless.export.search(uri, queries, 5)[1].tolist()


def test_a_store_uri_with_credentials_is_never_shown():
    """A PostgreSQL store whose server does not answer: the error names the scheme and table,
    never the user, the password or the host."""
    pytest.importorskip("psycopg")
    uri = "postgresql://alice:s3cret-pw@127.0.0.1:1/db/gal"
    with pytest.raises(HublessError) as err:
        Searcher({"pg": uri})
    text = str(err.value)
    assert "PostgreSQL" in text and not any(s in text for s in ("alice", "s3cret-pw", "127.0.0.1:1/db"))


@pytest.mark.slow
def test_text_queries_on_a_store_use_the_model_it_records(tmp_path):
    pytest.importorskip("lancedb")
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    from hubless.encoders import load_encoder
    from tests.models import WORDS, save_tiny

    model = save_tiny("clip", tmp_path / "clip")
    encoder = load_encoder(model, device="cpu")
    rng = np.random.default_rng(4)
    captions = [" ".join(rng.choice(WORDS[4:], 5)) for _ in range(40)]
    bank = [" ".join(rng.choice(WORDS[4:], 5)) for _ in range(60)]
    index = hubless.Index.build(encoder.encode_texts(captions), encoder.encode_texts(bank), "dn:lam=0.5", "Flat",
                                metadata=[{"caption": c} for c in captions], model=str(model))  # fmt: skip
    uri = f"lancedb://{tmp_path}/db/clip"
    hubless.export.export(index, uri)
    texts = ["a red dog on the grass"]
    with TestClient(base_url="http://localhost", app=create_app({"mine": uri})) as c:
        listed = c.get("/indexes").json()[0]
        assert listed["queries"] == ["embeddings", "texts", "images"] and listed["model"] == "clip"
        body = c.post("/search", json={"texts": texts, "top_k": 4}).json()
    want = hubless.export.search(uri, encoder.encode_texts(texts), 4)[1]
    assert [h["id"] for h in body["results"][0]["hits"]] == want[0].tolist() and body["results"][0]["text"] == texts[0]
    with pytest.raises(InvalidInput, match="allow_model_mismatch"):  # the one model rule
        Searcher({"mine": uri}, model="openai/clip-vit-large-patch14").model_for("mine")


@pytest.mark.slow
def test_hubless_serve_serves_a_store_uri(tmp_path):
    """`hubless serve mine=lancedb:///abs/db/table`: a real uvicorn server on 127.0.0.1, bounded
    requests; its answers equal hubless.export.search, and its output never names the location."""
    pytest.importorskip("lancedb")
    import json

    from tests.service.test_service_security import Server

    rng = np.random.default_rng(2)
    index = hubless.Index.build(unit_rows(rng, 50, 8), unit_rows(rng, 100, 8), "dn:lam=0.5", factory="Flat")
    uri = f"lancedb://{tmp_path}/db/gal"
    hubless.export.export(index, uri)
    queries = unit_rows(rng, 3, 8)
    server = Server([f"mine={uri}", uri], cwd=tmp_path)  # named, and a bare URI named after its table
    try:
        status, _, raw = server.request("POST", "/search", {"index": "mine", "embeddings": queries.tolist(), "top_k": 5, "compare": True})
        assert status == 200, raw
        body = json.loads(raw)
        want_s, want_i = hubless.export.search(uri, queries, 5)[:2]
        assert [[h["id"] for h in r["hits"]] for r in body["results"]] == want_i.tolist()
        np.testing.assert_allclose([[h["score"] for h in r["hits"]] for r in body["results"]], want_s, rtol=1e-6)
        assert [[h["id"] for h in r["uncorrected"]] for r in body["results"]] == hubless.export.search(uri, queries, 5, corrected=False)[
            1
        ].tolist()
        assert all("metadata" not in h for r in body["results"] for h in r["hits"])  # no metadata columns: no metadata
        status, _, raw = server.request("GET", "/indexes")
        assert status == 200 and [i["name"] for i in json.loads(raw)] == ["mine", "gal"] and str(tmp_path) not in raw.decode()
        assert server.request("POST", "/items/mine", {"embeddings": queries[:1].tolist()})[0] in (403, 409)  # no write key: 403 first
    finally:
        server.stop()
    output = server.proc.stdout.read()
    assert "serving mine, gal" in output and str(tmp_path) not in output


def test_serve_reads_a_store_uri_whole():
    """`hubless serve`'s arguments: a store URI stays the string it is (a query string's `=` and
    credentials included), named after its table unless given as NAME=URI; paths as before."""
    from pathlib import Path

    from hubless.cli.serve import _named

    pg = "postgresql://u:p@h:5432/db/gal?sslmode=require"
    assert _named(pg) == ("gal", pg) and _named(f"pg={pg}") == ("pg", pg)
    assert _named("lancedb:///abs/db/gal") == ("gal", "lancedb:///abs/db/gal")
    assert _named("coco=idx/") == ("coco", Path("idx")) and _named("idx/") == ("idx", Path("idx"))
