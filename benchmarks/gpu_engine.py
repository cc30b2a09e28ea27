"""The device-resident torch engine against the raw torch limit, nnn-retrieval and numpy (issue 39).

    PYTHONPATH=src python benchmarks/gpu_engine.py                       # small sizes (CPU torch: CI)
    PYTHONPATH=src python benchmarks/gpu_engine.py --gallery 100000 --bank 50000 --dim 512 --queries 10000

On a machine with a CUDA GPU it runs on ``cuda`` (``--device`` to choose); without one on CPU torch
at small default sizes, so CI can run it. Random unit vectors, float32. For each piece of work
it times, medians of ``--repeats`` after one warm-up, in one run:

* raw torch: the loop a user would write (upload, GEMM blocks and the reducer on the device,
  results copied back): the device's limit for this work;
* nnn-retrieval 1.0.1 (``import nnn``, its own torch API: NNNRanker with batch 1024 and 128),
  where installed;
* FAISS ``IndexFlatIP`` over the augmented vectors ``[r, -bias(r)]`` / ``[q, alpha]`` (the
  corrected search), where faiss is installed;
* hubless on the device (``device=``) and hubless numpy (the default engine, on the CPU cores;
  one run, no warm-up: the slowest column).

The work: an NNN k=16 fit, a corrected top-10 search of ``--queries`` queries, an IS beta=20
fit (log-sum-exp) and an ``evaluate`` of NNN (fit + ranks of the truth, R@K, hubness counts:
``queries`` = the bank's first ``--queries`` rows, truth = a random gallery item each) against
the raw rank-of-truth loop, and of six methods. Each row prints seconds and ratios; the floors
of issue 39 apply at the sizes above on one GPU. Then the error of float16 / bfloat16
products against float32: the largest bias difference and the top-10 agreement.

Needs only torch, numpy (and hubless's typer, rich, tqdm, threadpoolctl); says which
comparison it skips when nnn-retrieval or faiss is absent. Finishes within 5 minutes at the sizes
above on an H100 (``--skip-numpy`` leaves the slowest rows out).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # nnn-retrieval draws a bar per call

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _table import print_table  # noqa: E402 - benchmarks/_table.py

import hubless  # noqa: E402
from hubless.corrections import make_correction  # noqa: E402
from hubless.engine import use_device  # noqa: E402

FULL = {"gallery": 100_000, "bank": 50_000, "dim": 512, "queries": 10_000}
SMALL = {"gallery": 6_000, "bank": 4_000, "dim": 128, "queries": 1_000}
K, ALPHA, BETA, TOP = 16, 0.75, 20.0, 10
#: Similarities per block of the raw loops (as the engine's budget on a GPU).
RAW_BLOCK = 2**27


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], repeats: int, warm: bool = True) -> tuple[float, object]:
    """Median seconds of ``repeats`` calls after one warm-up, and the last result."""
    out = fn() if warm else None
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


# ---------------------------------------------------------------------- raw torch loops
def raw_rows(torch, n: int, m: int) -> int:
    return max(1, min(n, RAW_BLOCK // max(m, 1)))


def raw_nnn_fit(torch, device, g, b):
    G, B = torch.from_numpy(g).to(device), torch.from_numpy(b).to(device)
    rows, out = raw_rows(torch, len(g), len(b)), []
    with torch.no_grad():
        for i in range(0, len(g), rows):
            out.append(torch.topk(G[i : i + rows] @ B.T, K, dim=1).values.mean(dim=1))
    return torch.cat(out).cpu().numpy()


def raw_is_fit(torch, device, g, b):
    G, B = torch.from_numpy(g).to(device), torch.from_numpy(b).to(device)
    rows, out = raw_rows(torch, len(g), len(b)), []
    with torch.no_grad():
        for i in range(0, len(g), rows):
            out.append(torch.logsumexp(BETA * (G[i : i + rows] @ B.T), dim=1))
    return torch.cat(out).cpu().numpy()


def raw_search(torch, device, G, bias, q):
    """G and the bias already on the device (as a fitted index keeps them); the queries move."""
    Q = torch.from_numpy(q).to(device)
    rows, scores, ids = raw_rows(torch, len(q), G.shape[0]), [], []
    with torch.no_grad():
        for i in range(0, len(q), rows):
            top = torch.topk(Q[i : i + rows] @ G.T - ALPHA * bias, TOP, dim=1)
            scores.append(top.values)
            ids.append(top.indices)
    return torch.cat(scores).cpu().numpy(), torch.cat(ids).cpu().numpy()


def raw_ranks(torch, device, G, bias, q, truth):
    """The baseline rank-of-truth loop: rank = 1 + #(items scoring above the truth)."""
    Q, T = torch.from_numpy(q).to(device), torch.from_numpy(truth).to(device)
    rows, ranks = raw_rows(torch, len(q), G.shape[0]), []
    with torch.no_grad():
        for i in range(0, len(q), rows):
            s = Q[i : i + rows] @ G.T - ALPHA * bias
            target = s.gather(1, T[i : i + rows, None])
            ranks.append((s > target).sum(dim=1) + 1)
    return torch.cat(ranks).cpu().numpy()


