"""Where the device waits in ``evaluate`` (issue 39): its idle gaps, charged to the host code.

    PYTHONPATH=src python benchmarks/gpu_trace.py [--queries 50000] [--dim 512] [--methods nnn,csls,dn,is,dis,dualis]

Runs ``evaluate`` of the given methods and of NNN alone, eager and with the compiled ranking
pass (``HUBLESS_COMPILE``), each twice to warm up and once timed without the profiler, then once
under ``torch.profiler`` with Python stacks. From each trace: the wall time, the device's busy
time, its idle gaps longer than 50 us, and for each gap the innermost hubless function the host
was running when it began (and the torch operator), summed; the host work before the first and
after the last kernel. As many queries, gallery items and bank items as ``--queries`` (random
unit vectors; the gallery bank half as many). The Python tracing slows Python code, so the host
parts read larger than they are: compare the gaps with each other, and the walls without it.

Made for a machine with a CUDA GPU. On a CPU it runs at small sizes with a few host operators
(products, top-k, compares) standing in for the device's kernels: a check that it works, not a
measurement.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

import hubless
from hubless.engine import use_device

#: Host operators that stand in for kernels when there is no device (a check of this script).
STAND_INS = ("aten::mm", "aten::topk", "aten::gt")


def device_intervals(events: list[dict]) -> list[tuple[float, float]]:
    """(start, end) microseconds of every kernel, copy and memset, sorted."""
    spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not spans:
        spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in events if e.get("cat") == "cpu_op" and e["name"] in STAND_INS]
    return sorted(spans)


def gaps_of(spans: list[tuple[float, float]], shortest: float = 50.0) -> tuple[float, list[tuple[float, float]], float, float]:
    """(busy microseconds, idle gaps longer than ``shortest``, first start, last end)."""
    busy, gaps, end = 0.0, [], spans[0][0]
    for start, stop in spans:
        if start > end + shortest:
            gaps.append((end, start))
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return busy, gaps, spans[0][0], end


def innermost(events: list[dict], t: float, keep=lambda e: True) -> dict | None:
    """The latest-starting event of ``events`` running at ``t`` that ``keep`` accepts."""
    running = [e for e in events if e["ts"] <= t <= e["ts"] + e.get("dur", 0) and keep(e)]
    return max(running, key=lambda e: e["ts"]) if running else None


def report(path: str, label: str, wall: float) -> None:
    events = json.load(open(path, encoding="utf-8"))["traceEvents"]
    spans = device_intervals(events)
    if not spans:
        print(f"{label}: no device events")
        return
    busy, gaps, first, last = gaps_of(spans)
    python = [e for e in events if e.get("cat") == "python_function"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    host = [e for e in python + ops if "dur" in e]
    idle = sum(b - a for a, b in gaps)
    print(f"\n== {label}: wall {wall * 1e3:.0f} ms (no profiler); device busy {busy / 1e3:.0f} ms, "
          f"idle gaps over 50 us {idle / 1e3:.0f} ms in {len(gaps)}")  # fmt: skip
    h0, h1 = min(e["ts"] for e in host), max(e["ts"] + e["dur"] for e in host)
    for name, (a, z) in (("before the first kernel", (h0, first)), ("after the last kernel", (last, h1))):
        inside = sorted(
            (e for e in python if e["ts"] >= a and e["ts"] + e.get("dur", 0) <= z and "hubless" in e["name"]),
            key=lambda e: -e.get("dur", 0),
        )
        print(f"-- host {name}: {(z - a) / 1e3:.1f} ms; its longest hubless calls:")
        for e in inside[:6]:
            print(f"{e['dur'] / 1e3:8.1f}  {e['name'].split('/')[-1]}")
    by_function, by_operator = collections.Counter(), collections.Counter()
    for a, b in gaps:
        function = innermost(python, a + 1, lambda e: "hubless" in e["name"])
        operator = innermost(ops, a + 1)
        by_function[function["name"].split("/")[-1] if function else "(no hubless frame)"] += (b - a) / 1e3
        by_operator[operator["name"] if operator else "(between operators)"] += (b - a) / 1e3
    print("-- idle ms by the hubless function running when the gap began")
    for name, ms in by_function.most_common(15):
        print(f"{ms:8.1f}  {name}")
    print("-- idle ms by the torch operator running when the gap began")
    for name, ms in by_operator.most_common(8):
        print(f"{ms:8.1f}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=None, help="queries = gallery = bank items (50,000 on a GPU, 3,000 on a CPU)")
    ap.add_argument("--dim", type=int, default=None)
    ap.add_argument("--methods", default="nnn,csls,dn,is,dis,dualis")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = args.queries or (50_000 if device == "cuda" else 3_000)
    d = args.dim or (512 if device == "cuda" else 32)
    rng = np.random.default_rng(0)

    def unit(m: int) -> np.ndarray:
        x = rng.standard_normal((m, d), dtype=np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    gallery, bank, queries, gallery_bank = unit(n), unit(n), unit(n), unit(max(1, n // 2))
    truth = rng.integers(0, n, n)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    print(f"evaluate of {n:,} queries x {n:,} gallery x {n:,} bank, d {d}, on {device}, torch {torch.__version__}")
    for methods in (args.methods.split(","), ["nnn"]):
        for compiled in (False, True):

            def run(methods=methods, compiled=compiled):
                with use_device(device, compiled=compiled):
                    hubless.evaluate(gallery, queries, truth, bank, methods, gallery_bank=gallery_bank, bootstrap=0, progress=False)
                sync()

            run()
            run()
            t0 = time.perf_counter()
            run()
            wall = time.perf_counter() - t0
            with profile(activities=activities, with_stack=True) as traced:
                run()
            with tempfile.TemporaryDirectory() as folder:
                path = os.path.join(folder, "trace.json")
                traced.export_chrome_trace(path)
                report(path, f"{'+'.join(methods)}, {'compiled' if compiled else 'eager'}", wall)


if __name__ == "__main__":
    main()
