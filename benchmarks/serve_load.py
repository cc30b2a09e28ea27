"""Load test of ``hubless serve`` on loopback: single-query ``POST /search`` requests at
concurrency 1, 8 and 32 against a Flat and an IVF index, next to the same queries searched in
process, in one run. Bounded: a fixed number of requests per level and a time limit; the server
is started and stopped here.

    pip install -e ".[serve]"
    python benchmarks/serve_load.py              # 100k x 512, about 2 minutes on 2 cores
    python benchmarks/serve_load.py --n-items 20000

Floors (issues 18 and 29, at the default size): 0 errors; on the IVF index, the HTTP overhead
(p50 at concurrency 1 minus the in-process Index.search median) <= 1 ms for base64 or binary
float32 queries (and <= 5 ms for JSON lists of floats, which cost their parsing); compare's
uncorrected side (Index.search_uncorrected, the weight-0 query on the same IVF structure) <=
1.3x a corrected search; throughput at concurrency 32 >= 4x throughput at concurrency 1 on
the Flat index (concurrent single queries are batched into one search by the server).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from _table import print_table  # benchmarks/_table.py (run as python benchmarks/...)

import hubless

LEVELS = (1, 8, 32)


def unit_rows(rng, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _client_process(port: int, bodies: list, threads: int, deadline: float, out, path="/search", ctype="application/json") -> None:
    """One load-generating process: ``threads`` keep-alive clients sharing ``bodies``."""
    latencies, errors, lock, next_i = [], [0], threading.Lock(), [0]

    def client():
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        while True:
            with lock:
                i = next_i[0]
                next_i[0] += 1
            if i >= len(bodies) or time.time() > deadline:
                break
            t0 = time.perf_counter()
            try:
                conn.request("POST", path, bodies[i], {"content-type": ctype})
                response = conn.getresponse()
                response.read()
                ok = response.status == 200
            except OSError:
                ok = False
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            with lock:
                latencies.append((time.perf_counter() - t0) * 1000)
                errors[0] += not ok
        conn.close()

    workers = [threading.Thread(target=client) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    out.put((latencies, errors[0]))


def load(port: int, name: str, queries: np.ndarray, concurrency: int, n_requests: int, limit_s: float, kind: str = "json"):
    """``n_requests`` single-query searches from ``concurrency`` keep-alive clients, spread over
    up to 4 client processes (so the load generator's own GIL does not cap the rate): (QPS,
    latencies in ms, errors)."""
    import multiprocessing as mp

    rows = [queries[i % len(queries)] for i in range(n_requests)]
    path, ctype = "/search", "application/json"
    if kind == "json":
        bodies = [json.dumps({"index": name, "embeddings": [r.tolist()], "top_k": 10}) for r in rows]
    elif kind == "base64":
        bodies = [
            json.dumps({"index": name, "embeddings_b64": base64.b64encode(r.astype("<f4").tobytes()).decode(), "top_k": 10}) for r in rows
        ]
    else:  # raw float32 body
        bodies, path, ctype = [r.astype("<f4").tobytes() for r in rows], f"/search/binary?index={name}&top_k=10", "application/octet-stream"
    n_proc = min(4, concurrency)
    per = [concurrency // n_proc + (i < concurrency % n_proc) for i in range(n_proc)]
    chunks = np.array_split(np.arange(n_requests), n_proc)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    deadline = time.time() + limit_s
    procs = [
        ctx.Process(target=_client_process, args=(port, [bodies[i] for i in chunk], t, deadline, out, path, ctype))
        for chunk, t in zip(chunks, per)
    ]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    latencies = [x for lat, _ in results for x in lat]
    return len(latencies) / wall, latencies, sum(e for _, e in results)


def interleaved_overhead(port: int, name: str, index, queries: np.ndarray, kind: str, n: int = 300) -> float:
    """Median over ``n`` queries of (HTTP time - in-process time) measured pairwise: each query
    is searched in process and then over one keep-alive connection, one right after the other,
    so a machine whose load drifts affects both sides alike (ms)."""
    import faiss

    faiss.omp_set_num_threads(1)  # as the server does for single queries: no spinning team beside it
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    diffs = []
    for i in range(n):
        q = queries[i % len(queries)]
        if kind == "json":
            body, path, ctype = json.dumps({"index": name, "embeddings": [q.tolist()], "top_k": 10}), "/search", "application/json"
        elif kind == "base64":
            body = json.dumps({"index": name, "embeddings_b64": base64.b64encode(q.astype("<f4").tobytes()).decode(), "top_k": 10})
            path, ctype = "/search", "application/json"
        else:
            body, path, ctype = q.astype("<f4").tobytes(), f"/search/binary?index={name}&top_k=10", "application/octet-stream"
        t0 = time.perf_counter()
        index.search(q[None], 10)
        t1 = time.perf_counter()
        conn.request("POST", path, body, {"content-type": ctype})
        response = conn.getresponse()
        response.read()
        t2 = time.perf_counter()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
        diffs.append(((t2 - t1) - (t1 - t0)) * 1000)
    conn.close()
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    return statistics.median(diffs[30:])


def _median_ms(fn, n: int = 300) -> float:
    """Median of ``n`` calls ``fn(i)`` in milliseconds (the first 30 are warm-up)."""
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i % 500)
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times[30:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n-items", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--requests", type=int, default=30, help="requests per client thread at each level")
    parser.add_argument("--seconds", type=float, default=60.0, help="time limit per level")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    gallery, bank, queries = unit_rows(rng, args.n_items, args.dim), unit_rows(rng, 10_000, args.dim), unit_rows(rng, 500, args.dim)
    nlist = int(2 ** round(np.log2(4 * np.sqrt(args.n_items))))
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"flat": Path(tmp) / "flat", "ivf": Path(tmp) / "ivf"}
        for name, factory in (("flat", "Flat"), ("ivf", f"IVF{nlist},Flat")):
            hubless.Index.build(gallery, bank, "nnn:alpha=0.75,k=16", factory, nprobe=16).save(paths[name])
        port = free_port()
        server = subprocess.Popen([sys.executable, "-m", "hubless", "serve", *(f"{n}={p}" for n, p in paths.items()), "--port", str(port),
                                   "--rate-limit", "0"],  # one client at thousands of requests a second
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        try:
            for _ in range(600):
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                    conn.request("GET", "/health")
                    conn.getresponse().read()
                    break
                except OSError:
                    time.sleep(0.1)
            rows, results = [], {}
            print(f"hubless serve on loopback: {args.n_items:,} x {args.dim} items, NNN, single-query POST /search, top 10\n")
            print("| index | concurrency | queries as | QPS | p50 ms | p99 ms | errors | in-process ms |")
            print("|---|---|---|---|---|---|---|---|")
            for name, path in paths.items():
                index = hubless.Index.load(path)
                t_in = _median_ms(lambda i, index=index: index.search(queries[i : i + 1], 10))
                t_raw = _median_ms(lambda i, index=index: index.search_uncorrected(queries[i : i + 1], 10))
                for level in LEVELS:
                    qps, lat, errors = load(port, name, queries, level, args.requests * level, args.seconds)
                    p50, p99 = np.percentile(lat, 50), np.percentile(lat, 99)
                    results[(name, level)] = (qps, p50, errors)
                    print(f"| {name} | {level} | json | {qps:.0f} | {p50:.2f} | {p99:.2f} | {errors} | {t_in:.2f} |")
                for kind in ("base64", "binary"):
                    qps, lat, errors = load(port, name, queries, 1, args.requests * 4, args.seconds, kind)
                    results[(name, kind)] = (qps, np.percentile(lat, 50), errors)
                    print(
                        f"| {name} | 1 | {kind} | {qps:.0f} | {np.percentile(lat, 50):.2f} | {np.percentile(lat, 99):.2f} | {errors} | {t_in:.2f} |"
                    )
                errors = sum(results[k][2] for k in results if k[0] == name)
                rows.append((f"{name}: errors at every level", str(errors), "0"))
                rows.append((f"{name}: JSON p50 at concurrency 1 - in-process (ms)", f"{results[(name, 1)][1] - t_in:+.2f}", "<= +5"))
                if name == "ivf":
                    for kind in ("json", "base64", "binary"):
                        overhead = interleaved_overhead(port, name, index, queries, kind)
                        floor = "<= +5" if kind == "json" else "<= +1"
                        rows.append(
                            (f"ivf: HTTP overhead, {kind} queries (median of paired HTTP - in-process, ms)", f"{overhead:+.2f}", floor)
                        )
                    rows.append(("ivf: uncorrected side / corrected search (compare)", f"{t_raw / t_in:.2f}x", "<= 1.3x"))
            print_table(rows, full_size=(args.n_items, args.dim) == (100_000, 512), size="100k x 512")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
