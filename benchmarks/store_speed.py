"""Every registered store vs hubless's own indexes, one run, one table.

    .venv/bin/python benchmarks/store_speed.py [--data synthetic|coco] [--n 20000] [--dim 256] [--repeats 5]

Per store: export rate (items/s; an ANN export includes building its index and measuring its
recall curve on the query bank), p50/p95 latency of 1 query and of a batch of 32 (over
``--repeats``), and recall@10 against the exact corrected top 10 (NNN, ``Index.search`` on a
Flat index) of 200 held-out test queries: at the store's default knob and at the knob chosen
for ``target_recall=0.95`` (measured on the index's query bank, never on these queries). The
floor (issue 32): every ANN store reaches recall@10 >= 0.95 with target_recall=0.95.

``--data synthetic``: hubless's hub-prone synthetic CLIP-like embeddings (topics, popular items,
a modality gap). ``--data coco``: MiniLM embeddings of the COCO Karpathy captions from
``../shared/data`` (gallery = caption 0 of each test image, bank = dev captions, queries =
test captions 1-4: only the captions used are embedded; needs the models extra; cached in
.cache/coco_text by benchmarks/coco_text.py's embed).
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

from hubless import Index
from hubless.export import export, search
from hubless.export.calibrate import recall_at

STORES = [  # (label, scheme, ann)
    ("LanceDB", "lancedb", "IVF_FLAT"),
    ("LanceDB", "lancedb", "IVF_PQ"),
    ("pgvector", "postgresql", "HNSW"),
    ("Qdrant (in process)", "qdrant", "HNSW"),
    ("Milvus Lite", "milvus", "HNSW"),
    ("Chroma", "chroma", "HNSW"),
]


def timings(fn, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def load_data(kind: str, n: int, dim: int):
    if kind == "synthetic":
        from hubless.data.synthetic import make_retrieval_data

        data = make_retrieval_data(n_items=n, captions_per_item=1, dim=dim, n_query_bank=5000, n_gallery_bank=10,
                                   n_val_items=10, n_topics=max(25, n // 100), seed=0)  # fmt: skip
        q = data.queries[np.random.default_rng(0).choice(len(data.queries), 200, replace=False)]
        return data.gallery, data.query_bank, q, f"synthetic hub-prone, {n:,} x {dim}"
    sys.path.insert(0, str(Path(__file__).parent))
    from coco_text import embed

    from hubless.data.karpathy import data_dir, load_captions

    if not (data_dir() / "coco_karpathy").is_dir():
        sys.exit(f"no COCO captions in {data_dir()} (set HUBLESS_DATA_DIR): skipped")
    test = load_captions("coco", "test5k").captions
    dev = load_captions("coco", "dev").captions
    n = len(test) // 5
    # the gallery is caption 0 of each image; the 200 test queries are drawn from captions 1-4
    # (query j is caption 1 + j // n of image j % n): only those captions are embedded
    pick = np.random.default_rng(0).choice(4 * n, 200, replace=False)
    rows = np.concatenate([np.arange(n) * 5, (pick % n) * 5 + 1 + pick // n])
    emb = embed([test[i] for i in rows], "coco-test5k-store-speed")
    bank = embed(dev, "coco-dev")
    gallery, q = emb[:n], emb[n:]
    return gallery, bank, q, f"COCO 5k MiniLM ({len(gallery):,} x {gallery.shape[1]}, bank {len(bank):,})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", choices=["synthetic", "coco"], default="synthetic")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--stores", default=",".join(sorted({s for _, s, _ in STORES})), help="comma-separated schemes")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.ERROR)
    gallery, bank, q, what = load_data(args.data, args.n, args.dim)
    spec = "nnn:alpha=0.5,k=16"
    index = Index.build(gallery, bank, spec, factory="Flat", progress=False)
    want = index.search(q, 10)[1]
    print(f"{what}, {spec}, 200 test queries, p50/p95 of {args.repeats}, one run")
    print("| store | export items/s | 1 query p50/p95 ms | 32 queries p50/p95 ms | recall@10 default | recall@10 target 0.95 (knob) |")
    print("|---|---|---|---|---|---|")
    nlist = int(2 ** round(np.log2(4 * np.sqrt(len(gallery)))))
    for name, factory in (("hubless Flat", "Flat"), ("hubless HNSW32", "HNSW32"), (f"hubless IVF{nlist}", f"IVF{nlist},Flat")):
        t0 = time.perf_counter()
        idx = Index.build(gallery, bank, spec, factory=factory, progress=False)
        rate = len(gallery) / (time.perf_counter() - t0)
        one = timings(lambda idx=idx: idx.search(q[:1], 10), args.repeats)
        many = timings(lambda idx=idx: idx.search(q[:32], 10), args.repeats)
        default = recall_at(idx.search(q, 10)[1], want)
        target = "-"
        if factory != "Flat":
            chosen = idx.calibrate(target_recall=0.95)
            target = f"{recall_at(idx.search(q, 10)[1], want):.3f} ({chosen['param']}={chosen['value']})"
        print(f"| {name} (build) | {rate:,.0f} | {one[0]:.2f}/{one[1]:.2f} | {many[0]:.1f}/{many[1]:.1f} | {default:.3f} | {target} |")
    chosen_schemes = set(args.stores.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        for label, scheme, ann in STORES:
            if scheme not in chosen_schemes:
                continue
            if scheme == "postgresql":
                if server is None:
                    import pgserver

                    server = pgserver.get_server(f"{tmp}/pg", cleanup_mode="stop")
                base, _, opts = server.get_uri().partition("?")
                uri = f"{base}/bench_{ann.lower()}?{opts}"
            else:
                uri = f"{scheme}://{tmp}/{scheme}/bench_{ann.lower()}"
            t0 = time.perf_counter()
            export(index, uri, ann=ann, target_recall=0.95)
            rate = len(gallery) / (time.perf_counter() - t0)
            from hubless.export import describe

            info = describe(uri)["ann"]
            knob, store_default = info["knob"], {"lancedb": 20, "postgresql": 100, "qdrant": 128, "milvus": 64, "chroma": 100}[scheme]
            default = recall_at(search(uri, q, 10, **{knob: store_default})[1], want)
            at_target = recall_at(search(uri, q, 10)[1], want)
            one = timings(lambda uri=uri: search(uri, q[:1], 10), args.repeats)
            many = timings(lambda uri=uri: search(uri, q[:32], 10), args.repeats)
            print(
                f"| {label} {ann} | {rate:,.0f} | {one[0]:.2f}/{one[1]:.2f} | {many[0]:.1f}/{many[1]:.1f} | "
                f"{default:.3f} ({knob}={store_default}) | {at_target:.3f} ({knob}={info['default']}) |",
                flush=True,
            )
        if server is not None:
            server.cleanup()


if __name__ == "__main__":
    main()
