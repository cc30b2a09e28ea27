"""Export rate and search latency of hubless.export stores vs hubless's own Flat index, one run.

    .venv/bin/python benchmarks/store_speed.py [--n 100000] [--dim 512]

Per store: export rate (items/s), p50 latency of one query and of a batch of 32 (median over
repeats), and top-10 agreement with Index.search (Flat). LanceDB only so far (exact scan).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from hubless import Index
from hubless.export import export, search


def unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def p50(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    gallery, bank, q = unit(rng, args.n, args.dim), unit(rng, 5000, args.dim), unit(rng, 32, args.dim)
    index = Index.build(gallery, bank, "nnn:alpha=0.5,k=16", factory="Flat", progress=False)
    want = index.search(q, top_k=10)[1]
    print(f"n={args.n} dim={args.dim}")
    print(f"{'store':<16} {'export items/s':>15} {'p50 1 query ms':>15} {'p50 32 queries ms':>18} {'top-10 agree':>13}")
    print(
        f"{'hubless Flat':<16} {'-':>15} {p50(lambda: index.search(q[:1], top_k=10), args.repeats):>15.2f} "
        f"{p50(lambda: index.search(q, top_k=10), args.repeats):>18.2f} {1.0:>13.3f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"lancedb://{tmp}/db/gallery"
        t0 = time.perf_counter()
        export(index, uri)
        rate = args.n / (time.perf_counter() - t0)
        got = search(uri, q, top_k=10)[1]
        agree = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, want)]))
        one = p50(lambda: search(uri, q[:1], top_k=10), args.repeats)
        batch = p50(lambda: search(uri, q, top_k=10), args.repeats)
        print(f"{'LanceDB exact':<16} {rate:>15.0f} {one:>15.2f} {batch:>18.2f} {agree:>13.3f}")


if __name__ == "__main__":
    main()
