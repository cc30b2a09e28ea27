"""Filters over HTTP (issue 51) against a real `hubless serve` (uvicorn) on 127.0.0.1, spoken to
through one persistent httpx connection: a ``where`` value outside its key's type (an integer
>= 2^63 on int64, out of int32's range in ``in`` / ``not_in``, beyond float64) is a 422 naming
it on /search, on the delete-by-filter and on the metadata-update endpoints, nothing changes, and
the keep-alive connection stays open (it was a 500 and a reset connection); ``in`` on a float32
key answers as ``eq``; a ``where`` nested as deep as the library takes (16 levels) is served, one
level more is refused; repeated ids in a removal are refused."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
pa = pytest.importorskip("pyarrow")

import hubless  # noqa: E402
from hubless.index.filters import MAX_DEPTH  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402
from tests.service.test_service_security import WRITE, Server, auth  # noqa: E402

N = 40
F32 = float(np.float32(0.1))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("filters")
    rng = np.random.default_rng(4)
    metadata = [{"year": 2000 + i % 5, "small": i % 3, "x": F32 if i % 4 == 0 else 0.5} for i in range(N)]
    schema = pa.schema([("small", pa.int32()), ("x", pa.float32())])
    index = hubless.Index.build(unit_rows(rng, N, 8), unit_rows(rng, 80, 8), "nnn:k=4", "Flat", metadata=metadata, metadata_schema=schema)
    index.save(root / "idx")
    (root / "write.key").write_text(WRITE)
    server = Server(["idx", "--api-key-file", "write.key"], cwd=root)
    client = httpx.Client(
        base_url=server.base,
        headers=auth(WRITE),
        timeout=30,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1),
        transport=httpx.HTTPTransport(retries=0),
    )
    yield client, rng
    client.close()
    server.stop()


def _connection(response) -> tuple:
    """The client side (address, port) of the TCP connection an answer came on."""
    return response.extensions["network_stream"].get_extra_info("client_addr")


def _count(client) -> int:
    return client.get("/indexes/idx").json()["n_items"]


BAD = [
    ({"year": {"eq": 2**63}}, "9223372036854775808 is outside the int64 values"),
    ({"year": {"in": [2000, 2**63]}}, "9223372036854775808 is outside the int64 values"),
    ({"small": {"in": [2**31]}}, "2147483648 is outside the int32 values"),
    ({"small": {"not_in": [-(2**31) - 1]}}, "-2147483649 is outside the int32 values"),
    ({"$or": [{"small": 1}, {"small": {"gt": 1e30}}]}, "1e+30 is outside the int32 values"),
]


@pytest.mark.parametrize(("where", "says"), BAD, ids=[str(w) for w, _ in BAD])
def test_a_value_outside_the_key_s_type_is_a_422_on_a_kept_connection(served, where, says):
    client, rng = served
    before = _count(client)
    first = client.get("/health")
    answers = [
        client.post("/search", json={"embeddings": unit_rows(rng, 2, 8).tolist(), "top_k": 3, "where": where}),
        client.post("/items/idx/delete", json={"where": where}),
        client.post("/items/idx/metadata", json={"where": where, "set": {"year": 1999}}),
    ]
    for answer in answers:
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        assert says in str(detail) and "Traceback" not in answer.text
        assert _connection(answer) == _connection(first)  # the same keep-alive connection
    after = client.get("/health")
    assert _connection(after) == _connection(first) and _count(client) == before


def test_in_on_a_float32_key_answers_as_eq(served):
    client, rng = served
    query = unit_rows(rng, 1, 8).tolist()
    for value, hits in [(0.1, 0), (F32, N // 4)]:
        found = {}
        for op, cond in (("eq", {"eq": value}), ("in", {"in": [value]})):
            answer = client.post("/search", json={"embeddings": query, "top_k": N, "where": {"x": cond}})
            assert answer.status_code == 200, answer.text
            found[op] = sorted(hit["id"] for hit in answer.json()["results"][0]["hits"])
        assert found["eq"] == found["in"] and len(found["in"]) == hits


def _nested(levels: int, leaf: dict) -> dict:
    where = leaf
    for _ in range(levels):
        where = {"$and": [where]}
    return where


def test_the_documented_nesting_depth_is_served(served):
    client, rng = served
    query = unit_rows(rng, 1, 8).tolist()
    # the deepest body a filter of MAX_DEPTH levels makes: a condition with an in list at the bottom
    answer = client.post("/search", json={"embeddings": query, "top_k": 5, "where": _nested(MAX_DEPTH, {"small": {"in": [0, 1, 2]}})})
    assert MAX_DEPTH == 16 and answer.status_code == 200, answer.text  # docs/live-index.md: 16 levels
    deeper = client.post("/search", json={"embeddings": query, "top_k": 5, "where": _nested(MAX_DEPTH + 1, {"small": 1})})
    assert deeper.status_code == 422 and f"deeper than {MAX_DEPTH} levels" in deeper.text


def test_repeated_ids_in_a_removal_are_refused(served):
    client, _ = served
    before = _count(client)
    answer = client.post("/items/idx/delete", json={"ids": [3, 3]})
    assert answer.status_code == 422 and "repeat 3" in answer.text
    assert _count(client) == before
