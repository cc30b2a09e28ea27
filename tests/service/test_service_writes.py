"""Writes over HTTP (behind the write key), by stable item ids: add (ids given or assigned),
upsert, remove, add bank queries; each committed at once as one segment under the index's write
lock; concurrent searches keep being served consistently; many processes writing through a
real server each get the right ids; a server picks up versions written by other processes; and
after the writes the saved index equals one rebuilt from scratch over the same items and ids."""

from __future__ import annotations

import json
import subprocess
import sys
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
    meta = [{"n": i, "half": i % 2} for i in range(300)]
    hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=8", "Flat", metadata=meta).save(tmp_path / "idx")
    app = create_app({"idx": tmp_path / "idx"}, api_key="secret-key-of-20-chars")
    return tmp_path / "idx", app, gallery, bank, queries, new, rng


def test_writes_need_the_key_and_persist(setup):
    path, app, gallery, bank, queries, new, rng = setup
    with TestClient(base_url="http://localhost", app=app) as c:
        assert c.post("/items/idx", json={"embeddings": new[:2].tolist()}).status_code == 401
        added = c.post("/items/idx", json={"embeddings": new[:5].tolist(), "metadata": [{"n": 1000 + i} for i in range(5)]}, headers=KEY)
        assert added.status_code == 200 and added.json()["added"] == [300, 301, 302, 303, 304] and added.json()["n_items"] == 305
        mine = c.post("/items/idx", json={"embeddings": new[5:7].tolist(), "ids": [9001, 9000]}, headers=KEY)
        assert mine.json()["added"] == [9001, 9000]
        taken = c.post("/items/idx", json={"embeddings": new[7:9].tolist(), "ids": [42, 9002]}, headers=KEY)
        assert taken.status_code == 409 and "42" in taken.json()["detail"]  # nothing added
        assert c.post("/items/idx", json={"embeddings": new[7:8].tolist(), "ids": [42], "upsert": True}, headers=KEY).json()["added"] == [
            42
        ]
        assert c.delete("/items/idx/0", headers=KEY).json()["n_items"] == 306
        gone = c.delete("/items/idx/0", headers=KEY)
        assert gone.status_code == 404 and "no item with id 0" in gone.json()["detail"]
        assert c.get("/items/idx/0").status_code in (401, 404) and c.get("/items/idx/0", headers=KEY).status_code == 404
        assert c.get("/items/idx/301", headers=KEY).json()["metadata"] == {"n": 1001, "half": None}
        wrong = c.post("/items/idx", json={"embeddings": new[9:10].tolist(), "metadata": [{"n": "ten"}]}, headers=KEY)
        assert wrong.status_code == 422 and "'n' holds int64" in wrong.json()["detail"]
        more = unit_rows(rng, 50, 16)
        assert c.post("/bank/idx", json={"embeddings": more.tolist()}, headers=KEY).json()["bank_queries_added"] == 50
        assert c.post("/items/idx", json={"embeddings": [[0.1] * 3]}, headers=KEY).status_code == 422
        assert c.post("/items/idx", json={"embeddings": new[:2].tolist(), "metadata": [{}]}, headers=KEY).status_code == 422
        served = c.post("/search", json={"embeddings": queries.tolist(), "top_k": 10}, headers=KEY).json()
        filtered = c.post("/search", json={"embeddings": queries.tolist(), "top_k": 5, "where": {"half": 1}}, headers=KEY).json()
        bad = c.post("/search", json={"embeddings": queries.tolist(), "where": {"nope": 1}}, headers=KEY)
        assert bad.status_code == 422 and "no metadata key 'nope'" in bad.json()["detail"]
    saved = hubless.Index.load(path)
    ids = np.r_[np.arange(1, 42), np.arange(43, 300), [300, 301, 302, 303, 304, 9001, 9000, 42]]
    np.testing.assert_array_equal(saved.ids, ids)
    assert saved.records([304, 42]) == [{"n": 1004, "half": None}, {"n": None, "half": None}]
    rows = np.r_[gallery[1:42], gallery[43:300], new[:7], new[7:8]]
    rebuilt = hubless.Index.build(rows, np.concatenate([bank, more]), "nnn:alpha=0.75,k=8", "Flat", ids=ids, metadata=saved.metadata)
    assert [[h["id"] for h in r["hits"]] for r in served["results"]] == rebuilt.search(queries, 10)[1].tolist()
    want = rebuilt.search(queries, 5, where={"half": 1})[1]
    assert [[h["id"] for h in r["hits"]] for r in filtered["results"]] == [[i for i in row if i >= 0] for row in want.tolist()]
    assert all(h["metadata"]["half"] == 1 for r in filtered["results"] for h in r["hits"])


def test_writes_are_disabled_without_a_key(tmp_path):
    rng = np.random.default_rng(1)
    hubless.Index.build(unit_rows(rng, 50, 8), unit_rows(rng, 80, 8), "nnn:k=4", "Flat").save(tmp_path / "idx")
    with TestClient(base_url="http://localhost", app=create_app({"idx": tmp_path / "idx"})) as c:
        response = c.delete("/items/idx/3")
        assert response.status_code == 403 and "--api-key-file" in response.json()["detail"]


