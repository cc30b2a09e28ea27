"""Hostile and malformed requests, generated (hypothesis), against a real `hubless serve`
(uvicorn) subprocess on 127.0.0.1 with a bounded number of requests: whatever the body (near-valid
requests with one field wrong, any JSON, bodies that are not JSON) and whatever the path, the
service answers 2xx or a 4xx (a 503 with Retry-After for a held lock), never a 500; every error is
JSON with a ``detail`` and shows no traceback and no server path; and the index it serves stays
searchable and consistent (its count matches its items) after every write the fuzzer got through."""

from __future__ import annotations

import json
import math
from collections import Counter
from urllib.parse import quote

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("hypothesis")
pytest.importorskip("PIL")

from hypothesis import HealthCheck, Phase, example, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import hubless  # noqa: E402
from tests.conftest import unit_rows  # noqa: E402
from tests.service.test_service_security import READ, WRITE, Server, auth  # noqa: E402

#: The fuzz's examples: the same every run and in every checkout (derandomize's seed depends
#: on the test file's path).
SEED = 20261127

pytestmark = pytest.mark.slow

D = 8
KEYS = ("split", "year", "score", "tags")
#: (method, path, status) of every fuzzed answer: the last test checks the fuzz got through.
SEEN: Counter = Counter()
VALID_QUERY = [[1.0] + [0.0] * (D - 1)]
#: No shrinking: a failing request is shown as generated (shrinking it by hundreds of requests to
#: a live server took minutes).
FUZZ_PHASES = (Phase.explicit, Phase.reuse, Phase.generate)
#: Words that would betray the server's inside in an answer.
LEAKS = ("Traceback", 'File "', "site-packages", "/src/hubless", "Exception", "Error:")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    rng = np.random.default_rng(11)
    meta = [{"split": ["train", "test"][i % 2], "year": 2000 + i % 7, "score": i / 10, "tags": [f"t{i % 3}"]} for i in range(60)]
    hubless.Index.build(unit_rows(rng, 60, D), unit_rows(rng, 120, D), "nnn:alpha=0.5,k=4", "Flat", metadata=meta).save(root / "idx")
    (root / "write.key").write_text(WRITE)
    (root / "read.key").write_text(READ)
    # the bank is learned from the fuzzed searches (--learn-bank), refitting while the writes land
    server = Server(["idx", "--api-key-file", "write.key", "--read-key-file", "read.key", "--max-batch", 32,
                     "--max-body-bytes", 2**16, "--max-text-chars", 40, "--lock-timeout", 1, "--rate-limit", 0,
                     "--learn-bank", "idx", "--learn-bank-every", 40, "--learn-bank-holdout", 0.3, "--learn-bank-quota", 1], cwd=root)  # fmt: skip
    yield root, server
    server.stop()


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)  # NaN / Infinity: not JSON, sent as Python's json writes them
    | st.text(max_size=12)
    | st.sampled_from(["idx", "../idx", "/etc/passwd", "split", "$or", "$not", "gte", "in", "\x00", "9" * 30])
)
anything = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=16
)
numbers = st.floats(allow_nan=True, allow_infinity=True, width=32) | st.integers(-5, 5) | st.sampled_from([1e39, -1e39, 1e-45])
embeddings = st.lists(st.lists(numbers, min_size=0, max_size=D + 2), max_size=4) | anything
conditions = st.dictionaries(
    st.sampled_from(["eq", "ne", "in", "not_in", "gt", "gte", "lt", "lte", "like", ""]), anything | scalars, max_size=2
)
filters = (
    st.recursive(
        st.dictionaries(st.sampled_from([*KEYS, "nope", "id", ""]), scalars | conditions | st.lists(scalars, max_size=3), max_size=2),
        lambda inner: st.dictionaries(
            st.sampled_from(["$and", "$or", "$not", "$xor"]), inner | st.lists(inner, max_size=3), min_size=1, max_size=2
        ),
        max_leaves=6,
    )
    | anything
)
ids = st.lists(st.integers(min_value=-3, max_value=2**64) | anything, max_size=4) | anything
records = st.lists(st.dictionaries(st.sampled_from([*KEYS, "new", "id"]), anything, max_size=3) | anything, max_size=4) | anything