# ---------------------------------------------------------------------- the run
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    for name in FULL:
        ap.add_argument(f"--{name}", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--skip-numpy", action="store_true", help="leave hubless numpy out (its rows take longest)")
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    sizes = {name: getattr(args, name) or (FULL if device.startswith("cuda") else SMALL)[name] for name in FULL}
    full = sizes == FULL and device.startswith("cuda")
    card = torch.cuda.get_device_name(device) if device.startswith("cuda") else f"CPU torch, {torch.get_num_threads()} threads"
    print(
        f"gallery {sizes['gallery']:,} x bank {sizes['bank']:,} x d {sizes['dim']}, {sizes['queries']:,} queries, "
        f"on {device} ({card}), torch {torch.__version__}, medians of {args.repeats} after a warm-up, "
        f"{time.strftime('%Y-%m-%d')}"
    )
    rng = np.random.default_rng(0)
    g, b = unit(rng, sizes["gallery"], sizes["dim"]), unit(rng, sizes["bank"], sizes["dim"])
    q = unit(rng, sizes["queries"], sizes["dim"])
    truth = rng.integers(0, len(g), size=len(q))
    try:
        import nnn  # nnn-retrieval
    except ImportError:
        nnn = None
        print("skipped: nnn-retrieval is not installed (pip install nnn-retrieval==1.0.1): no nnn-retrieval column")
    try:
        import faiss
    except ImportError:
        faiss = None
        print("skipped: faiss is not installed: no FAISS IndexFlatIP row for the corrected search")
    rows: list[tuple[str, str, str]] = []

    def row(label: str, seconds: dict[str, float], floor: str = "") -> None:
        raw = seconds.get("raw torch")
        parts = []
        for name, t in seconds.items():
            ratio = f" ({t / raw:.2f}x raw)" if raw and name != "raw torch" else ""
            parts.append(f"{name} {t:.3f} s{ratio}")
        if "nnn-retrieval b1024" in seconds and "hubless device" in seconds:
            parts.append(f"hubless device / nnn-retrieval b1024 = {seconds['hubless device'] / seconds['nnn-retrieval b1024']:.2f}x")
        rows.append((label, "; ".join(parts), floor))
        print(f"{label}: " + "; ".join(parts), flush=True)

    # NNN k=16 fit
    nnn_fit: dict[str, float] = {}
    nnn_fit["raw torch"], raw_means = timed(lambda: raw_nnn_fit(torch, device, g, b), args.repeats)
    fitted = None
    if nnn is not None:
        use_gpu = device.startswith("cuda")
        gpu_id = torch.device(device).index or 0 if use_gpu else -1
        for batch in (1024, 128):

            def fit_nnn(batch=batch):
                return nnn.NNNRanker(
                    nnn.NNNRetriever(g.shape[1], use_gpu=use_gpu, gpu_id=gpu_id), g, b, alternate_ks=K, batch_size=batch,
                    alternate_weight=ALPHA, use_gpu=use_gpu, gpu_id=gpu_id,
                )  # fmt: skip

            nnn_fit[f"nnn-retrieval b{batch}"], ranker = timed(fit_nnn, args.repeats)
            fitted = fitted or ranker
    nnn_fit["hubless device"], corr = timed(lambda: hubless.NNN(alpha=ALPHA, k=K).fit(g, b, device=device, progress=False), args.repeats)
    if not args.skip_numpy:
        nnn_fit["hubless numpy"], numpy_corr = timed(lambda: hubless.NNN(alpha=ALPHA, k=K).fit(g, b, progress=False), 1, warm=False)
    err = float(np.abs(corr.bias_ - raw_means).max())
    row(f"NNN k={K} fit (bias vs raw torch: {err:.1e})", nnn_fit, "hubless device <= 1.0x nnn-retrieval b1024 and <= 1.3x raw")

    # corrected top-10 search
    search: dict[str, float] = {}
    G, bias = torch.from_numpy(g).to(device), torch.from_numpy(corr.bias_).to(device)
    search["raw torch"], (_, raw_ids) = timed(lambda: raw_search(torch, device, G, bias, q), args.repeats)
    if fitted is not None:
        search["nnn-retrieval b1024"], _ = timed(lambda: fitted.search(q, TOP), args.repeats)
    if faiss is not None:
        index = faiss.IndexFlatIP(g.shape[1] + 1)
        index.add(np.ascontiguousarray(np.hstack([g, -corr.bias_[:, None]])))
        aug = np.ascontiguousarray(np.hstack([q, np.full((len(q), 1), ALPHA, np.float32)]))
        search["faiss IndexFlatIP (host)"], _ = timed(lambda: index.search(aug, TOP), args.repeats)
    search["hubless device"], (_, ids) = timed(lambda: corr.search(q, TOP, device=device), args.repeats)
    if not args.skip_numpy:
        search["hubless numpy"], _ = timed(lambda: numpy_corr.search(q, TOP), 1, warm=False)
    agree = float(np.mean(ids == raw_ids))
    row(
        f"corrected top-{TOP} search of {len(q):,} queries (ids = raw torch's: {agree:.4f})", search, "hubless device <= 1.0x nnn-retrieval"
    )

    # IS beta=20 fit
    is_fit: dict[str, float] = {}
    is_fit["raw torch"], raw_lse = timed(lambda: raw_is_fit(torch, device, g, b), args.repeats)
    is_fit["hubless device"], is_corr = timed(
        lambda: make_correction(f"is:beta={BETA}").fit(g, b, device=device, progress=False), args.repeats
    )
    if not args.skip_numpy:
        is_fit["hubless numpy"], _ = timed(lambda: make_correction(f"is:beta={BETA}").fit(g, b, progress=False), 1, warm=False)
    lse = is_corr.statistics_.query_lse[BETA]
    row(f"IS beta={BETA:g} fit (log-sum-exp vs raw torch: {np.abs(lse - raw_lse).max():.1e})", is_fit, "hubless device <= 1.5x raw")

    # evaluate
    queries, bank = q, b
    ev: dict[str, float] = {}
    ev["raw torch"], _ = timed(lambda: raw_ranks(torch, device, G, bias, queries, truth), args.repeats)
    six = ["nnn", "csls", "dn", "is", "dis", "dualis"]
    gb = unit(rng, max(1, len(b) // 2), sizes["dim"])  # DualIS's gallery bank

    def evaluate(methods, device_):
        with use_device(device_):
            return hubless.evaluate(g, queries, truth, bank, methods, gallery_bank=gb, bootstrap=0, progress=False)

    ev["hubless device, NNN"], _ = timed(lambda: evaluate(["nnn"], device), args.repeats)
    ev["hubless device, six methods"], _ = timed(lambda: evaluate(six, device), args.repeats)
    if not args.skip_numpy:
        ev["hubless numpy, NNN"], _ = timed(lambda: evaluate(["nnn"], "numpy"), 1, warm=False)
    row(
        f"evaluate ({len(queries):,} queries; six = {', '.join(six)})",
        ev,
        "device NNN <= 4x raw; six methods <= 2x NNN alone",
    )

    # half precision
    for dtype in ("float16", "bfloat16"):
        with use_device(device, dtype):
            half = hubless.NNN(alpha=ALPHA, k=K).fit(g, b, progress=False)
            t, (_, half_ids) = timed(lambda half=half: half.search(q, TOP), 1)
        overlap = np.mean([len(set(x) & set(y)) / TOP for x, y in zip(half_ids, ids)])
        rows.append(
            (
                f"{dtype} products: NNN fit + search",
                f"max abs(bias - float32 bias) {np.abs(half.bias_ - corr.bias_).max():.1e}; top-{TOP} agreement {overlap:.4f}",
                "",
            )
        )
    print_table(rows, full_size=full, size="gallery 100k x bank 50k x 512, 10k queries, on one GPU")


if __name__ == "__main__":
    main()
