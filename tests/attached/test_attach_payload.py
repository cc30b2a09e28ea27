"""``write_payload`` / ``hubless attach --write-payload`` (issue 42 item 1): the bias written back
into the user's collection as a payload field (or column), through each store's own payload
update (no vector re-inserted, the item's other payload kept), on the real embedded engines;
kept in step by an update; a FAISS file refuses before anything is read."""

from __future__ import annotations

import numpy as np
import pytest

from hubless.attached import attach, read_sidecar, update
from hubless.attached.sources.base import open_source
from hubless.errors import InvalidInput
from tests.attached.test_attach import Collection, hub_prone

pytestmark = pytest.mark.filterwarnings("ignore:Local mode performs exact")

SPEC = "nnn:alpha=0.75,k=8"
STORES = ["lancedb", "qdrant", "qdrant-edge", "chroma", "milvus", pytest.param("postgresql", marks=pytest.mark.slow)]


@pytest.fixture
def collection(request, tmp_path):
    made = Collection(request.param, tmp_path)
    if request.param == "qdrant":
        made.client = request.getfixturevalue("qdrant_server")
    if request.param == "postgresql":
        made.pg_dsn = request.getfixturevalue("pg_dsn")
    return made


@pytest.fixture(scope="module")
def pg_dsn(tmp_path_factory):
    import pgserver

    server = pgserver.get_server(tmp_path_factory.mktemp("pg"), cleanup_mode="stop")
    yield server.get_uri()
    server.cleanup()


def stored(collection, ids, field="hubless_bias"):
    """(the field, the caption, the vector) of ``ids`` as the store holds them, read back."""
    source = open_source(collection.uri, **collection.options)
    records = source.payloads(ids)
    return np.array([r[field] for r in records], np.float64), [r["caption"] for r in records], source.fetch(ids)


@pytest.mark.parametrize("collection", STORES, indirect=True)
def test_the_bias_is_written_into_the_collection_and_kept_in_step(collection, tmp_path):
    rng = np.random.default_rng(5)
    x, bank, queries, new = hub_prone(rng, 120), hub_prone(rng, 150), hub_prone(rng, 5), hub_prone(rng, 7)
    ids = rng.permutation(np.arange(120) * 3 + 2).astype(np.int64)
    collection.create(x, ids)
    side = tmp_path / "side"
    attached = attach(collection.uri, bank, SPEC, out=side, batch=50, write_payload=True, **collection.options)
    sidecar = read_sidecar(side)
    assert sidecar.info["payload"]["fields"] == ["hubless_bias"] and sidecar.info["payload"]["items"] == 120
    in_process_qdrant = collection.uri.startswith("qdrant://")  # its engine re-indexes only when asked
    assert any("shard.optimize()" in note for note in sidecar.info["notes"]) == in_process_qdrant, sidecar.info["notes"]
    value, caption, vectors = stored(collection, sidecar.ids)
    np.testing.assert_allclose(value, sidecar.bias[:, 0], rtol=1e-6, atol=1e-7)  # each item's own bias, by its id
    assert caption == [f"item {i}" for i in sidecar.ids.tolist()]  # the rest of the payload is kept
    order = np.argsort(ids)
    np.testing.assert_allclose(vectors, x[order], atol=1e-6)  # the vectors are the user's, untouched
    attached.search(queries, 5)  # the collection is the one attached (its fingerprint holds)
    new_ids = np.arange(7, dtype=np.int64) + 90_000
    collection.add(new, new_ids)
    report = update(side, collection.uri, bank, **collection.options)
    assert (report["added"], report["payload_items"]) == (7, 7)
    value, _, _ = stored(collection, new_ids)
    after = read_sidecar(side)
    np.testing.assert_allclose(value, after.bias[np.searchsorted(after.ids, new_ids), 0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("collection", ["lancedb"], indirect=True)
def test_a_method_of_several_bias_columns_writes_one_field_each(collection, tmp_path):
    rng = np.random.default_rng(6)
    x, bank = hub_prone(rng, 80), hub_prone(rng, 100)
    ids = np.arange(80, dtype=np.int64) + 1
    collection.create(x, ids)
    side = tmp_path / "side"
    attach(collection.uri, bank, "dis:beta=15.0,k_activation=2", out=side, write_payload="hb")
    sidecar = read_sidecar(side)
    fields = sidecar.info["payload"]["fields"]
    assert len(fields) == sidecar.bias.shape[1] and (fields == ["hb"] or fields[0] == "hb_0")
    for c, field in enumerate(fields):
        np.testing.assert_allclose(stored(collection, sidecar.ids, field)[0], sidecar.bias[:, c], rtol=1e-6, atol=1e-7)


def test_stores_that_cannot_are_refused_before_anything_is_read(tmp_path):
    import faiss
    from typer.testing import CliRunner

    from hubless.cli.main import app

    rng = np.random.default_rng(7)
    x, bank = hub_prone(rng, 50), hub_prone(rng, 60)
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(x.shape[1]))
    index.add_with_ids(x, np.arange(50, dtype=np.int64))
    path = str(tmp_path / "c.faiss")
    faiss.write_index(index, path)
    with pytest.raises(InvalidInput, match="FAISS index file holds only vectors and ids"):
        attach(path, bank, SPEC, out=tmp_path / "side", write_payload=True)
    assert not (tmp_path / "side").exists()
    np.save(tmp_path / "bank.npy", bank)
    result = CliRunner().invoke(
        app, ["attach", path, "--query-bank", str(tmp_path / "bank.npy"), "--out", str(tmp_path / "s"), "--write-payload"]
    )
    assert result.exit_code == 2 and "bias.npy" in result.output
    coll = Collection("lancedb", tmp_path)
    coll.create(x, np.arange(50, dtype=np.int64))
    for bad, why in (("id", "own id or vector field"), ("1x", "letters, digits")):
        with pytest.raises(InvalidInput, match=why):
            attach(coll.uri, bank, SPEC, out=tmp_path / "s2", write_payload=bad)
    result = CliRunner().invoke(
        app,
        [
            "attach",
            coll.uri,
            "--query-bank",
            str(tmp_path / "bank.npy"),
            "--out",
            str(tmp_path / "s3"),
            "--write-payload",
            "--payload-field",
            "hb",
        ],
    )
    assert result.exit_code == 0 and "payload field hb of 50 items" in result.output, result.output
    result = CliRunner().invoke(
        app, ["attach", coll.uri, "--query-bank", str(tmp_path / "bank.npy"), "--out", str(tmp_path / "s3"), "--update", "--write-payload"]
    )
    assert result.exit_code == 2 and "goes with attaching" in result.output
