"""How much memory the driver of a distributed job needs, at two gallery sizes (sampled RSS).

    .venv/bin/python benchmarks/driver_memory.py                  # 80k and 160k x 256, ~5 min on 2 cores
    .venv/bin/python benchmarks/driver_memory.py --sizes 20000 40000

Each job runs in a fresh driver process with a local Ray (2 CPUs) started, and its first use
(four no-op tasks: Ray pages in its code and buffers once per driver, ~30-50 MB here, whatever
the job) done, before the baseline is taken; the parent samples the driver's RSS every 20 ms
(not ru_maxrss, which would count Ray's start-up) and reports its peak growth, as a multiple
of the gallery's bytes (n x d x 4) and per item. A driver that holds no gallery stays flat as n grows: its growth per item is the
bytes it keeps per item (statistics), and its ratio to the gallery's bytes is constant and small.

* ``build_index`` (Flat; IVF256,Flat) with ``out=``: fits on Ray, the tasks write the index
  directory (rows, biases, statistics, inverted lists), the driver writes ``index.faiss`` by
  streaming the tasks' lists and commits; the index it returns is memory-mapped;
* ``write_augmented`` (NNN k=16): tiles on Ray, the driver keeps only the merged statistics.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table import print_table  # noqa: E402

METHOD = "nnn:alpha=0.75,k=16"


def unit(rng, n, d):
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def driver(ready, go, out, job, gallery_dir, bank_dir, work):
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    import hubless.distributed as hd
    from hubless.storage.sources import open_source

    open_source(gallery_dir), open_source(bank_dir)  # imports and headers before the baseline
    import faiss  # noqa: F401  (code, not data: what the jobs import is loaded before the baseline too)

    import hubless.index.disk  # noqa: F401
    import hubless.index.index  # noqa: F401

    @ray.remote
    def noop(x):
        return x

    # Ray's own first use (a task submitted, an object put and fetched) pages in its code and
    # buffers once per driver, whatever the job (~30-50 MB here): done before the baseline
    ray.get([noop.remote(ray.put(np.zeros(10))) for _ in range(4)])
    ready.set()
    go.wait()
    if job == "write_augmented":
        hd.write_augmented(METHOD, gallery_dir, bank_dir, out=Path(work) / "out", progress=False)
    else:
        factory = job.split(":", 1)[1]
        index = hd.build_index(METHOD, gallery_dir, bank_dir, factory, out=Path(work) / "index", progress=False)
        assert index.ntotal > 0
    out.put("done")
    ray.shutdown()


def run(job: str, gallery_dir: Path, bank_dir: Path, work: Path) -> int:
    import psutil

    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=driver, args=(ready, go, out, job, gallery_dir, bank_dir, work))
    proc.start()
    ready.wait()
    ps = psutil.Process(proc.pid)
    base = peak = ps.memory_info().rss
    go.set()
    done = False
    while not done:
        try:
            peak = max(peak, ps.memory_info().rss)
        except psutil.NoSuchProcess:
            break
        try:
            done = out.get(timeout=0.02) == "done"
        except Exception:
            if not proc.is_alive():
                raise RuntimeError(f"{job} died") from None
    proc.join()
    return peak - base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs=2, default=[80_000, 160_000])
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--bank", type=int, default=50_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    growth = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        bank = tmp / "bank"
        bank.mkdir()
        np.save(bank / "part_0.npy", unit(rng, args.bank, args.dim))
        for n in args.sizes:
            gallery = tmp / f"gallery_{n}"
            gallery.mkdir()
            for i, piece in enumerate(np.array_split(unit(rng, n, args.dim), 4)):
                np.save(gallery / f"part_{i}.npy", piece)
            for job in ("build_index:Flat", "build_index:IVF256,Flat", "write_augmented"):
                work = tmp / f"work_{n}_{job.replace(':', '_').replace(',', '_')}"
                work.mkdir()
                g = run(job, gallery, bank, work)
                growth[(job, n)] = g
                gallery_bytes = n * args.dim * 4
                rows.append(
                    (f"{job}, {n:,} x {args.dim}", f"+{g / 1e6:,.0f} MB = {g / gallery_bytes:.2f}x the gallery, {g / n:,.0f} B/item", "")
                )
    a, b = args.sizes
    for job in ("build_index:Flat", "build_index:IVF256,Flat", "write_augmented"):
        slope = (growth[(job, b)] - growth[(job, a)]) / (b - a)
        rows.append(
            (f"{job}: growth per added item ({a:,} -> {b:,})", f"{slope:,.0f} B/item ({slope / (args.dim * 4):.2f}x an item's bytes)", "")
        )
    full = args.sizes == [80_000, 160_000] and args.dim == 256
    for i, job in ((3, "Flat"), (4, "IVF256,Flat")):  # the rows of the larger size
        ratio = rows[i][1].split("= ")[1].split(",")[0]
        rows.append((f"build_index ({job}) at 160,000 x 256: peak growth / gallery bytes", ratio, "<= 0.2x (issue 33)"))
    print_table(rows, full_size=full, size="80k and 160k x 256")


if __name__ == "__main__":
    main()
