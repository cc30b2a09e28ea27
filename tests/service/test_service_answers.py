"""Every answer of the HTTP API has a model (issue 40 item 5): the OpenAPI schema (and so
``/docs``) shows a schema for each route's answer, and each answer has exactly its model's
fields, nested ones too (the models keep unknown fields rather than drop them, so this test is
what catches an answer and its model drifting apart)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")

from pydantic import BaseModel  # noqa: E402
from starlette.testclient import TestClient  # noqa: E402

import hubless  # noqa: E402
from hubless.service import Keys, Settings, create_app  # noqa: E402
from hubless.service import answers as A  # noqa: E402
from hubless.service.settings import BankLearning  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402

KEY = "k" * 32
AUTH = {"Authorization": f"Bearer {KEY}"}


def _exactly(model: type[BaseModel], value) -> None:
    """``value`` validates as ``model`` with no field beyond the model's, at any depth."""

    def walk(obj, where):
        if isinstance(obj, BaseModel):
            assert not obj.model_extra, f"{where}: fields without a model: {sorted(obj.model_extra or {})}"
            for name in type(obj).model_fields:
                walk(getattr(obj, name), f"{where}.{name}")
        elif isinstance(obj, list):
            for i, item in enumerate(obj):
                walk(item, f"{where}[{i}]")

    walk(model.model_validate(value), model.__name__)


@pytest.fixture()
def client(tmp_path):
    rng = np.random.default_rng(3)
    meta = [{"caption": f"c{i}", "n": i} for i in range(50)]
    hubless.Index.build(unit_rows(rng, 50, 8), unit_rows(rng, 90, 8), "nnn:k=4", "Flat", metadata=meta).save(tmp_path / "idx")
    learning = BankLearning(learn_bank=("idx",), learn_bank_holdout=0.2)  # /hubness answers with the learned bank too
    app = create_app({"idx": tmp_path / "idx"}, settings=Settings(keys=Keys(write=KEY), learning=learning))
    with TestClient(app, base_url="http://localhost") as c:
        yield c


def test_every_answer_has_exactly_its_models_fields(client):
    calls = [
        ("GET", "/health", None, A.Health),
        ("GET", "/indexes/idx", None, A.IndexDescription),
        ("GET", "/hubness/idx", None, A.HubnessAnswer),
        ("GET", "/items/idx/3", None, A.Item),
        ("POST", "/search", {"item": 2, "top_k": 3}, A.SearchAnswer),
        ("POST", "/search", {"embeddings": [[0.3] * 8, [0.1] * 8], "top_k": 4, "compare": True}, A.SearchAnswer),
        ("POST", "/items/idx", {"embeddings": [[0.2] * 8], "metadata": [{"caption": "x", "n": 7}]}, A.ItemsAdded),
        ("DELETE", "/items/idx/5", None, A.ItemRemoved),
        ("POST", "/bank/idx", {"embeddings": [[0.4] * 8]}, A.BankAdded),
        ("GET", "/hubness/idx", None, A.HubnessAnswer),  # with served figures now
        ("POST", "/bank/idx/refit", None, A.BankLearned),  # too few queries learned: no decision
        ("POST", "/search", {"embeddings": unit_rows(np.random.default_rng(1), 250, 8).tolist(), "top_k": 2}, A.SearchAnswer),
        ("POST", "/search", {"embeddings": unit_rows(np.random.default_rng(2), 250, 8).tolist(), "top_k": 2}, A.SearchAnswer),
        ("POST", "/bank/idx/refit", None, A.BankLearned),  # a decision
        ("GET", "/hubness/idx", None, A.HubnessAnswer),  # with the learned bank's history
        ("POST", "/bank/idx/reset", None, A.BankLearned),
    ]
    for method, path, body, model in calls:
        r = client.request(method, path, json=body, headers=AUTH)
        assert r.status_code == 200, (path, r.text)
        _exactly(model, r.json())
    assert client.get("/hubness/idx", headers=AUTH).json()["learning"]["history"][0]["decision"] in ("accepted", "rejected")
    listing = client.get("/indexes", headers=AUTH).json()
    assert len(listing) == 1
    _exactly(A.IndexListing, listing[0])
    binary = client.post("/search/binary?top_k=2", content=np.ones((2, 8), "<f4").tobytes(),
                         headers={**AUTH, "content-type": "application/octet-stream"})  # fmt: skip
    _exactly(A.SearchAnswer, binary.json())
    # the optional fields stay out unless they apply (compare adds them; a plain search has none)
    hit = client.post("/search", json={"item": 2, "top_k": 1}, headers=AUTH).json()["results"][0]
    assert set(hit) == {"query", "hits"} and set(hit["hits"][0]) == {"id", "score", "metadata"}
    _exactly(A.HubnessAnswer, {"index": "x", "n_bank_queries": 0, "note": "no bank",
                               "served": {"queries": 0, "n1_skewness": None, "top1pct_share": None, "n1_max": 0, "hubs": []}})  # fmt: skip


def test_the_schema_shows_every_answer(client):
    schema = client.get("/openapi.json", headers=AUTH).json()
    models = schema["components"]["schemas"]
    routes = 0
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path == "/metrics" or path.endswith("/image"):  # Prometheus text, an image file
                continue
            answer = operation["responses"]["200"]["content"]["application/json"]["schema"]
            ref = answer.get("$ref") or answer.get("items", {}).get("$ref")
            assert ref, f"{method.upper()} {path} answers without a schema: {answer}"
            assert ref.rsplit("/", 1)[1] in models
            routes += 1
    assert routes >= 10
    assert "uncorrected_rank" in models["Hit"]["properties"] and "served" in models["HubnessAnswer"]["properties"]


def test_every_reference_of_the_schema_resolves(client):
    """Every ``$ref`` (request bodies included: ``json_body``) names a model of the components
    (ReDoc stops at the first that does not)."""
    schema = client.get("/openapi.json", headers=AUTH).json()
    models = schema["components"]["schemas"]

    def refs(obj):
        if isinstance(obj, dict):
            if isinstance(obj.get("$ref"), str):
                yield obj["$ref"]
            for value in obj.values():
                yield from refs(value)
        elif isinstance(obj, list):
            for value in obj:
                yield from refs(value)

    found = set(refs(schema["paths"]))
    assert {"#/components/schemas/DeleteRequest", "#/components/schemas/MetadataRequest"} <= found
    assert all(ref.startswith("#/components/schemas/") and ref.rsplit("/", 1)[1] in models for ref in found), found - {
        f"#/components/schemas/{m}" for m in models
    }
