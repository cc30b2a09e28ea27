"""Single-machine fit vs the Ray fit (1 and 2 workers) on the same sharded data, in one run.

    .venv/bin/python benchmarks/distributed_fit.py            # gallery 50k x bank 200k x 512 (~10 min on 2 cores)
    .venv/bin/python benchmarks/distributed_fit.py --scale 0.1

Both sides read the same .npy shards from disk (the single-machine fit loads them, then fits
NNN k=16; the Ray fit's tasks read their own tiles). Ray is started once before timing. Prints
the ratios (medians over repeats) and the inputs of the README's scaling note: one tile's GEMM
rate, bytes read per tile, the merge cost per tile, and the projected time of a 10^9 x 10^7 x 768
fit on N workers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import print_table  # noqa: E402

import hubless  # noqa: E402
import hubless.distributed as hd  # noqa: E402
from hubless.distributed.plan import BANK_COLS, GALLERY_ROWS, Tile  # noqa: E402
from hubless.distributed.tile_compute import compute_tile  # noqa: E402
from hubless.distributed.tile_merge import TileMerger  # noqa: E402

METHOD = "nnn:alpha=0.75,k=16"


def unit(rng, n, d):
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def write_shards(folder: Path, rng, n: int, d: int, parts: int) -> Path:
    folder.mkdir(parents=True)
    bounds = np.linspace(0, n, parts + 1).astype(int)
    for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
        np.save(folder / f"part_{i}.npy", unit(rng, b - a, d))
    return folder


def load_all(folder: Path) -> np.ndarray:
    return np.concatenate([np.load(p) for p in sorted(folder.glob("*.npy"), key=lambda p: int(p.stem.split("_")[1]))])


def median_seconds(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def tile_costs(d: int, rows: int, cols: int) -> dict:
    """One default-size tile on one core: GEMM rate, bytes read, merge time."""
    rng = np.random.default_rng(1)
    g, b = unit(rng, rows, d), unit(rng, cols, d)
    request = hubless.make_correction(METHOD).statistics_request()
    tiles = [Tile("query", 0, rows, 0, cols), Tile("query", 0, rows, cols, 2 * cols)]
    os.environ["HUBLESS_NUM_THREADS"] = "1"
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        t0 = time.perf_counter()
        part = compute_tile(tiles[0], g, b, request)
        seconds = time.perf_counter() - t0
    del os.environ["HUBLESS_NUM_THREADS"]
    merger = TileMerger(tiles, request, rows, d)
    merger.add(tiles[0], part)
    t0 = time.perf_counter()
    merger.add(tiles[1], part)
    merge = time.perf_counter() - t0
    return {"seconds": seconds, "gflops": 2 * rows * cols * d / seconds / 1e9, "bytes": (rows + cols) * d * 4, "merge": merge}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of gallery 50k x bank 200k")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    n_gallery, n_bank, d = int(50_000 * args.scale), int(200_000 * args.scale), args.dim
    full = args.scale == 1.0 and d == 512
    import ray

    t0 = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray_start = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        gdir = write_shards(Path(tmp) / "gallery", rng, n_gallery, d, 4)
        bdir = write_shards(Path(tmp) / "bank", rng, n_bank, d, 8)
        print(f"gallery {n_gallery:,} x bank {n_bank:,} x {d}, {METHOD}, medians of {args.repeats}; Ray started in {ray_start:.1f} s")

        def single():
            return hubless.make_correction(METHOD).fit(load_all(gdir), load_all(bdir), progress=False)

        def on_ray(workers):
            return lambda: hd.fit(METHOD, gdir, bdir, workers=workers, progress=False)

        t_single, want = median_seconds(single, args.repeats)
        t_one, got_one = median_seconds(on_ray(1), args.repeats)
        t_two, got_two = median_seconds(on_ray(2), args.repeats)
        for got in (got_one, got_two):
            np.testing.assert_allclose(got.bias_columns_, want.bias_columns_, rtol=1e-6, atol=1e-6)
    costs = tile_costs(d, GALLERY_ROWS, BANK_COLS)
    rows = [
        ("single-machine fit (load + fit), s", f"{t_single:.1f}", ""),
        ("Ray fit, 1 worker (2 CPUs), s", f"{t_one:.1f}", ""),
        ("Ray fit, 2 workers (1 CPU each), s", f"{t_two:.1f}", ""),
        ("Ray 1 worker / single machine", f"{t_one / t_single:.2f}x", "<= 1.25x"),
        ("Ray 2 workers / single machine", f"{t_two / t_single:.2f}x", ""),
        (f"one tile {GALLERY_ROWS} x {BANK_COLS} x {d} on 1 core, s", f"{costs['seconds']:.2f}", ""),
        ("GEMM rate per core, GFLOP/s", f"{costs['gflops']:.0f}", ""),
        ("bytes read per tile, MB", f"{costs['bytes'] / 1e6:.0f}", ""),
        ("merge of one tile on the driver, ms", f"{costs['merge'] * 1000:.0f}", ""),
    ]
    flops = 2 * 1e9 * 1e7 * 768
    core_hours = flops / (costs["gflops"] * 1e9) / 3600
    for workers in (64, 512):
        rows.append((f"projected 10^9 x 10^7 x 768 on {workers} CPU cores, hours", f"{core_hours / workers:,.0f}", ""))
    print_table(rows, full_size=full, size="gallery 50k x bank 200k x 512")
    print(f"(a 10^9 x 10^7 x 768 fit is {flops:.2e} FLOPs = {core_hours:,.0f} core-hours at the measured per-core rate)")


if __name__ == "__main__":
    main()
