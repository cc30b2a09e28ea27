"""Every id a collection can hold is an id (issue 52 item 1): negative ids, -1 and the int64
extremes, which FAISS ``IndexIDMap2`` and LanceDB both allow, are found, ranked and measured
like any other; an unfilled slot is read from ``Hits.found``, never from its id. Real FAISS files
and embedded LanceDB tables against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from hubless import Hits
from hubless.attached import attach
from hubless.attached.certified import recall_at_k
from tests.attached.test_attach import Collection, brute_force_nnn, exact_top, hub_prone

SPEC = "nnn:alpha=0.75,k=8"
I64 = np.iinfo(np.int64)


def signed_ids(rng, n):
    """The user's ids: negative and positive, -1 and 0 among them, the int64 extremes too."""
    ids = np.concatenate([[-1, 0, I64.min, I64.max], rng.choice(np.arange(-10_000, 10_000), n - 4, replace=False)])
    ids = np.unique(ids)
    while ids.size < n:  # -1 / 0 drawn twice: top up
        ids = np.unique(np.concatenate([ids, rng.integers(20_000, 30_000, n - ids.size)]))
    return rng.permutation(ids).astype(np.int64)


@pytest.mark.parametrize("kind", ["faiss-flat", "lancedb"])
def test_negative_ids_are_found_ranked_and_measured_like_any_other(kind, tmp_path):
    rng = np.random.default_rng(52)
    n = 240
    x, bank, queries = hub_prone(rng, n), hub_prone(rng, 300), hub_prone(rng, 40)
    ids = signed_ids(rng, n)
    assert (ids < 0).sum() > n // 3 and -1 in ids
    coll = Collection(kind, tmp_path)
    coll.create(x, ids)
    attached = attach(coll.uri, bank, SPEC, out=tmp_path / "side", batch=64)
    want_ids, want_scores = exact_top(brute_force_nnn(x, bank, queries, 0.75, 8), ids, 10)
    assert (want_ids < 0).any()  # the exact answers do hold negative ids
    result = attached.search_certified(queries, 10)
    assert isinstance(result, Hits) and result.found.all()
    np.testing.assert_array_equal(result.ids, want_ids)
    np.testing.assert_allclose(result.scores, want_scores, atol=2e-5)
    assert result.certified.all() and result.exact.all()  # an exact store: complete candidates
    exact = attached.exact_search(queries, 10)
    np.testing.assert_array_equal(exact.ids, want_ids)
    assert exact.found.all()
    # the measure reads the found masks: a wrong answer with negative ids is not recall 1.0
    report = attached.evaluate(queries, 10)
    assert report["recall"] == 1.0 and report["certified"] == 1.0 and report["exact"] == 1.0
    others = Hits.from_found(exact.scores, np.roll(exact.ids, 1, axis=0), exact.found)  # another query's answers
    assert recall_at_k(others, exact) < 0.5
    # a top_k beyond the collection: the padded slots are not hits, the id -1 of an item is
    wide = attached.search_certified(queries[:3], n + 5)
    assert wide.found[:, :n].all() and not wide.found[:, n:].any()
    assert {int(i) for i in wide.ids[0, :n]} == set(ids.tolist())


def test_recall_at_k_reads_found_masks_not_ids():
    exact = Hits.from_found(np.zeros((2, 3)), [[-1, -2, 9], [5, -1, 0]], [[True, True, True], [True, True, False]])
    found = Hits.from_found(np.zeros((2, 3)), [[-2, -1, 4], [-1, 0, 0]], [[True, True, True], [True, False, False]])
    assert recall_at_k(found, exact) == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert recall_at_k(exact, exact) == 1.0


def test_ids_beyond_int64_are_refused_before_anything_is_written(tmp_path):
    """What hubless could not keep as an int64 id is refused when it is read, naming it: a Qdrant
    point id above 2**63 - 1 (Qdrant's go to 2**64 - 1), a Chroma id that is not a whole number
    in range, a LanceDB id column of uint64 values past the range or of floats."""
    import chromadb
    import lancedb
    import pyarrow as pa
    import qdrant_edge as qd

    from hubless.errors import InvalidInput

    rng = np.random.default_rng(1)
    x, bank = hub_prone(rng, 70), hub_prone(rng, 80)
    config = qd.EdgeConfig(vectors=qd.EdgeVectorParams(size=x.shape[1], distance=qd.Distance.Dot))
    shard = qd.EdgeShard.create(str(tmp_path / "qd" / "docs"), config)
    big = 2**63 + 5
    shard.update(qd.UpdateOperation.upsert_points([qd.Point(i if i else big, v.tolist(), None) for i, v in enumerate(x)]))
    shard.flush()
    with pytest.raises(InvalidInput, match=f"id {big} is not a whole number in the int64 range"):
        attach(f"qdrant://{tmp_path / 'qd'}/docs", bank, SPEC, out=tmp_path / "s1", shard=shard)
    client = chromadb.PersistentClient(path=str(tmp_path / "chroma"))
    coll = client.create_collection("docs", configuration={"hnsw": {"space": "ip"}}, embedding_function=None)
    coll.add(ids=[str(i) for i in range(69)] + ["99999999999999999999"], embeddings=x)
    with pytest.raises(InvalidInput, match="id 99999999999999999999 is not a whole number in the int64 range"):
        attach(f"chroma://{tmp_path / 'chroma'}/docs", bank, SPEC, out=tmp_path / "s2")
    db = lancedb.connect(str(tmp_path / "ldb"))
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), x.shape[1])
    db.create_table("u64", pa.table({"id": pa.array(np.arange(70, dtype=np.uint64) + np.uint64(2**63 - 3)), "vector": vectors}))
    with pytest.raises(InvalidInput, match="beyond the int64 range"):
        attach(f"lancedb://{tmp_path / 'ldb'}/u64", bank, SPEC, out=tmp_path / "s3")
    db.create_table("f", pa.table({"id": pa.array(np.arange(70, dtype=np.float64)), "vector": vectors}))
    with pytest.raises(InvalidInput, match="not an integer column"):
        attach(f"lancedb://{tmp_path / 'ldb'}/f", bank, SPEC, out=tmp_path / "s4")
    assert not any((tmp_path / f"s{i}").exists() for i in range(1, 5))
    shard.close()
