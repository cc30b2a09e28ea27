"""Writes over HTTP (behind the API key): add items, remove one, add bank queries; persisted
atomically under the index's write lock; concurrent searches keep being served consistently,
and after the writes the saved index equals one rebuilt from scratch."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("fastapi")

from starlette.testclient import TestClient  # noqa: E402

import hubless  # noqa: E402
from hubless.service import create_app  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402

KEY = {"Authorization": "Bearer secret-key-of-20-chars"}


@pytest.fixture()
def setup(tmp_path):
    rng = np.random.default_rng(12)
    gallery, bank, queries, new = unit_rows(rng, 300, 16), unit_rows(rng, 500, 16), unit_rows(rng, 30, 16), unit_rows(rng, 40, 16)
    meta = [{"n": i} for i in range(300)]
    hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=8", "Flat", metadata=meta).save(tmp_path / "idx")
    app = create_app({"idx": tmp_path / "idx"}, api_key="secret-key-of-20-chars")
    return tmp_path / "idx", app, gallery, bank, queries, new, rng


def test_writes_need_the_key_and_persist(setup):
    path, app, gallery, bank, queries, new, rng = setup
    with TestClient(base_url="http://localhost", app=app) as c:
        assert c.post("/items/idx", json={"embeddings": new[:2].tolist()}).status_code == 401
        added = c.post("/items/idx", json={"embeddings": new[:5].tolist(), "metadata": [{"n": 1000 + i} for i in range(5)]}, headers=KEY)
        assert added.status_code == 200 and added.json()["added"] == [300, 301, 302, 303, 304] and added.json()["n_items"] == 305
        assert c.delete("/items/idx/0", headers=KEY).json()["n_items"] == 304
        more = unit_rows(rng, 50, 16)
        assert c.post("/bank/idx", json={"embeddings": more.tolist()}, headers=KEY).json()["bank_queries_added"] == 50
        assert c.post("/items/idx", json={"embeddings": [[0.1] * 3]}, headers=KEY).status_code == 422
        assert c.post("/items/idx", json={"embeddings": new[:2].tolist(), "metadata": [{}]}, headers=KEY).status_code == 422
        served = c.post("/search", json={"embeddings": queries.tolist(), "top_k": 10}, headers=KEY).json()
    saved = hubless.Index.load(path)
    assert saved.ntotal == 304 and saved.metadata[-1] == {"n": 1004} and saved.metadata[0] == {"n": 1}
    rebuilt = hubless.Index.build(np.concatenate([gallery[1:], new[:5]]), np.concatenate([bank, more]), "nnn:alpha=0.75,k=8", "Flat")
    _, ids = rebuilt.search(queries, 10)
    assert [[h["id"] for h in r["hits"]] for r in served["results"]] == ids.tolist()


def test_writes_are_disabled_without_a_key(tmp_path):
    rng = np.random.default_rng(1)
    hubless.Index.build(unit_rows(rng, 50, 8), unit_rows(rng, 80, 8), "nnn:k=4", "Flat").save(tmp_path / "idx")
    with TestClient(base_url="http://localhost", app=create_app({"idx": tmp_path / "idx"})) as c:
        response = c.delete("/items/idx/3")
        assert response.status_code == 403 and "--api-key-file" in response.json()["detail"]


@pytest.mark.slow
def test_searches_during_writes_are_consistent(setup):
    """Searches never fail and always see a whole version (ids within that version and scores
    in order) while items are added and removed; the end state equals a rebuild."""
    path, app, gallery, bank, queries, new, _ = setup
    errors, seen = [], []
    stop = threading.Event()
    with TestClient(base_url="http://localhost", app=app) as c:

        def searcher():
            while not stop.is_set():
                r = c.post("/search", json={"embeddings": queries[:4].tolist(), "top_k": 10}, headers=KEY)
                if r.status_code != 200:
                    errors.append(r.text)
                    continue
                for result in r.json()["results"]:
                    scores = [h["score"] for h in result["hits"]]
                    if scores != sorted(scores, reverse=True) or len(result["hits"]) != 10:
                        errors.append(result)
                seen.append(1)

        threads = [threading.Thread(target=searcher) for _ in range(3)]
        for t in threads:
            t.start()
        for i in range(8):  # bounded: 8 adds and 8 removes
            assert c.post("/items/idx", json={"embeddings": new[5 * i : 5 * i + 5].tolist()}, headers=KEY).status_code == 200
            assert c.delete("/items/idx/0", headers=KEY).status_code == 200
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors and len(seen) > 5
    saved = hubless.Index.load(path)
    final_gallery = np.concatenate([gallery[8:], new])
    rebuilt = hubless.Index.build(final_gallery, bank, "nnn:alpha=0.75,k=8", "Flat")
    np.testing.assert_array_equal(saved.search(queries, 10)[1], rebuilt.search(queries, 10)[1])
    np.testing.assert_allclose(saved.correction.bias_, rebuilt.correction.bias_, atol=1e-6)