@pytest.mark.slow
def test_searches_during_writes_are_consistent(setup):
    """Searches never fail and always see a whole version (scores in order, ten hits) while
    items are added and removed; the end state equals a rebuild."""
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
            assert c.delete(f"/items/idx/{i}", headers=KEY).status_code == 200
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not errors and len(seen) > 5
    saved = hubless.Index.load(path)
    rebuilt = hubless.Index.build(np.concatenate([gallery[8:], new]), bank, "nnn:alpha=0.75,k=8", "Flat", ids=np.arange(8, 340))
    np.testing.assert_array_equal(saved.search(queries, 10)[1], rebuilt.search(queries, 10)[1])
    np.testing.assert_allclose(saved.correction.bias_, rebuilt.correction.bias_, atol=1e-6)


WRITER = """
import json, sys, urllib.request
import numpy as np
base, key, proc, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(1000 + proc)
for j in range(n):
    row = rng.standard_normal(16).astype(np.float32)
    row /= np.linalg.norm(row)
    body = json.dumps({"embeddings": [row.tolist()], "metadata": [{"proc": proc, "seq": j}]}).encode()
    req = urllib.request.Request(base + "/items/idx", data=body, headers={"content-type": "application/json", "authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=60) as r:
        print(json.dumps({"seq": j, "id": json.loads(r.read())["added"][0], "row": row.tolist()}), flush=True)
"""


@pytest.mark.slow
def test_many_processes_write_through_a_real_server(tmp_path):
    """8 processes x 25 adds and 40 concurrent deletes through a real uvicorn server: every
    returned id names the row and metadata its writer sent, no id is given twice, every deleted
    item is gone, and the saved index equals a rebuild over its items with their ids."""
    from tests.service.test_service_security import Server

    rng = np.random.default_rng(3)
    gallery, bank = unit_rows(rng, 120, 16), unit_rows(rng, 300, 16)
    hubless.Index.build(gallery, bank, "dis:k_activation=1", "Flat", metadata=[{"proc": -1, "seq": i} for i in range(120)]).save(
        tmp_path / "idx"
    )
    key = "write-key-0123456789abcdef"
    (tmp_path / "write.key").write_text(key + "\n")
    (tmp_path / "writer.py").write_text(WRITER)
    server = Server(["idx", "--api-key-file", "write.key", "--lock-timeout", "60"], cwd=tmp_path)
    auth = {"Authorization": "Bearer " + key}
    try:
        writers = [subprocess.Popen([sys.executable, str(tmp_path / "writer.py"), server.base, key, str(p), "25"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in range(8)]  # fmt: skip
        deleted, statuses = list(range(0, 120, 3)), []

        def delete(item):
            statuses.append(server.request("DELETE", f"/items/idx/{item}", headers=auth, timeout=60)[0])

        threads = [threading.Thread(target=delete, args=(i,)) for i in deleted]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        sent = {}
        for p, w in enumerate(writers):
            out, err = w.communicate(timeout=300)
            assert w.returncode == 0, err[-2000:]
            for line in out.splitlines():
                record = json.loads(line)
                sent[record["id"]] = (p, record["seq"], np.array(record["row"], np.float32))
        assert statuses == [200] * 40
        assert len(sent) == 200 and sorted(sent) == list(range(120, 320))  # 200 distinct ids
        for item_id, (p, seq, _) in list(sent.items())[::7]:  # the server answers each id with what its writer sent
            status, _, body = server.request("GET", f"/items/idx/{item_id}", headers=auth)
            assert status == 200 and json.loads(body)["metadata"] == {"proc": p, "seq": seq}
        assert all(server.request("GET", f"/items/idx/{i}", headers=auth)[0] == 404 for i in deleted[:5])
    finally:
        server.stop()
    saved = hubless.Index.load(tmp_path / "idx")
    assert saved.ntotal == 120 - 40 + 200
    for item_id, (p, seq, _) in sent.items():
        assert saved.records([item_id]) == [{"proc": p, "seq": seq}]
    np.testing.assert_allclose(saved.get(list(sent)).embeddings, np.stack([r for _, _, r in sent.values()]), atol=1e-6)
    fresh = hubless.Index.build(saved.get(saved.ids).embeddings, bank, "dis:k_activation=1", "Flat", ids=saved.ids)
    queries = unit_rows(rng, 20, 16)
    np.testing.assert_array_equal(saved.search(queries, 10)[1], fresh.search(queries, 10)[1])
    np.testing.assert_array_equal(saved.correction.activation_mask_, fresh.correction.activation_mask_)


def test_a_server_serves_versions_written_by_other_processes(setup, tmp_path):
    path, app, gallery, bank, queries, new, _ = setup
    np.save(tmp_path / "more.npy", new[:3])
    with TestClient(base_url="http://localhost", app=app) as c:
        assert c.get("/items/idx/300", headers=KEY).status_code == 404
        done = subprocess.run([sys.executable, "-m", "hubless", "index", "add", str(path), "--embeddings", str(tmp_path / "more.npy")],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0 and "ids 300, 301, 302" in done.stdout, done.stderr
        assert c.get("/items/idx/301", headers=KEY).status_code == 200  # picked up by a check of CURRENT
        served = c.post("/search", json={"embeddings": new[:3].tolist(), "top_k": 1}, headers=KEY).json()
        assert [r["hits"][0]["id"] for r in served["results"]] == [300, 301, 302]
        added = c.post("/items/idx", json={"embeddings": new[3:4].tolist()}, headers=KEY).json()
        assert added["added"] == [303] and added["n_items"] == 304  # the server's next write follows the other's