# valid parts, so that the fuzz also reaches the code behind the checks (writes that land)
finite = st.floats(0.0625, 2, width=32) | st.floats(-2, -0.0625, width=32)  # no all-zero row (refused: cannot be normalised)
rows = st.integers(1, 3).flatmap(lambda n: st.lists(st.lists(finite, min_size=D, max_size=D), min_size=n, max_size=n))
record = st.fixed_dictionaries(
    {},
    optional={"split": st.sampled_from(["train", "test", "new"]), "year": st.integers(1990, 2030), "score": st.floats(-10, 10),
              "tags": st.lists(st.sampled_from(["t0", "t1", "x"]), max_size=2)},
)  # fmt: skip
condition = st.one_of(
    st.builds(lambda v: {"split": v}, st.sampled_from(["train", "test", "new"]) | st.builds(lambda v: {"in": v}, st.lists(st.sampled_from(["train", "new"]), min_size=1, max_size=2))),
    st.builds(lambda op, v: {"year": {op: v}}, st.sampled_from(["gte", "lt", "ne", "eq"]), st.integers(1990, 2030)),
    st.builds(lambda v: {"score": {"gt": v}}, st.floats(-10, 10)),
)  # fmt: skip
valid_filter = st.recursive(
    condition,
    lambda inner: (
        st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$or": fs})
        | st.lists(inner, min_size=1, max_size=3).map(lambda fs: {"$and": fs})
        | inner.map(lambda f: {"$not": f})
    ),
    max_leaves=4,
)
valid_ids = st.lists(st.integers(0, 90), min_size=1, max_size=4, unique=True)


def mutated(valid: st.SearchStrategy, fields: dict) -> st.SearchStrategy:
    """Valid bodies, as they are or with one field replaced by a fuzzed value or one unknown
    field added."""
    one = st.sampled_from(sorted(fields)).flatmap(lambda k: fields[k].map(lambda v, k=k: {k: v}))
    extra = st.dictionaries(st.text(max_size=6), anything, min_size=1, max_size=1)
    return st.one_of(valid, st.tuples(valid, one | extra).map(lambda ve: {**ve[0], **ve[1]}))


SEARCH = mutated(
    st.tuples(
        st.fixed_dictionaries({"embeddings": rows}) | st.fixed_dictionaries({"item": st.integers(0, 90)}),
        st.fixed_dictionaries({}, optional={"top_k": st.integers(1, 80), "where": valid_filter, "weight": st.floats(0, 2), "compare": st.booleans()}),
    ).map(lambda parts: {**parts[0], **parts[1]}),
    {"index": anything, "embeddings": embeddings, "embeddings_b64": anything, "texts": anything, "images": anything,
     "item": anything, "top_k": anything, "weight": anything, "compare": anything, "where": filters, "rerank": anything,
     "version": anything},
)  # fmt: skip
ITEMS = mutated(
    rows.flatmap(lambda e: st.fixed_dictionaries({"embeddings": st.just(e), "metadata": st.lists(record, min_size=len(e), max_size=len(e))})),
    {"embeddings": embeddings, "metadata": records, "ids": ids, "upsert": anything},
)  # fmt: skip
BANK = mutated(st.fixed_dictionaries({"embeddings": rows}), {"embeddings": embeddings, "metadata": records, "ids": ids})
DELETE = mutated(
    st.one_of(st.fixed_dictionaries({"ids": valid_ids}), st.fixed_dictionaries({"where": valid_filter})), {"ids": ids, "where": filters}
)
METADATA = mutated(
    st.one_of(st.fixed_dictionaries({"ids": valid_ids, "set": record}), st.fixed_dictionaries({"where": valid_filter, "unset": st.just(["score"])})),
    {"ids": ids, "where": filters, "set": records | anything, "unset": anything},
)  # fmt: skip

ROUTES = st.one_of(
    st.tuples(st.just("POST"), st.just("/search"), SEARCH, st.just(READ)),
    st.tuples(st.just("POST"), st.just("/items/idx"), ITEMS, st.just(WRITE)),
    st.tuples(st.just("POST"), st.just("/bank/idx"), BANK, st.just(WRITE)),
    st.tuples(st.just("POST"), st.just("/items/idx/delete"), DELETE, st.just(WRITE)),
    st.tuples(st.just("POST"), st.just("/items/idx/metadata"), METADATA, st.just(WRITE)),
    st.tuples(st.just("POST"), st.sampled_from(["/search", "/items/idx", "/items/idx/delete"]), anything, st.sampled_from([READ, WRITE])),
    st.tuples(
        st.just("POST"),
        st.sampled_from(["/bank/idx/refit", "/bank/idx/reset", "/bank/nope/refit"]),
        anything,
        st.sampled_from([READ, WRITE]),
    ),
)
PATH_PARTS = st.text(max_size=12).map(lambda s: quote(s, safe="")) | st.sampled_from(
    ["..", "%2e%2e", "%00", "-1", "9" * 25, "1e3", "idx", "nope", "%2Fetc%2Fpasswd"]
)
GETS = st.tuples(
    st.sampled_from(["/items/idx/", "/items/", "/hubness/", "/versions/", "/indexes/", "/static/", "/versions/idx/"]), PATH_PARTS
)


def check_answer(root, status: int, headers, body: bytes) -> None:
    assert status != 429, "rate limited: the request was not looked at"
    assert status < 500 or (status == 503 and headers.get("retry-after")), (status, body[:300])
    text = body.decode("utf-8", "replace")
    assert str(root) not in text and not any(word in text for word in LEAKS), text[:300]
    if status >= 400 and headers.get("content-type", "").startswith("application/json"):
        assert "detail" in json.loads(text)


