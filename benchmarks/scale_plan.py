"""The measured inputs of docs/scale-1b.md: what one tile, one part and the driver's merge cost
here, and the 10^9-item plan extrapolated from them.

    .venv/bin/python benchmarks/scale_plan.py                 # d = 512, ~5 min on this 2-core machine
    .venv/bin/python benchmarks/scale_plan.py --rows 8192     # a quicker, smaller tile

Each stage runs in a fresh process on one core (as a one-CPU Ray task would), reading .npy
shards from disk through the same code a Ray task runs (no Ray: its scheduling is not what is
measured), while the parent samples the process's RSS every 20 ms (the peak growth over the
process's size once its inputs are opened is reported; not ru_maxrss, which counts start-up).

1. a tile of ``rows`` gallery rows x one 65,536-item bank piece (NNN k=16; IS beta=20): its
   time and GEMM rate (2 rows cols d FLOPs / s), its task's peak RSS, its kept work file's
   bytes per gallery row;
2. the same tile with 3 bank pieces (196,608 items): the task's memory does not grow with the
   tile's width (a task reads 65,536 bank items at a time);
3. one [r, bias] part of ``rows`` rows (write_augmented's task): time, peak RSS, bytes on disk;
4. the driver's merge of a 4,000,000-item gallery's tile partials (NNN k=16): bytes per item.

Then the projection for a gallery of 10^9 against banks of 10^6 and 10^7 (core-hours, tiles,
bytes per stage, the driver's RAM, wall time here and on 16 nodes).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import print_table  # noqa: E402

BANK_PIECE = 65_536
NNN, IS = "nnn:alpha=0.75,k=16", "is:beta=20.0"


def unit(rng, n, d, dtype=np.float32):
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(dtype)


# ---------------------------------------------------------------- stages (child processes)


def _one_core():
    os.environ["HUBLESS_NUM_THREADS"] = "1"
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def stage_tile(ready, go, out, release, spec, gallery_dir, bank_dir, rows, pieces, work_file):
    _one_core()
    from hubless.corrections import make_correction
    from hubless.distributed.plan import Tile
    from hubless.distributed.tile_compute import compute_tile_streamed
    from hubless.storage.sources import open_source
    from hubless.storage.workfiles import save_arrays

    g, b = open_source(gallery_dir, label="gallery"), open_source(bank_dir, label="query_bank")
    request = make_correction(spec).statistics_request()
    tile = Tile("query", 0, rows, 0, pieces * BANK_PIECE)
    ready.set()
    go.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    part = compute_tile_streamed(
        tile, lambda a, c: g.read(a, c, normalize=True), lambda a, c: b.read(a, c, normalize=True), request, g.n_rows, b.n_rows
    )
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    save_arrays(work_file, part.to_arrays(), {"tile": tile.key, "fit": "benchmark"})
    out.put({"seconds": seconds, "cpu": cpu, "work_bytes": Path(work_file).stat().st_size})
    release.wait()


def stage_part(ready, go, out, release, gallery_dir, bank_dir, rows, part_file):
    _one_core()
    from hubless.corrections import make_correction
    from hubless.engine.statistics import BankStatistics
    from hubless.index.index import augmented_rows
    from hubless.storage.sources import open_source

    g = open_source(gallery_dir, label="gallery")
    rng = np.random.default_rng(0)  # a slice of merged statistics as the part task receives it
    stats = BankStatistics(rows, 10_000_000, None, np.zeros(g.dim), np.zeros(g.dim))
    stats.query_topk = -np.sort(-rng.random((rows, 16), dtype=np.float32), axis=1)
    arrays = stats.to_arrays()
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    from hubless._atomic import atomic_open

    corr = make_correction(NNN).fit(g.read(0, rows, normalize=True), statistics=BankStatistics.from_arrays(arrays))
    with atomic_open(part_file, "wb") as fh:
        np.save(fh, augmented_rows(corr))
    out.put({"seconds": time.perf_counter() - t0, "part_bytes": Path(part_file).stat().st_size})
    release.wait()  # the rows, biases and part still held: the parent's last sample sees them


def stage_merge(ready, go, out, release, n_items, shard_rows):
    from hubless.corrections import make_correction
    from hubless.distributed.plan import plan_tiles
    from hubless.distributed.tile_merge import TileMerger
    from hubless.engine.statistics import BankStatistics

    request = make_correction(NNN).statistics_request()
    tiles = plan_tiles(request, n_items, 10_000_000, None, gallery_rows=shard_rows, bank_cols=10_000_000)
    rng = np.random.default_rng(0)
    topk = -np.sort(-rng.random((shard_rows, 16), dtype=np.float32), axis=1)
    merger = TileMerger(tiles, request, n_items, 512)
    ready.set()
    go.wait()
    t0 = time.perf_counter()
    for t in tiles:  # the partials arrive one by one (each is made here, as each would arrive from a task)
        part = BankStatistics(t.g1 - t.g0, 10_000_000, None, np.zeros(512), np.zeros(512))
        part.query_topk = topk[: t.g1 - t.g0].copy()
        merger.add(t, part)
    stats = merger.result()
    out.put({"seconds": time.perf_counter() - t0, "result_bytes": stats.query_topk.nbytes})
    release.wait()  # the merged statistics still held: the parent's last sample sees them


def run_sampled(target, *args) -> dict:
    """Run a stage in a fresh process; its result plus the peak RSS growth after its inputs were
    opened (sampled every 20 ms)."""
    import psutil

    ctx = mp.get_context("spawn")
    ready, go, out, release = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=target, args=(ready, go, out, release, *args))
    proc.start()
    ready.wait()
    ps = psutil.Process(proc.pid)
    base = peak = ps.memory_info().rss
    go.set()
    result = None
    while result is None:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.NoSuchProcess:
            pass
        try:
            result = out.get(timeout=0.02)
        except Exception:
            if not proc.is_alive():
                raise RuntimeError(f"stage {target.__name__} died") from None
    peak = max(peak, ps.memory_info().rss)  # the stage still holds its result
    release.set()
    proc.join()
    return {**result, "rss_growth": peak - base}


# ---------------------------------------------------------------- the plan


def fmt_bytes(n: float) -> str:
    for unit_name, size in (("PB", 1e15), ("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit_name}"
    return f"{n:.3g} B"


def fmt_hours(h: float) -> str:
    if h >= 24 * 365:
        return f"{h / 24 / 365:.3g} years"
    if h >= 48:
        return f"{h / 24:.3g} days"
    return f"{h:.3g} h"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--rows", type=int, default=32_768, help="gallery rows per tile and per part")
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--cores", type=int, default=64, help="cores per node (of this machine's speed)")
    ap.add_argument("--node-gbps", type=float, default=10.0, help="network / storage read rate per node, Gbit/s")
    args = ap.parse_args()
    d, rows = args.dim, args.rows
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (others' work slows every stage)")
    rng = np.random.default_rng(1)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "g").mkdir()
        (tmp / "b").mkdir()
        np.save(tmp / "g" / "part_0.npy", unit(rng, rows, d, np.float16))  # clip-retrieval writes float16
        for i in range(3):
            np.save(tmp / "b" / f"part_{i}.npy", unit(rng, BANK_PIECE, d, np.float16))
        nnn = run_sampled(stage_tile, NNN, tmp / "g", tmp / "b", rows, 1, tmp / "nnn.npz")
        is_ = run_sampled(stage_tile, IS, tmp / "g", tmp / "b", rows, 1, tmp / "is.npz")
        wide = run_sampled(stage_tile, NNN, tmp / "g", tmp / "b", rows, 3, tmp / "wide.npz")
        part = run_sampled(stage_part, tmp / "g", tmp / "b", rows, tmp / "part.npy")
        merge = run_sampled(stage_merge, 4_000_000, 32_768)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    flops = 2 * rows * BANK_PIECE * d
    # the projection uses CPU time: a cluster's cores are its own, this machine's are shared
    rate = {NNN: flops / nnn["cpu"], IS: flops / is_["cpu"]}
    measured = [
        (
            f"tile {rows:,} x {BANK_PIECE:,} x {d}, NNN k=16, one core: wall / CPU",
            f"{nnn['seconds']:.1f} s / {nnn['cpu']:.1f} s = {rate[NNN] / 1e9:.0f} GFLOP/s per CPU-second",
            "",
        ),
        (
            f"tile {rows:,} x {BANK_PIECE:,} x {d}, IS beta=20, one core: wall / CPU",
            f"{is_['seconds']:.1f} s / {is_['cpu']:.1f} s = {rate[IS] / 1e9:.0f} GFLOP/s per CPU-second",
            "",
        ),
        ("tile task peak RSS growth, 1 bank piece", fmt_bytes(nnn["rss_growth"]), ""),
        ("tile task peak RSS growth, 3 bank pieces (3x wider tile)", fmt_bytes(wide["rss_growth"]), ""),
        ("kept tile, bytes per gallery row (NNN k=16)", f"{nnn['work_bytes'] / rows:.1f}", ""),
        ("kept tile, bytes per gallery row (IS, one beta)", f"{is_['work_bytes'] / rows:.1f}", ""),
        (f"part of {rows:,} rows: time, one core", f"{part['seconds']:.2f} s = {rows / part['seconds']:,.0f} rows/s", ""),
        ("part task peak RSS growth", fmt_bytes(part["rss_growth"]), ""),
        ("part on disk, bytes per item", f"{part['part_bytes'] / rows:.1f}", ""),
        ("driver merge of 4 x 10^6 items (123 tiles): time", f"{merge['seconds']:.2f} s", ""),
        ("driver peak RSS growth per item, merging (result: 64 B/item)", f"{merge['rss_growth'] / 4e6:.1f} B", ""),
    ]
    print_table(measured, full_size=True, size=f"d={d}")

    n = 1e9
    projection = []
    for m in (1e6, 1e7):
        tiles = int(np.ceil(n / 32_768))
        core_h = {k: 2 * n * m * d / r / 3600 for k, r in rate.items()}
        cluster = args.nodes * args.cores
        read_bank = tiles * m * d * 2  # float16 bank, once per tile (a tile spans the whole bank)
        io_h = read_bank / (args.nodes * args.node_gbps / 8 * 1e9) / 3600
        part_h = n / (rows / part["seconds"]) / 3600
        tag = f"10^9 x 10^{int(np.log10(m))} x {d}"
        projection += [
            (f"{tag}: tiles (32,768 rows x whole bank)", f"{tiles:,}", ""),
            (f"{tag}: NNN core-hours / IS core-hours", f"{core_h[NNN]:,.0f} / {core_h[IS]:,.0f}", ""),
            (f"{tag}: NNN wall here (2 cores)", fmt_hours(core_h[NNN] / 2), ""),
            (
                f"{tag}: NNN wall on {args.nodes} nodes x {args.cores} cores",
                fmt_hours(core_h[NNN] / cluster) + f" (IS {fmt_hours(core_h[IS] / cluster)})",
                "",
            ),
            (f"{tag}: bank re-read (float16) / at {args.node_gbps:g} Gbit/s per node", f"{fmt_bytes(read_bank)} / {fmt_hours(io_h)}", ""),
            (f"{tag}: parts stage core-hours / wall on the cluster", f"{part_h:,.0f} / {fmt_hours(part_h / cluster)}", ""),
        ]
    projection += [
        ("10^9: gallery input (float16 .npy)", fmt_bytes(n * d * 2), ""),
        ("10^9: work dir (NNN k=16 tiles)", fmt_bytes(n * nnn["work_bytes"] / rows), ""),
        ("10^9: output parts", fmt_bytes(n * part["part_bytes"] / rows), ""),
        ("10^9: fit_statistics driver RAM, keeping the statistics (write_augmented: none)", fmt_bytes(n * merge["rss_growth"] / 4e6), ""),
    ]
    print_table(projection, full_size=True, size=f"d={d}")


if __name__ == "__main__":
    main()
