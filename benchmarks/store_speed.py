"""Export rate and search latency of hubless.export stores vs hubless's own indexes, one run.

    .venv/bin/python benchmarks/store_speed.py [--n 100000] [--dim 512] [--repeats 3]

Per store and variant, on hubless's synthetic CLIP-like embeddings: export rate (items/s), p50
latency of one query and of a batch of 32 (median over repeats), and recall@10 of the exact
corrected top 10 (Index.search on a Flat index). Stores: LanceDB (embedded), PostgreSQL + pgvector (a pgserver started here), Qdrant (its
engine in-process); each exact and with its ANN index.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from hubless import Index
from hubless.data.synthetic import make_retrieval_data
from hubless.export import export, search


def p50(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1000


def recall(ids, want) -> float:
    return float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, want)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--stores", default="lancedb,pgvector,qdrant", help="comma-separated: lancedb, pgvector, qdrant")
    ap.add_argument("--qdrant-url", help="a Qdrant server (http://host:port) to add its rows (qdrant+http://); none by default")
    args = ap.parse_args()
    chosen = set(args.stores.split(","))
    import pgserver

    # hubless's synthetic CLIP-like data (topics, popular items, a modality gap): uniformly random
    # 512-d vectors have no neighbourhoods, and every ANN index finds next to nothing on them
    data = make_retrieval_data(n_items=args.n, captions_per_item=1, dim=args.dim, n_query_bank=5000, n_gallery_bank=10,
                               n_val_items=10, n_topics=max(25, args.n // 100), seed=0)  # fmt: skip
    gallery, bank = data.gallery, data.query_bank
    q = data.queries[np.random.default_rng(0).choice(len(data.queries), 32, replace=False)]
    index = Index.build(gallery, bank, "nnn:alpha=0.5,k=16", factory="Flat", progress=False)
    hnsw = Index.build(gallery, bank, "nnn:alpha=0.5,k=16", factory="HNSW32", progress=False)
    want = index.search(q, top_k=10)[1]
    print(f"n={args.n:,} dim={args.dim}, NNN, p50 of {args.repeats}")
    print("| store | export items/s | p50 1 query ms | p50 32 queries ms | recall@10 |\n|---|---|---|---|---|")
    for name, idx in (("hubless Flat", index), ("hubless HNSW32", hnsw)):
        one = p50(lambda idx=idx: idx.search(q[:1], top_k=10), args.repeats)
        batch = p50(lambda idx=idx: idx.search(q, top_k=10), args.repeats)
        print(f"| {name} | - | {one:.1f} | {batch:.1f} | {recall(idx.search(q, top_k=10)[1], want):.3f} |")
    with tempfile.TemporaryDirectory() as tmp:
        server = pgserver.get_server(f"{tmp}/pg", cleanup_mode="stop")
        base, _, opts = server.get_uri().partition("?")
        try:
            stores = [
                ("LanceDB", lambda table: f"lancedb://{tmp}/lance/{table}", "IVF_PQ"),
                ("pgvector", lambda table: f"{base}/{table}?{opts}", "HNSW"),
                ("Qdrant (edge)", lambda table: f"qdrant://{tmp}/qdrant/{table}", "HNSW"),
            ]
            if args.qdrant_url:
                stores.append(("Qdrant server", lambda table: f"qdrant+{args.qdrant_url.rstrip('/')}/hubless_bench_{table}", "HNSW"))
            for name, uri, ann in stores:
                if name.split()[0].lower() not in chosen:
                    continue
                for variant in (None, ann):
                    target = uri("exact" if variant is None else "ann")
                    t0 = time.perf_counter()
                    export(index, target, ann=variant, overwrite=True)  # a server keeps its collections between runs
                    rate = args.n / (time.perf_counter() - t0)
                    exact = variant is None
                    got = search(target, q, top_k=10, exact=exact)[1]
                    one = p50(lambda t=target, e=exact: search(t, q[:1], top_k=10, exact=e), args.repeats)
                    batch = p50(lambda t=target, e=exact: search(t, q, top_k=10, exact=e), args.repeats)
                    label = f"{name} {'exact' if exact else variant}"
                    print(f"| {label} | {rate:,.0f} | {one:.1f} | {batch:.1f} | {recall(got, want):.3f} |")
        finally:
            server.cleanup()


if __name__ == "__main__":
    main()
