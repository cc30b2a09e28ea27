"""The device ranking pass's work per method and block: eager passes, the chunked top-k, compiled.

    .venv/bin/python benchmarks/ranking_pass.py [--queries 2684] [--gallery 50000] [--dim 32]

One block of query rows over the whole gallery (the ranking pass of ``evaluate`` / ``tune`` on a
torch device, :mod:`hubless.engine.torch_ranking`), ranked with the baseline and then with four
NNN-style rankings (one bias row): the difference, per ranking, is what a method adds to an
evaluation once the block's product is made (the subtraction, the counts of scores above and
equal to each relevant item's, the top-10 ids for the hubness counts). Three ways, medians of
``--repeats`` in one run: eager kernels with ``torch.topk`` over whole rows (the engine before the
chunked top-k), eager kernels with the top-k through chunk maxima (the default), and the kernels
``torch.compile`` makes of the same work (``HUBLESS_COMPILE=1``, where the baseline and the
one-row rankings are counted together, one read of the block for all; the first call, which
compiles, timed apart). Then ``ordered_topk`` against ``torch.topk`` on one block. A small ``--dim`` keeps
the product cheap so the ranking work shows; CPU torch here, ``--device cuda`` on a GPU.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from hubless.engine import torch_arrays, torch_reducers, use_device
from hubless.engine.torch_ranking import rank_queries
from hubless.engine.torch_reducers import ordered_topk

WHOLE_ROWS = (1 << 30, 1 << 30)  # chunk widths no block reaches: torch.topk over whole rows


def median_seconds(fn, repeats: int, sync) -> float:
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=2684, help="rows of the block (2,684: a 2^27-entry block at 50,000 items)")
    ap.add_argument("--gallery", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    n, m, device = args.queries, args.gallery, args.device
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((n, args.dim), dtype=np.float32)
    g = rng.standard_normal((m, args.dim), dtype=np.float32)
    truth, indptr = rng.integers(0, m, n), np.arange(n + 1)
    bias = (0.1 * rng.standard_normal((m, 1))).astype(np.float32)
    baseline, nnn = (np.zeros((n, 1), np.float32), bias), (np.full((n, 1), 0.75, np.float32), bias)
    torch_arrays.BLOCK_SHAPE = (n, m)  # one block: the pass's work on it, nothing else

    def ranking_pass(methods: int, compiled: bool, chunks: tuple[int, int]):
        torch_reducers.CHUNK_WIDTHS = chunks
        with use_device(device, compiled=compiled):
            rank_queries(
                q, g, [baseline] + [nnn] * methods, np.arange(n), indptr, truth, ties="index", depth=10, device=device, dtype="float32"
            )

    print(f"one block of {n:,} queries x {m:,} gallery items (d {args.dim}), {device}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats}")  # fmt: skip
    t0 = time.perf_counter()
    ranking_pass(1, True, (32, 256))
    print(f"compiled: the first call (compiles, or loads torch's cached kernels) took {time.perf_counter() - t0:.1f} s")
    per_method = {}
    for name, compiled, chunks in (
        ("eager, torch.topk over whole rows", False, WHOLE_ROWS),
        ("eager, top-k through chunk maxima", False, (32, 256)),
        ("compiled (HUBLESS_COMPILE=1)", True, (32, 256)),
    ):
        ranking_pass(1, compiled, chunks)  # warm-up
        five = median_seconds(lambda c=compiled, w=chunks: ranking_pass(4, c, w), args.repeats, sync)
        one = median_seconds(lambda c=compiled, w=chunks: ranking_pass(0, c, w), args.repeats, sync)
        per_method[name] = (five - one) / 4
    first = next(iter(per_method.values()))
    print("| ranking work per method and block | ms | vs whole-row top-k |\n|---|---|---|")
    for name, seconds in per_method.items():
        print(f"| {name} | {seconds * 1e3:.0f} | {seconds / first:.2f}x |")

    block = torch.from_numpy(rng.standard_normal((n, m), dtype=np.float32)).to(device)
    torch_reducers.CHUNK_WIDTHS = (32, 256)
    chunked = median_seconds(lambda: ordered_topk(block, 10), args.repeats, sync)
    whole = median_seconds(lambda: torch.topk(block, 10, dim=1), args.repeats, sync)
    print(f"top-10 of each row of that block: ordered_topk (chunk maxima, ties to the lower id) {chunked * 1e3:.0f} ms, "
          f"torch.topk {whole * 1e3:.0f} ms: {chunked / whole:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