def send(server, method: str, path: str, body, key: str):
    data = json.dumps(body).encode()  # NaN and Infinity written as Python writes them: not JSON
    answer = server.request(method, path, data, headers={**auth(key), "content-type": "application/json"}, timeout=20)
    SEEN[method, path, answer[0]] += 1
    return answer


@seed(SEED)
@settings(max_examples=250, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=FUZZ_PHASES)
@given(request=ROUTES)
@example(request=("POST", "/items/idx", {"embeddings": VALID_QUERY, "metadata": [{"split": "new"}], "ids": [900]}, WRITE))
@example(request=("POST", "/items/idx/metadata", {"ids": [900], "set": {"year": 2001}}, WRITE))
@example(request=("POST", "/items/idx/delete", {"ids": [900]}, WRITE))
@example(request=("POST", "/bank/idx", {"embeddings": VALID_QUERY}, WRITE))
@example(request=("POST", "/search", {"embeddings": VALID_QUERY, "where": {"$not": {"split": "test"}}}, READ))
@example(request=("POST", "/bank/idx/refit", None, WRITE))
def test_no_request_body_gets_a_500_a_traceback_or_a_path(world, request):
    root, server = world
    method, path, body, key = request
    check_answer(root, *send(server, method, path, body, key))


@seed(SEED)
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=FUZZ_PHASES)
@given(get=GETS, raw=st.binary(max_size=64) | st.text(max_size=40).map(str.encode))
def test_no_path_or_raw_body_gets_a_500(world, get, raw):
    root, server = world
    prefix, part = get
    check_answer(root, *server.request("GET", prefix + part, headers=auth(READ), timeout=20))
    check_answer(root, *server.request("POST", "/search", raw, headers={**auth(READ), "content-type": "application/json"}, timeout=20))


def float32_bytes(rows) -> bytes:
    with np.errstate(over="ignore"):  # 1e39 becomes inf in float32, on purpose
        return np.asarray(rows, np.float64).astype(np.float32).tobytes()


float32_bodies = st.one_of(
    st.lists(st.lists(numbers, min_size=D, max_size=D), max_size=3).map(float32_bytes),
    st.binary(max_size=4 * D * 3 + 3),  # any bytes, lengths that are no whole row too
)  # fmt: skip
query_params = st.dictionaries(
    st.sampled_from(["index", "top_k", "weight", "compare", "where", "dim"]),
    st.sampled_from(["idx", "nope", "0", "-1", "1e400", "nan", "inf", "true", "maybe", "9" * 25, ""]) | st.text(max_size=6),
    max_size=3,
)


@seed(SEED)
@settings(max_examples=120, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=FUZZ_PHASES)
@given(
    body=st.one_of(rows.map(float32_bytes), rows.map(float32_bytes), float32_bodies),  # valid rows two times in three
    params=st.one_of(st.just({}), st.fixed_dictionaries({"top_k": st.sampled_from(["1", "5"])}), query_params),
    content_type=st.sampled_from(["application/octet-stream", "application/octet-stream", "application/json", "text/plain"]),
)
def test_no_binary_query_gets_a_500(world, body, params, content_type):
    root, server = world
    path = "/search/binary" + ("?" + "&".join(f"{quote(k)}={quote(v)}" for k, v in params.items()) if params else "")
    answer = server.request("POST", path, body, headers={**auth(READ), "content-type": content_type}, timeout=20)
    SEEN["POST", "/search/binary", answer[0]] += 1
    check_answer(root, *answer)


def test_the_index_is_consistent_after_the_fuzzing(world):
    """Runs after the fuzzers (same module): every write that got through left an index whose
    listed count is what a search over everything and a filter over everything find."""
    root, server = world
    if not SEEN:
        pytest.skip("checks what the fuzz tests of this module did: run with them")
    statuses = {status for (_, _, status) in SEEN}
    assert {200, 403, 404, 422} <= statuses, SEEN  # valid requests, a read key's writes, unknown ids, refused values
    # the fuzz got through to the work behind the checks: every route answered (the explicit
    # examples make sure of one each), and the generated writes landed many times over
    assert all(
        SEEN["POST", path, 200]
        for path in ("/search", "/search/binary", "/items/idx", "/bank/idx", "/items/idx/delete", "/items/idx/metadata", "/bank/idx/refit")
    ), SEEN
    assert sum(SEEN["POST", path, 200] for path in ("/items/idx", "/bank/idx", "/items/idx/delete", "/items/idx/metadata")) >= 30, SEEN
    assert SEEN["POST", "/search", 200] + SEEN["POST", "/search/binary", 200] >= 30, SEEN
    status, _, body = server.request("GET", "/indexes/idx", headers=auth(READ))
    assert status == 200
    n = json.loads(body)["n_items"]
    status, _, body = send(server, "POST", "/search", {"embeddings": VALID_QUERY, "top_k": max(n, 1)}, READ)
    assert status == 200
    hits = json.loads(body)["results"][0]["hits"]
    assert len(hits) == n and len({h["id"] for h in hits}) == n
    assert all(math.isfinite(h["score"]) for h in hits)
