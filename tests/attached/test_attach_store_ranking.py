"""The store ranks by the corrected score in one request (issue 52 item 6,
:mod:`hubless.attached.store_ranking`), on the real engines: Qdrant's formula query (the
in-process engine and qdrant-client's local engine standing in for a server) and pgvector's SQL.

The store's corrected top-k is the brute-force top-k by ``s - w * bias`` among the brute-force
plain top-k', and the k'-th plain score it reports is the brute-force one; a search ranked in the
store answers as the ordinary search does, its certified answers exact, with one request for the
queries it certifies at once; stores and methods that cannot are refused, naming why.
"""

from __future__ import annotations

import numpy as np
import pytest

from hubless.attached import attach
from hubless.attached.store_ranking import ranked_in_store, store_formula
from hubless.errors import InvalidInput
from tests.attached.test_attach import Collection, brute_force_nnn, exact_top, hub_prone
from tests.attached.test_attach_bands import pg_dsn  # noqa: F401 - the fixture

pytestmark = [
    pytest.mark.filterwarnings("ignore:Local mode performs exact"),
    pytest.mark.filterwarnings("ignore:Payload indexes have no effect"),
]

STORES = ["qdrant-edge", pytest.param("qdrant", marks=pytest.mark.slow), pytest.param("postgresql", marks=pytest.mark.slow)]


@pytest.fixture
def collection(request, tmp_path):
    made = Collection(request.param, tmp_path)
    if request.param == "qdrant":
        made.client = request.getfixturevalue("qdrant_server")
    if request.param == "postgresql":
        made.pg_dsn = request.getfixturevalue("pg_dsn")
    return made


def unit(x):
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.mark.parametrize("collection", STORES, indirect=True)
def test_the_store_ranks_by_the_corrected_score_and_hubless_certifies_it(collection, tmp_path):
    rng = np.random.default_rng(6)
    n, k, kp = 300, 5, 40
    x, bank, queries = hub_prone(rng, n), hub_prone(rng, 200), hub_prone(rng, 25)
    ids = rng.permutation(n).astype(np.int64) * 3 + 5
    collection.create(x, ids)
    attached = attach(collection.uri, bank, "nnn:alpha=0.75,k=8", out=tmp_path / "side", write_payload=True, **collection.options)
    formula = store_formula(attached)
    assert formula.fields == ("hubless_bias",) and formula.weights == (0.75,)
    # the store's own corrected top-k among its plain top-k', against brute force
    sims = unit(queries) @ x.T
    side = attached.sidecar
    bias = side.bias[np.searchsorted(side.ids, ids), 0]
    hits, last = attached.source.search_corrected(unit(queries), k, kp, np.full((len(queries), 1), 0.75), formula.fields)
    for i in range(len(queries)):
        top = np.lexsort((ids, -sims[i]))[:kp]
        np.testing.assert_allclose(last[i], sims[i, top[-1]], atol=2e-6)  # the k'-th plain score: the certificate's s_k'
        corrected = sims[i, top] - 0.75 * bias[top]
        want = top[np.lexsort((ids[top], -corrected))[:k]]
        np.testing.assert_array_equal(np.sort(hits.ids[i]), np.sort(ids[want]))
        np.testing.assert_allclose(np.sort(hits.scores[i]), np.sort(sims[i, want]), atol=2e-6)  # the hits' plain scores
    # a search ranked in the store: one request for what it certifies, the same answers, certified ones exact
    plain_searches = []
    search = attached.source.search
    attached.source.search = lambda *a, **kw: plain_searches.append(len(a[0])) or search(*a, **kw)
    ranked = attached.search_certified(queries, k, in_store=True)
    attached.source.search = search
    ordinary = attached.search_certified(queries, k)
    want_ids, _ = exact_top(brute_force_nnn(x, unit(bank), unit(queries), 0.75, 8), ids, k)
    np.testing.assert_array_equal(ranked.ids, ordinary.ids)
    np.testing.assert_allclose(ranked.scores, ordinary.scores, atol=2e-6)
    assert (ranked.ids[ranked.certified] == want_ids[ranked.certified]).all() and ranked.certified.mean() >= 0.8
    assert sum(plain_searches) < len(queries) // 2  # the store's one request certified most: a plain search for the rest only
    # what a client querying the store gets, and what the certificate says of it (no reserve: the collection's smallest bias)
    for depth in (10, kp):
        alone = ranked_in_store(attached, queries, k, candidates=depth)
        assert (alone.ids[alone.certified] == want_ids[alone.certified]).all()
        if depth == kp:
            assert alone.certified.mean() >= 0.5


def test_stores_and_methods_that_cannot_rank_are_refused(tmp_path):
    rng = np.random.default_rng(8)
    x, bank, q = hub_prone(rng, 60), hub_prone(rng, 80), hub_prone(rng, 3)
    ids = np.arange(60, dtype=np.int64)
    lance = Collection("lancedb", tmp_path / "l")
    lance.create(x, ids)
    attached = attach(lance.uri, bank, "nnn:alpha=0.75,k=8", out=tmp_path / "s1", write_payload=True)
    with pytest.raises(InvalidInput, match="cannot rank by an expression"):
        attached.search_certified(q, 5, in_store=True)
    shard = Collection("qdrant-edge", tmp_path / "q")
    shard.create(x, ids)
    plain = attach(shard.uri, bank, "nnn:alpha=0.75,k=8", out=tmp_path / "s2", **shard.options)
    with pytest.raises(InvalidInput, match="--write-payload"):
        plain.search_certified(q, 5, in_store=True)
    gated = attach(shard.uri, bank, "dis:beta=15.0,k_activation=2", out=tmp_path / "s3", write_payload="dis_bias", **shard.options)
    with pytest.raises(InvalidInput, match="raw neighbours"):
        gated.search_certified(q, 5, in_store=True)
    with pytest.raises(InvalidInput, match="raw neighbours"):
        store_formula(gated)


def test_the_command_line_searches_ranked_in_the_store(tmp_path):
    import json

    from typer.testing import CliRunner

    from hubless.cli.main import app

    rng = np.random.default_rng(9)
    x, bank, q = hub_prone(rng, 120), hub_prone(rng, 100), hub_prone(rng, 4)
    ids = np.arange(120, dtype=np.int64) * 2 + 1
    made = Collection("qdrant-edge", tmp_path)
    made.create(x, ids)
    attach(made.uri, bank, "nnn:alpha=0.75,k=8", out=tmp_path / "side", write_payload=True, **made.options)
    made.shard.close()  # the engine lets one holder open a shard: the command opens it
    np.save(tmp_path / "q.npy", q)
    args = ["attach", made.uri, "--out", str(tmp_path / "side"), "--search", str(tmp_path / "q.npy"), "--top-k", "3"]
    ranked = CliRunner().invoke(app, [*args, "--in-store"])
    assert ranked.exit_code == 0, ranked.output
    plain = CliRunner().invoke(app, args)
    lines = [[json.loads(line)["ids"] for line in out.stdout.splitlines() if line.startswith("{")] for out in (ranked, plain)]
    want = exact_top(brute_force_nnn(x, unit(bank), unit(q), 0.75, 8), ids, 3)[0]
    assert lines[0] == lines[1] == want.tolist()
