"""Two words for two promises (issue 52 item 2), on the real engines: an answer is ``exact`` only
where the store's candidates are known complete (a flat index, an IVF probed in every list, a
table without a vector index, an exact-search option), and every answer claimed exact equals
brute force; through an ANN index answers are ``certified`` (relative to the store's plain
ranking) and never claimed exact, and the store's beam is the one attach chose from its recall
measured on a sample of the bank."""

from __future__ import annotations

import numpy as np
import pytest

from hubless.attached import attach, read_sidecar
from hubless.attached.beam import BEAM_RECALL, beam_knobs, probe_queries
from tests.attached.test_attach import D, brute_force_nnn, exact_top, hub_prone

pytestmark = pytest.mark.filterwarnings("ignore:Local mode performs exact")

SPEC = "nnn:alpha=0.75,k=8"
N = 600


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(12)
    x, bank, queries = hub_prone(rng, N), hub_prone(rng, 400), hub_prone(rng, 40)
    ids = rng.permutation(N).astype(np.int64) * 5 + 3
    return x, ids, bank, queries, exact_top(brute_force_nnn(x, bank, queries, 0.75, 8), ids, 10)[0]


def faiss_file(tmp_path, x, ids, inner):
    import faiss

    index = faiss.IndexIDMap2(inner)
    if not inner.is_trained:
        inner.train(x)
    index.add_with_ids(x, ids)
    faiss.write_index(index, str(tmp_path / "c.faiss"))
    return str(tmp_path / "c.faiss"), {}


def lancedb_table(tmp_path, x, ids, indexed: bool):
    import lancedb
    import pyarrow as pa

    vectors = pa.FixedSizeListArray.from_arrays(pa.array(x.ravel(), pa.float32()), D)
    table = lancedb.connect(str(tmp_path / "ldb")).create_table("docs", pa.table({"id": pa.array(ids), "vector": vectors}))
    if indexed:
        table.create_index(metric="dot", index_type="IVF_FLAT", num_partitions=8, vector_column_name="vector")
    return f"lancedb://{tmp_path / 'ldb'}/docs", {}


def qdrant_shard(tmp_path, x, ids, indexed: bool):
    import qdrant_edge as qd

    optimizers = qd.EdgeOptimizersConfig(indexing_threshold=1) if indexed else None
    config = qd.EdgeConfig(vectors=qd.EdgeVectorParams(size=D, distance=qd.Distance.Dot), optimizers=optimizers)
    shard = qd.EdgeShard.create(str(tmp_path / "qd" / "docs"), config)
    shard.update(qd.UpdateOperation.upsert_points([qd.Point(int(i), v.tolist(), None) for i, v in zip(ids, x)]))
    if indexed:
        shard.optimize()
    shard.flush()
    return f"qdrant://{tmp_path / 'qd'}/docs", {"shard": shard}


def store(kind, tmp_path, x, ids):
    import faiss

    if kind == "faiss-flat":
        return faiss_file(tmp_path, x, ids, faiss.IndexFlatIP(D))
    if kind == "faiss-ivf":
        return faiss_file(tmp_path, x, ids, faiss.IndexIVFFlat(faiss.IndexFlatIP(D), D, 16, faiss.METRIC_INNER_PRODUCT))
    if kind == "faiss-hnsw":
        return faiss_file(tmp_path, x, ids, faiss.IndexHNSWFlat(D, 4, faiss.METRIC_INNER_PRODUCT))
    if kind.startswith("lancedb"):
        return lancedb_table(tmp_path, x, ids, kind == "lancedb-ivf")
    return qdrant_shard(tmp_path, x, ids, kind == "qdrant-hnsw")


#: kind -> (whether its default search is exact, the knobs of an exact search of it, or None)
KINDS = {
    "faiss-flat": (True, None),
    "faiss-ivf": (False, {"nprobe": 16}),  # every list probed
    "faiss-hnsw": (False, None),
    "lancedb": (True, None),
    "lancedb-ivf": (False, {"exact": True}),
    "qdrant": (True, None),
    "qdrant-hnsw": (False, {"exact": True}),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_exact_is_claimed_only_over_complete_candidates_and_then_holds(kind, data, tmp_path):
    x, ids, bank, queries, want = data
    uri, options = store(kind, tmp_path, x, ids)
    attached = attach(uri, bank, SPEC, out=tmp_path / "side", **options)
    exact_store, exact_knobs = KINDS[kind]
    assert attached.source.searches_exactly({}) == exact_store
    beam = read_sidecar(tmp_path / "side").info["beam"]
    result = attached.search_certified(queries, 10)
    np.testing.assert_array_equal(result.ids[result.exact], want[result.exact])  # what is claimed exact is
    if exact_store:
        assert beam is None and result.certified.all() and result.exact.mean() >= 0.9
    else:
        complete = attached.source.searches_exactly(beam_knobs(beam, {}, 80))  # an IVF whose default beam probes every list
        assert result.exact.any() == complete  # through an ANN index: certified at most, never claimed exact
        assert beam is not None and beam["knob"] == attached.source.beam_knob and beam["target"] == BEAM_RECALL
        points = {int(v): r for v, r in beam["recall"]}  # the beams the bisection measured
        chosen = beam_knobs(beam, {}, 80)[beam["knob"]]  # the default beam at k' = 80 is one measured
        assert chosen in points and beam["value_recall"] == points[chosen]
        if beam["met"]:  # narrower beams measured fall short, wider ones reach the target
            assert all((r >= BEAM_RECALL) == (v >= chosen) for v, r in points.items()), points
        else:
            assert chosen == max(points) and all(r < BEAM_RECALL for r in points.values()), points
        # the recall recorded is the store's, at that beam, on the probe's bank queries: measured again by brute force
        probe = probe_queries(bank)
        top = np.argsort(-(probe @ x.T), axis=1, kind="stable")[:, :80]
        got = attached.source.search(probe, 80, **{beam["knob"]: chosen})
        hit = (got.ids[:, :, None] == ids[top][:, None, :]) & got.found[:, :, None]
        assert abs(float(hit.any(axis=1).mean()) - beam["value_recall"]) <= 1e-4
        assert beam_knobs(beam, {beam["knob"]: 3}, 80) == {beam["knob"]: 3}  # a knob given wins
    if exact_knobs is not None:  # the store's own exact search: then claimed, and right
        full = attached.search_certified(queries, 10, **exact_knobs)
        assert full.certified.all() and full.exact.mean() >= 0.9
        np.testing.assert_array_equal(full.ids, want)
    report = attached.evaluate(queries, 10)
    assert report["wrong_exact"] == 0 and report["exact"] == result.exact.mean()
