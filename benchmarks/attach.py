"""Attaching a correction to a collection the user already has (issue 42), one run, one table per store.

    .venv/bin/python benchmarks/attach.py [--n 10000] [--dim 128] [--queries 1000] [--stores faiss,lancedb,qdrant]

Each store holds a *plain* collection written as a user would (their ids: a shuffled, sparse
range; never through hubless): a FAISS ``IndexIDMap2(IndexHNSWFlat(d, 32))`` file, an embedded
LanceDB table with an IVF_FLAT index (dot), a shard of Qdrant's in-process engine with its HNSW
index (Dot). The data is hubless's hub-prone synthetic set; the correction NNN (alpha 0.75,
k 16) against a 5,000-query bank. Per store:

* recall@10 of the attached search against exact corrected search (brute force), next to the
  store's own plain recall@10 against exact plain search (floor: >= plain - 0.5 pt);
* the queries certified at the default k' (8 x 10, no widening) and after widening (floor: >= 95%
  at the default k'), with the k' the certificate needed (median, 95th percentile, max);
* p50 latency of one query: attached vs the store's own plain top-10 query at its defaults
  (its own client call, no hubless in between; FAISS on one thread: its OpenMP threads only
  add waiting to a one-query call on a loaded machine) (floor: <= 2x);
* attach time against an in-process fit on the same arrays plus the store's read time (a full
  scan of ids and vectors), each timed twice, interleaved, medians (floor: <= 1.5x);
* an update after adding 1% of items: bytes read against the added items' ids + vectors plus
  the ids scan (the id sets are compared) and the 32-vector sample hash.

Floors apply at the issue's size: ``--n 100000 --dim 256 --queries 10000``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _table import print_table  # noqa: E402

from hubless import NNN  # noqa: E402
from hubless.attached import attach, open_source, update  # noqa: E402
from hubless.engine import exact_search  # noqa: E402

SPEC = "nnn:alpha=0.75,k=16"
FULL = (100_000, 256, 10_000)


def recall_at(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got.tolist(), want.tolist())]))


def make_faiss(path: Path, x, ids):
    import faiss

    path = path / "collection.faiss"
    index = faiss.IndexIDMap2(faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT))
    index.add_with_ids(x, ids)
    faiss.write_index(index, str(path))

    def plain(queries):  # the store's own query at its own defaults
        return index.search(queries, 10)[1]

    return str(path), {}, lambda new, new_ids: (index.add_with_ids(new, new_ids), faiss.write_index(index, str(path))), plain


def make_lancedb(path: Path, x, ids):
    import lancedb
    import pyarrow as pa

    def table(rows, keys):
        return pa.table({"id": pa.array(keys, pa.int64()), "vector": pa.FixedSizeListArray.from_arrays(pa.array(rows.ravel()), x.shape[1])})

    db = lancedb.connect(str(path))
    tbl = db.create_table("docs", table(x, ids))
    tbl.create_index(metric="dot", index_type="IVF_FLAT", num_partitions=max(1, int(np.sqrt(len(x)) / 2)), vector_column_name="vector")

    def plain(queries):
        res = tbl.search(queries[0], vector_column_name="vector").distance_type("dot").limit(10).select(["id", "_distance"]).to_arrow()
        return res["id"].to_numpy()[None, :]

    return f"lancedb://{path}/docs", {}, lambda new, new_ids: tbl.add(table(new, new_ids)), plain


def make_qdrant(path: Path, x, ids):
    import qdrant_edge as qd

    config = qd.EdgeConfig(
        vectors=qd.EdgeVectorParams(size=x.shape[1], distance=qd.Distance.Dot), optimizers=qd.EdgeOptimizersConfig(indexing_threshold=1)
    )
    shard = qd.EdgeShard.create(str(path / "docs"), config)

    def add(rows, keys):
        for lo in range(0, len(rows), 4096):
            points = [qd.Point(int(i), v.tolist(), None) for i, v in zip(keys[lo : lo + 4096], rows[lo : lo + 4096])]
            shard.update(qd.UpdateOperation.upsert_points(points))
        shard.optimize()
        shard.flush()

    add(x, ids)

    def plain(queries):
        requests = [qd.QueryRequest(limit=10, query=qd.Query.Nearest(v), with_payload=False) for v in queries.tolist()]
        return np.array([[p.id for p in hits] for hits in shard.query_batch(qd.QueryBatchRequest(requests))])

    return f"qdrant://{path}/docs", {"shard": shard}, add, plain


MAKERS = {
    "faiss": ("FAISS HNSW32 file", make_faiss),
    "lancedb": ("LanceDB IVF_FLAT", make_lancedb),
    "qdrant": ("Qdrant HNSW (in process)", make_qdrant),
}


def p50_single(fn, queries, n: int) -> float:
    times = []
    for i in range(min(n, len(queries))):
        t0 = time.perf_counter()
        fn(queries[i : i + 1])
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--bank", type=int, default=5000)
    ap.add_argument("--single", type=int, default=100, help="single queries timed (interleaved)")
    ap.add_argument("--stores", default="faiss,lancedb,qdrant")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.ERROR)
    from hubless.data.synthetic import make_retrieval_data

    data = make_retrieval_data(n_items=args.n, captions_per_item=max(1, -(-args.queries // args.n)), dim=args.dim,
                               n_query_bank=args.bank, n_gallery_bank=10, n_val_items=10, n_topics=max(25, args.n // 100), seed=0)  # fmt: skip
    rng = np.random.default_rng(0)
    x = np.ascontiguousarray(data.gallery[rng.permutation(args.n)], np.float32)
    ids = rng.permutation(args.n).astype(np.int64) * 3 + 7  # the user's ids
    q = np.ascontiguousarray(data.queries[rng.choice(len(data.queries), args.queries, replace=False)], np.float32)
    bank = data.query_bank
    full = (args.n, args.dim, args.queries) == FULL
    nnn = NNN(alpha=0.75, k=16).fit(x, bank)
    exact_corrected = ids[nnn.search(q, 10)[1]]
    exact_plain = ids[exact_search(q, x, 10)[1]]
    n_new = max(1, args.n // 100)
    new = make_retrieval_data(n_items=n_new, captions_per_item=1, dim=args.dim, n_query_bank=10, n_gallery_bank=10,
                              n_val_items=10, n_topics=25, seed=1).gallery  # fmt: skip
    new_ids = np.arange(n_new, dtype=np.int64) * 3 + 3 * args.n + 10
    print(
        f"synthetic hub-prone {args.n:,} x {args.dim}, bank {len(bank):,}, {args.queries:,} queries, {SPEC}; one run, {time.strftime('%Y-%m-%d')}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores.split(","):
            label, make = MAKERS[store]
            folder = Path(tmp) / store
            folder.mkdir()
            uri, options, add, store_plain = make(folder, x, ids)
            source = open_source(uri, **options)
            # the store's read, the in-process fit and the attach, twice each, interleaved (medians):
            # the machine is shared, so only adjacent timings compare
            read_t, fit_t, attach_t = [], [], []
            for _ in range(2):
                t0 = time.perf_counter()
                for _ in source.scan():
                    pass
                read_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                NNN(alpha=0.75, k=16).fit(x, bank)
                fit_t.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                attached = attach(source, bank, SPEC, out=folder / "sidecar")
                attach_t.append(time.perf_counter() - t0)
            read_s, fit_s, attach_s = (float(np.median(t)) for t in (read_t, fit_t, attach_t))
            plain = np.concatenate([store_plain(q[i : i + 256]) for i in range(0, len(q), 256)]) if store != "lancedb" else None
            if plain is None:
                plain = source.search(q, 10)[1]
            narrow = attached.search_certified(q, 10, max_candidates=80)
            result = attached.search_certified(q, 10)
            if store == "faiss":  # one query per call: FAISS's OpenMP threads only add waiting on a loaded machine
                import faiss

                threads = faiss.omp_get_max_threads()
                faiss.omp_set_num_threads(1)
            plain_p50 = p50_single(store_plain, q, args.single)
            attached_p50 = p50_single(lambda one, a=attached: a.search(one, 10), q, args.single)
            plain_p50 = min(plain_p50, p50_single(store_plain, q, args.single))  # interleaved, twice
            # where the attached query's time goes: the store's plain top-k' alone (through the source)
            kp_p50 = p50_single(lambda one, s_=source: s_.search(one, 80), q, args.single)
            if store == "faiss":
                faiss.omp_set_num_threads(threads)
            add(new, new_ids)
            report = update(folder / "sidecar", source, bank)
            expected = 8 * (args.n + n_new) + (8 + 4 * args.dim) * (n_new + 32)
            r_plain, r_attached = recall_at(plain, exact_plain), recall_at(result.ids, exact_corrected)
            kp = result.candidates
            rows = [
                ("recall@10 attached vs exact corrected", f"{r_attached:.4f}", f">= plain - 0.005 = {r_plain - 0.005:.4f}"),
                ("recall@10 store plain vs exact plain", f"{r_plain:.4f}", ""),
                ("certified at default k' (8 x 10 = 80)", f"{narrow.certified.mean():.1%}", ">= 95%"),
                ("certified after widening", f"{result.certified.mean():.1%}", ""),
                ("k' needed p50 / p95 / max", f"{np.median(kp):.0f} / {np.percentile(kp, 95):.0f} / {kp.max()}", ""),
                ("1 query p50 ms: attached / plain", f"{attached_p50:.2f} / {plain_p50:.2f} = {attached_p50 / plain_p50:.2f}x", "<= 2x"),
                ("1 query p50 ms: the store's top-k' (80) alone", f"{kp_p50:.2f}", ""),
                (
                    "attach s / (fit + read) s",
                    f"{attach_s:.2f} / ({fit_s:.2f} + {read_s:.2f}) = {attach_s / (fit_s + read_s):.2f}x",
                    "<= 1.5x",
                ),
                ("update +1%: items' vectors read", f"{report['read_items']:,} of {args.n + n_new:,}", f"= {n_new:,}"),
                ("update +1%: bytes read / expected", f"{report['bytes_read']:,} / {expected:,}", "<= expected"),
            ]
            print(f"\n### {label}")
            print_table(rows, full_size=full, size=f"{FULL[0]:,} x {FULL[1]}, {FULL[2]:,} queries")
            source.close()


if __name__ == "__main__":
    main()
