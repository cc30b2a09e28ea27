"""The device-resident torch engine against the raw torch limit, nnn-retrieval and numpy (issue 39).

    PYTHONPATH=src python benchmarks/gpu_engine.py                       # small sizes (CPU torch: CI)
    PYTHONPATH=src python benchmarks/gpu_engine.py --quick               # a smoke run of every row
    PYTHONPATH=src python benchmarks/gpu_engine.py --gallery 100000 --bank 50000 --dim 512 --queries 10000 \
        --out docs/benchmarks/gpu_engine.md

On a machine with a CUDA GPU it runs on ``cuda`` (``--device`` to choose); without one on CPU torch
at small default sizes, so CI can run it. Random unit vectors, float32. For each piece of work
it times, medians of ``--repeats`` after one warm-up, in one run (``torch.cuda.synchronize``
before each clock starts and stops):

* raw torch: the loop a user would write (upload, GEMM blocks and the reducer on the device,
  results copied back): the device's limit for this work;
* nnn-retrieval 1.0.1 (``import nnn``, its own torch API: NNNRanker with batch 1024 and 128),
  where installed;
* FAISS ``IndexFlatIP`` over the augmented vectors ``[r, -bias(r)]`` / ``[q, alpha]`` (the
  corrected search), where faiss is installed;
* hubless on the device (``device=``) and hubless numpy (the default engine, on the CPU cores;
  one run, no warm-up: the slowest column).

The work: an NNN k=16 fit, a corrected top-10 search of ``--queries`` queries, an IS beta=20
fit (log-sum-exp) and an ``evaluate`` of NNN (fit + ranks of the truth, R@K, hubness counts)
against the raw rank-of-truth loop, and of six methods, with eager kernels (also with the index
ties' equal counts the other way than the device's default: running sums or a second look at
the rows with ties) and with the ranking pass compiled (``HUBLESS_COMPILE``; the first call,
which compiles, timed apart), at issue 39's evaluation shape: as many
queries and gallery items as bank items (50,000 each at the sizes above; random queries, truth
= a random gallery item each, the gallery the first ``--bank`` items); and the NNN fit through
the code paths a GPU run takes only at other sizes (a bank streamed from pinned host memory,
forced; the rows split between two devices, two threads on one GPU where there is one) against
the one-device fit. Each row prints seconds and ratios, and each floor of issue 39 its measured
ratio and whether it is met (the floors apply at the sizes above on one
GPU). Then the error of float16 / bfloat16 products against float32: the largest bias
difference and the top-10 agreement.

Made for one unattended run: every comparison runs in its own ``try`` and a failure is written
into its cell (``failed: <ExceptionType: message>``, the traceback on stderr) instead of ending
the run; once ``--budget`` seconds have passed the comparisons not started yet are marked
skipped, so the table always comes out. The header names the card, torch and CUDA versions and
the date; ``--out FILE`` writes the header and table as Markdown (for ``docs/benchmarks``).

Needs only torch, numpy (and hubless's typer, rich, tqdm, threadpoolctl); says which
comparison it skips when nnn-retrieval or faiss is absent. Meant to finish within 5 minutes at
the sizes above on an H100 (``--skip-numpy`` leaves the slowest rows out).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TQDM_DISABLE", "1")  # nnn-retrieval draws a bar per call

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _table import table_lines  # noqa: E402 - benchmarks/_table.py

import hubless  # noqa: E402
from hubless.corrections import make_correction  # noqa: E402
from hubless.engine import torch_arrays, torch_ranking, torch_reducers, use_device  # noqa: E402
from hubless.engine.device import tf32_enabled  # noqa: E402

FULL = {"gallery": 100_000, "bank": 50_000, "dim": 512, "queries": 10_000}
SMALL = {"gallery": 6_000, "bank": 4_000, "dim": 128, "queries": 1_000}
QUICK = {"gallery": 2_000, "bank": 1_500, "dim": 64, "queries": 300}
K, ALPHA, BETA, TOP = 16, 0.75, 20.0, 10
#: Similarities per block of the raw loops (as the engine's budget on a GPU).
RAW_BLOCK = 2**27
SIX = ["nnn", "csls", "dn", "is", "dis", "dualis"]


def unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Runner:
    """Times comparisons, each in its own ``try``: a failure or a spent time budget becomes the
    text of its cell instead of ending the run."""

    def __init__(self, torch, device: str, repeats: int, budget: float) -> None:
        self.torch, self.device, self.repeats, self.budget = torch, device, repeats, budget
        self.started = time.perf_counter()

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()

    def left(self) -> float:
        return self.budget - (time.perf_counter() - self.started)

    def time(self, fn: Callable[[], Any], *, repeats: int | None = None, warm: bool = True) -> tuple[float | str, Any]:
        """(median seconds of ``repeats`` calls after one warm-up, the last result), or
        (``"failed: ..."`` / ``"skipped: ..."``, None)."""
        if self.left() <= 0:
            return f"skipped: the {self.budget:g} s budget was spent", None
        try:
            self.sync()
            out = fn() if warm else None
            times = []
            for _ in range(self.repeats if repeats is None else repeats):
                self.sync()
                t0 = time.perf_counter()
                out = fn()
                self.sync()
                times.append(time.perf_counter() - t0)
            return float(np.median(times)), out
        except Exception as exc:  # one comparison's failure is its cell, never the end of the run
            return failed(exc), None


def failed(exc: BaseException) -> str:
    traceback.print_exc(file=sys.stderr)
    message = " ".join(str(exc).split())
    return f"failed: {type(exc).__name__}: {message[:200]}"


def attempt(fn: Callable[[], str]) -> str:
    """``fn()``, or the failure as text."""
    try:
        return fn()
    except Exception as exc:
        return failed(exc)


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


@contextmanager
def setting(module, name: str, value):
    """``module.name`` set to ``value`` inside the block (an engine setting compared)."""
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def whole_row_topk():
    """The engine's top-k over whole rows (``torch.topk``) instead of through chunk maxima."""
    return setting(torch_reducers, "CHUNK_WIDTHS", (2**62, 2**62))  # no width is left: chunk_width() gives 0


