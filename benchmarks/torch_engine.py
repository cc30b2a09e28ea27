"""The engine's block products in numpy vs torch (CPU here; CUDA too when a GPU is present).

    .venv/bin/python benchmarks/torch_engine.py [--gallery 20000] [--bank 100000] [--dim 512]

Times an NNN k=16 fit (bank statistics) per device, medians of --repeats in one run, printed as
ratios to numpy, and the error of float16 / bfloat16 products against float32: the largest bias
difference and the top-10 agreement of 500 searches.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import hubless
from hubless.engine import use_device


def unit(rng, n, d):
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def median_seconds(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gallery", type=int, default=20_000)
    ap.add_argument("--bank", type=int, default=100_000)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch

    rng = np.random.default_rng(0)
    g, b, q = unit(rng, args.gallery, args.dim), unit(rng, args.bank, args.dim), unit(rng, 500, args.dim)
    devices = ["numpy", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(f"NNN k=16 fit, gallery {args.gallery:,} x bank {args.bank:,} x {args.dim}, medians of {args.repeats}")
    base = None
    for device in devices:
        t = median_seconds(lambda device=device: hubless.NNN(k=16).fit(g, b, device=device, progress=False), args.repeats)
        base = base or t
        print(f"  {device:<6} {t:7.2f} s   {t / base:5.2f}x numpy")
    want = hubless.NNN(k=16).fit(g, b)
    want_ids = want.search(q, 10)[1]
    half_device = "cuda" if torch.cuda.is_available() else "cpu"
    for dtype in ("float16", "bfloat16"):
        with use_device(half_device, dtype):
            got = hubless.NNN(k=16).fit(g, b, progress=False)
            ids = got.search(q, 10)[1]
        agree = np.mean([len(set(x) & set(y)) / 10 for x, y in zip(ids, want_ids)])
        err = np.abs(got.bias_ - want.bias_).max()
        print(f"  {dtype:<9} on {half_device}: max |bias - float32 bias| = {err:.2e}, top-10 agreement {agree:.3f}")


if __name__ == "__main__":
    main()
