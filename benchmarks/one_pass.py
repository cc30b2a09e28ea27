"""One pass per bank: what fitting many corrections at once costs. Ratios from one run.

    python benchmarks/one_pass.py               # gallery 20k x bank 40k x d 256, 2,000 queries
    python benchmarks/one_pass.py --scale 0.25

Measures, on the same seeded arrays (median of interleaved repeats):

* ``hubless.evaluate`` with six methods (NNN at k = 16 and 64, CSLS, DN, IS at beta = 20 and 50)
  over ``hubless.evaluate`` with NNN alone: every method is fitted from one streamed pass per bank
  (``fit_shared``), so six cost little more than one. Floor (issue 28): <= 1.6x.
* the same six methods fitted one by one (``fit`` each, what evaluate did before) over NNN
  alone: what the shared pass saves;
* an IS fit over an NNN fit on the same arrays (the log-sum-exp reducer against the top-k
  one). Floor: <= 1.3x. Also IS at beta = 1 (the expm1 form) and two betas in one pass;
* ``evaluate(coverage=True)`` over ``evaluate`` (the bank's coverage from the fitting pass's own
  blocks) and over the same plus a separate ``bank_report`` pass (what the CLI did before);
* finding the exact duplicate rows of the gallery and the bank (``find_duplicates``, one pass over
  each: every copy then scores as its first copy) over ``evaluate`` with six methods, which does
  it: negligible next to the products.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _table import print_table  # benchmarks/_table.py (run as python benchmarks/...)

import hubless
from hubless.banks import bank_report
from hubless.engine.duplicates import find_duplicates

SIX = ["nnn:alpha=0.75,k=16", "nnn:alpha=0.75,k=64", "csls:k=10", "dn:lam=0.5", "is:beta=20.0", "is:beta=50.0"]
FULL = (20_000, 40_000, 256, 2_000)


def data(n_gallery: int, n_bank: int, dim: int, n_queries: int, seed: int = 0):
    """Clustered unit vectors (hubs appear, as in real embeddings) and one relevant item per query."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((64, dim), dtype=np.float32)

    def draw(n: int) -> np.ndarray:
        x = centres[rng.integers(0, 64, n)] + 1.5 * rng.standard_normal((n, dim), dtype=np.float32)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    gallery, bank = draw(n_gallery), draw(n_bank)
    truth = rng.integers(0, n_gallery, n_queries)
    queries = gallery[truth] + 0.8 * draw(n_queries)
    return gallery, bank, queries / np.linalg.norm(queries, axis=1, keepdims=True), truth


def timed(fn) -> tuple[float, float]:
    """(wall, CPU) seconds of ``fn()``: CPU time (all threads) is the steadier measure on a
    machine other jobs share; wall time is what a user waits."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="Multiply the gallery, bank and query counts.")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    n_gallery, n_bank, n_queries = (max(64, int(n * args.scale)) for n in (FULL[0], FULL[1], FULL[3]))
    size = f"gallery {n_gallery:,} x bank {n_bank:,} x d {FULL[2]}, {n_queries:,} queries"
    print(f"one_pass: {size}, {args.repeats} repeats (medians)")
    g, b, q, truth = data(n_gallery, n_bank, FULL[2], n_queries)

    def evaluate(methods, **kw):
        return hubless.evaluate(g, q, truth, b, methods, bootstrap=0, progress=False, **kw)

    def one_by_one():
        for spec in SIX:
            hubless.make_correction(spec).fit(g, b, progress=False)

    def fit(spec):
        return lambda: hubless.make_correction(spec).fit(g, b, progress=False)

    cases = {
        "evaluate nnn": lambda: evaluate(["nnn:alpha=0.75,k=16"]),
        "evaluate six": lambda: evaluate(SIX),
        "evaluate six + coverage": lambda: evaluate(SIX, coverage=True),
        "evaluate six + bank_report": lambda: (evaluate(SIX), bank_report(g, b)),
        "fit six one by one": one_by_one,
        "fit nnn": fit("nnn:alpha=0.75,k=16"),
        "fit is": fit("is:beta=20.0"),
        "fit is beta=1": fit("is:beta=1.0"),
        "fit six shared": lambda: hubless.fit_many(SIX, g, b, progress=False),
        "find duplicates": lambda: (find_duplicates(g), find_duplicates(b)),
    }
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    for _ in range(args.repeats):  # interleaved, so a slow spell of a shared machine hits every case
        for name, fn in cases.items():
            times[name].append(timed(fn))
    wall = {name: statistics.median(w for w, _ in v) for name, v in times.items()}
    cpu = {name: statistics.median(c for _, c in v) for name, v in times.items()}
    for name in cases:
        print(f"  {name:28s} wall {wall[name]:7.2f} s   CPU {cpu[name]:7.2f} s")
    full = (n_gallery, n_bank, n_queries) == (FULL[0], FULL[1], FULL[3])

    def ratio(a: str, b: str, digits: int = 2) -> str:
        return f"{wall[a] / wall[b]:.{digits}f}x wall, {cpu[a] / cpu[b]:.{digits}f}x CPU"

    rows = [
        ("evaluate six methods / evaluate NNN alone", ratio("evaluate six", "evaluate nnn"), "<= 1.6x"),
        ("fit six one by one / fit six in one pass", ratio("fit six one by one", "fit six shared"), ""),
        ("fit six in one pass / fit NNN", ratio("fit six shared", "fit nnn"), ""),
        ("IS fit (beta 20, exp form) / NNN fit", ratio("fit is", "fit nnn"), "<= 1.3x"),
        ("IS fit (beta 1, expm1 form) / NNN fit", ratio("fit is beta=1", "fit nnn"), ""),
        ("evaluate six + coverage / evaluate six", ratio("evaluate six + coverage", "evaluate six"), ""),
        ("evaluate six + separate bank_report / + coverage", ratio("evaluate six + bank_report", "evaluate six + coverage"), ""),
        ("finding the gallery's and the bank's duplicates / evaluate six", ratio("find duplicates", "evaluate six", 4), ""),
    ]
    print_table(rows, full_size=full, size=f"gallery {FULL[0]:,} x bank {FULL[1]:,} x d {FULL[2]}, {FULL[3]:,} queries")


if __name__ == "__main__":
    main()