def profile(run: Runner, folder: Path, works: dict[str, Callable[[], Any]]) -> None:
    """For each work (one warm-up call first), ``folder/<name>.txt``: torch.profiler's operators
    by their own device time and by their own host time (syncs and copies included)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    folder.mkdir(parents=True, exist_ok=True)
    cuda = run.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    for name, fn in works.items():
        try:
            fn()
            run.sync()
            t0 = time.perf_counter()
            with profiler(activities=activities) as prof:
                fn()
                run.sync()
            seconds = time.perf_counter() - t0
            averages = prof.key_averages()
            by_device = "self_cuda_time_total" if cuda else "self_cpu_time_total"
            text = "\n\n".join(
                [
                    f"{name}: {seconds:.3f} s under the profiler",
                    averages.table(sort_by=by_device, row_limit=30, max_name_column_width=70),
                    averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=70),
                ]
            )
        except Exception as exc:  # one profile's failure is its file, never the end of the run
            text = failed(exc)
        (folder / f"{name}.txt").write_text(text, encoding="utf-8")
        print(f"profiled {name}", flush=True)


# ---------------------------------------------------------------------- the run
def environment(torch, device: str) -> list[str]:
    """Lines naming the machine and the software (the card, torch, CUDA, the commit)."""
    try:
        if device.startswith("cuda"):
            props = torch.cuda.get_device_properties(torch.device(device))
            card = f"{props.name}, {props.total_memory / 2**30:.0f} GiB, {torch.cuda.device_count()} visible GPU(s)"
        else:
            card = f"CPU torch, {torch.get_num_threads()} threads"
    except Exception as exc:  # the table still comes out
        card = failed(exc)
    matmul = torch.backends.cuda.matmul
    try:
        tf32 = "on" if matmul.allow_tf32 else "off"
    except RuntimeError:  # the program set torch's newer API
        tf32 = matmul.fp32_precision
    card += f"; TF32 float32 matmuls in raw torch: {tf32} (hubless: {'on' if tf32_enabled() else 'off'})"
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10, cwd=os.path.dirname(__file__)
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return [
        f"device: {device} ({card}); host: {os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}",
        f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), numpy {np.__version__}, Python {platform.python_version()}, "
        f"hubless {getattr(hubless, '__version__', '?')} {commit or ''}".rstrip(),
    ]


def shown(value: float | str, raw: float | str | None = None) -> str:
    if isinstance(value, str):
        return value
    ratio = f" ({value / raw:.2f}x raw)" if isinstance(raw, float) and raw > 0 else ""
    return f"{value:.3f} s{ratio}"


def floor_check(seconds: dict[str, float | str], name: str, reference: str, bound: float) -> str:
    """``name <= bound x reference``: the measured ratio and whether it is met."""
    a, b = seconds.get(name), seconds.get(reference)
    if not isinstance(a, float) or not isinstance(b, float) or b <= 0:
        return f"{name} <= {bound:g}x {reference}: not measured"
    ratio = a / b
    return f"{name} <= {bound:g}x {reference}: {ratio:.2f}x, {'met' if ratio <= bound else 'NOT met'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    for name in FULL:
        ap.add_argument(f"--{name}", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help=f"a smoke run of every row at tiny sizes ({QUICK}), one repeat")
    ap.add_argument("--skip-numpy", action="store_true", help="leave hubless numpy out (its rows take longest)")
    ap.add_argument("--budget", type=float, default=200.0, help="seconds after which no new comparison starts (default 200)")
    ap.add_argument("--out", type=Path, default=None, help="also write the header and table as Markdown to this file")
    ap.add_argument(
        "--profile", type=Path, default=None,
        help="after the table, write torch.profiler tables of hubless's search and evaluate into this folder",
    )  # fmt: skip
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    base = QUICK if args.quick else FULL if device.startswith("cuda") else SMALL
    sizes = {name: getattr(args, name) or base[name] for name in FULL}
    repeats = 1 if args.quick else args.repeats
    full = sizes == FULL and device.startswith("cuda")
    run = Runner(torch, device, repeats, args.budget)
    header = [
        f"gallery {sizes['gallery']:,} x bank {sizes['bank']:,} x d {sizes['dim']}, {sizes['queries']:,} queries, "
        f"medians of {repeats} after a warm-up, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        *environment(torch, device),
    ]
    for line in header:
        print(line, flush=True)
    rng = np.random.default_rng(0)
    g, b = unit(rng, sizes["gallery"], sizes["dim"]), unit(rng, sizes["bank"], sizes["dim"])
    g.flags.writeable = False  # read-only: it stays on the device between searches (torch_arrays.put keeps only such arrays)
    q = unit(rng, sizes["queries"], sizes["dim"])
    gb = unit(rng, max(1, len(b) // 2), sizes["dim"])  # DualIS's gallery bank
    # the evaluation's shape (issue 39's table): queries x gallery x bank, each of the bank's size
    n_eval = min(len(b), len(g))
    g_eval, q_eval = g[:n_eval], unit(rng, n_eval, sizes["dim"])
    truth = rng.integers(0, n_eval, size=n_eval)
    try:
        import nnn  # nnn-retrieval
    except ImportError:
        nnn = None
        header.append("skipped: nnn-retrieval is not installed (pip install nnn-retrieval==1.0.1): no nnn-retrieval column")
        print(header[-1])
    try:
        import faiss
    except ImportError:
        faiss = None
        header.append("skipped: faiss is not installed: no FAISS IndexFlatIP row for the corrected search")
        print(header[-1])
    rows: list[tuple[str, str, str]] = []

    def row(label: str, seconds: dict[str, float | str], floors: list[str]) -> None:
        raw = seconds.get("raw torch")
        value = "; ".join(f"{name} {shown(t, None if name == 'raw torch' or 'first call' in name else raw)}" for name, t in seconds.items())
        rows.append((label, value, "; ".join(floors)))
        print(f"{label}: {value}" + (f"  [{'; '.join(floors)}]" if floors else ""), flush=True)

    # NNN k=16 fit
    fit: dict[str, float | str] = {}
    fit["raw torch"], raw_means = run.time(lambda: raw_nnn_fit(torch, device, g, b))
    fitted = None
    if nnn is not None:
        use_gpu = device.startswith("cuda")
        gpu_id = (torch.device(device).index or 0) if use_gpu else -1
        for batch in (1024, 128):

            def fit_nnn(batch=batch):
                return nnn.NNNRanker(
                    nnn.NNNRetriever(g.shape[1], use_gpu=use_gpu, gpu_id=gpu_id), g, b, alternate_ks=K, batch_size=batch,
                    alternate_weight=ALPHA, use_gpu=use_gpu, gpu_id=gpu_id,
                )  # fmt: skip

            fit[f"nnn-retrieval b{batch}"], ranker = run.time(fit_nnn)
            fitted = fitted or ranker
    fit["hubless device"], corr = run.time(lambda: hubless.NNN(alpha=ALPHA, k=K).fit(g, b, device=device, progress=False))
    with whole_row_topk():
        fit["hubless device, whole-row top-k"], _ = run.time(lambda: hubless.NNN(alpha=ALPHA, k=K).fit(g, b, device=device, progress=False))
    numpy_corr = None
    if not args.skip_numpy:
        fit["hubless numpy"], numpy_corr = run.time(lambda: hubless.NNN(alpha=ALPHA, k=K).fit(g, b, progress=False), repeats=1, warm=False)
    error = attempt(lambda: f"{np.abs(corr.bias_ - raw_means).max():.1e}" if corr is not None and raw_means is not None else "n/a")
    row(
        f"NNN k={K} fit (bias vs raw torch: {error})",
        fit,
        [floor_check(fit, "hubless device", "nnn-retrieval b1024", 1.0), floor_check(fit, "hubless device", "raw torch", 1.3)],
    )

    # the CUDA-only code paths at this size: a bank streamed through pinned buffers, and the split
    # of the rows between devices (two threads on one device where there is one GPU)
    paths: dict[str, float | str] = {}
    differences: list[str] = []
    pair = "cuda:0,cuda:1" if device.startswith("cuda") and torch.cuda.device_count() > 1 else f"{device},{device}"
    for name, settings in (("bank streamed", {"STREAM_BANKS": True}), (f"device={pair!r}", {})):

        def variant(settings=settings, on=pair if not settings else device):
            before = {key: getattr(torch_arrays, key) for key in settings}
            try:
                for key, value in settings.items():
                    setattr(torch_arrays, key, value)
                return hubless.NNN(alpha=ALPHA, k=K).fit(g, b, device=on, progress=False)
            finally:
                for key, value in before.items():
                    setattr(torch_arrays, key, value)

        paths[name], other = run.time(variant)
        if other is not None and corr is not None:
            differences.append(f"{name} {np.abs(other.bias_ - corr.bias_).max():.1e}")
    paths["resident bank, one device"] = fit["hubless device"]
    row(
        f"NNN k={K} fit by other code paths (bias vs one device: {', '.join(differences) or 'n/a'})",
        paths,
        [],
    )

    # corrected top-10 search (against the fitted NNN; numpy's fit stands in when the device fit failed)
    search: dict[str, float | str] = {}
    ids = raw_ids = None
    base_corr = corr if corr is not None else numpy_corr
    if base_corr is None:
        search["all"] = "skipped: no NNN fit to search with"
    else:
        G, bias = torch.from_numpy(g).to(device), torch.from_numpy(np.ascontiguousarray(base_corr.bias_)).to(device)
        search["raw torch"], raw_out = run.time(lambda: raw_search(torch, device, G, bias, q))
        raw_ids = None if raw_out is None else raw_out[1]
        if fitted is not None:
            search["nnn-retrieval b1024"], _ = run.time(lambda: fitted.search(q, TOP))
        if faiss is not None:

            def faiss_index():
                index = faiss.IndexFlatIP(g.shape[1] + 1)
                index.add(np.ascontiguousarray(np.hstack([g, -base_corr.bias_[:, None]])))
                return index

            built, index = run.time(faiss_index, repeats=1, warm=False)
            aug = np.ascontiguousarray(np.hstack([q, np.full((len(q), 1), ALPHA, np.float32)]))
            search["faiss IndexFlatIP (host)"] = built if index is None else run.time(lambda: index.search(aug, TOP))[0]
        search["hubless device"], out = run.time(lambda: base_corr.search(q, TOP, device=device))
        ids = None if out is None else out[1]
        with whole_row_topk():
            search["hubless device, whole-row top-k"], _ = run.time(lambda: base_corr.search(q, TOP, device=device))
        if numpy_corr is not None:
            search["hubless numpy"], _ = run.time(lambda: numpy_corr.search(q, TOP), repeats=1, warm=False)
    agree = attempt(lambda: f"{np.mean(ids == raw_ids):.4f}" if ids is not None and raw_ids is not None else "n/a")
    row(
        f"corrected top-{TOP} search of {len(q):,} queries (ids = raw torch's: {agree})",
        search,
        [floor_check(search, "hubless device", "nnn-retrieval b1024", 1.0)],
    )

    # IS beta=20 fit
    is_fit: dict[str, float | str] = {}
    is_fit["raw torch"], raw_lse = run.time(lambda: raw_is_fit(torch, device, g, b))
    is_fit["hubless device"], is_corr = run.time(lambda: make_correction(f"is:beta={BETA}").fit(g, b, device=device, progress=False))
    if not args.skip_numpy:
        is_fit["hubless numpy"], _ = run.time(lambda: make_correction(f"is:beta={BETA}").fit(g, b, progress=False), repeats=1, warm=False)
    error = attempt(
        lambda: (
            f"{np.abs(is_corr.statistics_.query_lse[BETA] - raw_lse).max():.1e}" if is_corr is not None and raw_lse is not None else "n/a"
        )
    )
    row(f"IS beta={BETA:g} fit (log-sum-exp vs raw torch: {error})", is_fit, [floor_check(is_fit, "hubless device", "raw torch", 1.5)])

    # evaluate
    ev: dict[str, float | str] = {}

    def raw_baseline():
        means = raw_nnn_fit(torch, device, g_eval, b)  # the NNN bias of the evaluated gallery (not timed)
        G_eval, bias_eval = torch.from_numpy(g_eval).to(device), torch.from_numpy(means).to(device)
        return lambda: raw_ranks(torch, device, G_eval, bias_eval, q_eval, truth)

    try:
        ev["raw torch"], _ = run.time(raw_baseline())
    except Exception as exc:  # the untimed bias of the raw loop failed: its cell says so
        ev["raw torch"] = failed(exc)

    def evaluate(methods, on, compiled=False):
        with use_device(on, compiled=compiled):
            return hubless.evaluate(g_eval, q_eval, truth, b, methods, gallery_bank=gb, bootstrap=0, progress=False)

    ev["hubless device, NNN"], _ = run.time(lambda: evaluate(["nnn"], device))
    ev["hubless device, six methods"], _ = run.time(lambda: evaluate(SIX, device))
    # the index ties' equal counts the other way than this device's default (running sums on a
    # GPU, no wait; a second look at the rows with ties elsewhere, a wait per method and block)
    other = "a second look" if device.startswith("cuda") else "running sums"
    with setting(torch_ranking, "RUNNING_TIE_COUNTS", not device.startswith("cuda")):
        ev[f"hubless device ties by {other}, NNN"], _ = run.time(lambda: evaluate(["nnn"], device))
        ev[f"hubless device ties by {other}, six methods"], _ = run.time(lambda: evaluate(SIX, device))
    # the ranking pass's per-block work by torch.compile's kernels (HUBLESS_COMPILE=1): the first
    # call compiles (its seconds are shown apart), the timed calls after it reuse the kernels
    ev["compiled: first call"], _ = run.time(lambda: evaluate(["nnn"], device, True), repeats=1, warm=False)
    ev["hubless device compiled, NNN"], _ = run.time(lambda: evaluate(["nnn"], device, True))
    ev["hubless device compiled, six methods"], _ = run.time(lambda: evaluate(SIX, device, True))
    if not args.skip_numpy:
        ev["hubless numpy, NNN"], _ = run.time(lambda: evaluate(["nnn"], "numpy"), repeats=1, warm=False)
    row(
        f"evaluate ({n_eval:,} queries x {n_eval:,} gallery x {len(b):,} bank; six = {', '.join(SIX)})",
        ev,
        [
            floor_check(ev, "hubless device, NNN", "raw torch", 4.0),
            floor_check(ev, "hubless device, six methods", "hubless device, NNN", 2.0),
            floor_check(ev, "hubless device compiled, NNN", "raw torch", 4.0),
            floor_check(ev, "hubless device compiled, six methods", "hubless device compiled, NNN", 2.0),
        ],
    )

    # half precision
    for dtype in ("float16", "bfloat16"):

        def half_error(dtype=dtype) -> str:
            if corr is None or ids is None:
                return "n/a (no float32 fit and search to compare with)"
            if run.left() <= 0:
                return f"skipped: the {args.budget:g} s budget was spent"
            with use_device(device, dtype):
                half = hubless.NNN(alpha=ALPHA, k=K).fit(g, b, progress=False)
                _, half_ids = half.search(q, TOP)
            overlap = np.mean([len(set(x) & set(y)) / TOP for x, y in zip(half_ids, ids)])
            return f"max abs(bias - float32 bias) {np.abs(half.bias_ - corr.bias_).max():.1e}; top-{TOP} agreement {overlap:.4f}"

        rows.append((f"{dtype} products: NNN fit + search", attempt(half_error), ""))
        print(f"{rows[-1][0]}: {rows[-1][1]}", flush=True)
    header.append(f"total {time.perf_counter() - run.started:.0f} s")
    lines = table_lines(rows, full_size=full, size="gallery 100k x bank 50k x 512, 10k queries, on one GPU")
    print("\n" + "\n".join(lines))
    print(header[-1])
    if args.out is not None:
        write_markdown(args.out, header, lines)
        print(f"wrote {args.out}")
    if args.profile is not None and base_corr is not None:
        profile(
            run, args.profile,
            {
                "search": lambda: base_corr.search(q, TOP, device=device),
                "evaluate_nnn": lambda: evaluate(["nnn"], device),
                "evaluate_six": lambda: evaluate(SIX, device),
                "evaluate_nnn_compiled": lambda: evaluate(["nnn"], device, True),
                "evaluate_six_compiled": lambda: evaluate(SIX, device, True),
            },
        )  # fmt: skip


def write_markdown(path: Path, header: list[str], table: list[str]) -> None:
    """The header lines and the table as Markdown, written atomically (a temporary file renamed)."""
    text = "\n".join(["### The torch engine on a GPU (`benchmarks/gpu_engine.py`)", "", *[f"- {line}" for line in header], "", *table, ""])
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False, encoding="utf-8") as f:
        f.write(text)
    os.replace(f.name, path)


if __name__ == "__main__":
    main()
