"""Run the benchmarks and write the documentation's benchmark page: tables and plots, one command.

    python benchmarks/report.py                      # every benchmark at its default size (1-2 hours on 2 cores)
    python benchmarks/report.py --quick              # smaller sizes where a benchmark has them (floors then do not apply)
    python benchmarks/report.py --quick index_speed  # ... for some of them
    python benchmarks/report.py --only accuracy,serve_load
    python benchmarks/report.py --from-saved         # rebuild the page from the last saved outputs, run nothing

Each benchmark runs in its own process; its output is kept in ``docs/benchmarks/results/NAME.txt``
with the command, the date, the machine and the time it took. The page ``docs/benchmarks/index.md``
is then written from the latest saved output of every benchmark: its Markdown tables as printed,
and a plot (``docs/benchmarks/NAME.png``) where one helps. A benchmark that cannot run here (no
benchmark data, a missing extra) keeps its previous output, and the page says why it was not
rerun. ``accuracy`` is built in: every correction on the demo's synthetic data (before/after R@1
and the N_1 distribution), which also draws the before/after figure of the README and the home
page (``docs/assets/before-after.png``) and, when Chromium is installed, a screenshot of the HTML
evaluation report (``docs/assets/report.png``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = ROOT / "docs" / "benchmarks"
RESULTS = OUT / "results"
ASSETS = ROOT / "docs" / "assets"

#: name -> (title, what it measures, default arguments, --quick arguments, data folder it needs or None)
BENCHMARKS: dict[str, tuple[str, str, list[str], list[str], str | None]] = {
    "accuracy": (
        "Accuracy before and after, on the bundled data",
        "every correction at its defaults on `hubless data synthetic`'s embeddings (1,000 images, 5,000 captions): R@1 and the largest hub, before and after",
        [],
        [],
        None,
    ),
    "coco_text": (
        "Accuracy on real captions (COCO-5k text proxy)",
        "MiniLM-L6 on COCO captions, every method tuned on the dev split, both directions (needs the models extra)",
        [],
        ["--bootstrap", "200"],
        "coco_karpathy",
    ),
    "bank_robustness": (
        "Bank robustness and distractors",
        "the QB-Norm protocol on real captions: in-domain, close-domain, far-domain and adversarial banks; distractor-enlarged galleries",
        [],
        [],
        "coco_karpathy",
    ),
    "one_pass": (
        "One pass for many methods",
        "evaluate with six methods against evaluate with NNN alone, and an IS fit against an NNN fit, on shared bank passes",
        [],
        [],
        None,
    ),
    "bias_speed": (
        "Speed of the exact bias",
        "NNN fit against the machine's GEMM peak, the reference nnn-retrieval and FAISS flat search",
        [],
        ["--scale", "0.25"],
        None,
    ),
    "index_speed": (
        "Indexes and sublinear biases",
        "ANN bias vs exact bias, corrected vs plain search latency, recall of IVF/HNSW, incremental add vs refit",
        [],
        ["--scale", "0.3"],
        None,
    ),
    "torch_engine": (
        "The torch engine",
        "the engine's block products in torch (CPU here; a GPU row where there is one) and half-precision error",
        [],
        ["--gallery", "5000", "--bank", "20000"],
        None,
    ),
    "ranking_pass": (
        "The device ranking pass",
        "per method and block of 2,684 x 50,000: eager kernels with torch.topk over whole rows, with the chunked top-k, and compiled (HUBLESS_COMPILE)",
        [],
        ["--queries", "1000", "--gallery", "20000"],
        None,
    ),
    "distributed_fit": ("Ray", "the distributed fit against the single-machine fit, and the tile cost model", [], ["--scale", "0.2"], None),
    "driver_memory": (
        "The Ray driver's memory",
        "peak memory growth of the driver of a distributed build, fit and augment, at two gallery sizes",
        [],
        ["--sizes", "20000", "40000"],
        None,
    ),
    "scale_plan": (
        "A gallery of 10^9 items",
        "per-tile, per-part and driver costs measured here, multiplied out to 10^9 items (see the plan page)",
        [],
        [],
        None,
    ),
    "rerank_cost": (
        "Retrieve and rerank",
        "latency of the first stage and of a cross-encoder over the corrected top k, by gallery size and k",
        [],
        [],
        None,
    ),
    "index_writes": (
        "Writes to a live index",
        "write latency and bytes written for 1, 100 and 10k rows into 100k x 512 (in process, through the service), load time and bytes read of 1M x 512 with and without mmap, against the previous format (4)",
        [],
        ["--n", "20000", "--big", "100000", "--bank", "2000", "--repeats", "9", "--filter-n", "100000"],
        None,
    ),
    "serve_load": (
        "Serving under load",
        "HTTP throughput and latency of `hubless serve`, Flat and IVF, by concurrency",
        [],
        ["--n-items", "20000"],
        None,
    ),
    "store_speed": (
        "Vector stores",
        "export rate, latency and recall of LanceDB, pgvector and Qdrant against hubless's own index",
        [],
        ["--n", "20000"],
        None,
    ),
    "scores_mode": (
        "Score matrices",
        "score-matrix mode against the QB-Norm authors' procedure: speed and memory",
        [],
        ["--scale", "0.1"],
        None,
    ),
    "startup": ("Start-up", "`import hubless` and `hubless --help` against plain numpy", [], [], None),
}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def run_one(name: str, quick: bool) -> str:
    """Run a benchmark in its own process; returns its saved output (header + stdout)."""
    title, _, args, quick_args, _ = BENCHMARKS[name]
    cmd = (
        [sys.executable, str(HERE / "report.py"), "--accuracy-child"] if name == "accuracy" else [sys.executable, str(HERE / f"{name}.py")]
    )
    cmd += quick_args if quick else args
    env = {
        **os.environ,
        "HUBLESS_PROGRESS": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    start = time.monotonic()
    print(f"running {name} ...", flush=True)
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.monotonic() - start
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    shown = " ".join(
        [
            "python",
            f"benchmarks/{name}.py" if name != "accuracy" else "benchmarks/report.py --only accuracy",
            *(quick_args if quick else args),
        ]
    )
    header = f"command: {shown}\ndate: {datetime.date.today().isoformat()}\nmachine: {machine()}\nseconds: {took:.0f}\n---\n"
    return header + result.stdout


def tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables printed in ``text``: a list of rows of cells (header first)."""
    found, current = [], []
    for line in text.splitlines():
        if line.startswith("|") and line.rstrip().endswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current.append(cells)
        elif current:
            found.append(current)
            current = []
    if current:
        found.append(current)
    return found


def number(cell: str) -> float | None:
    match = re.search(r"[-+]?\d[\d,]*\.?\d*", cell)
    return float(match.group().replace(",", "")) if match else None


# --- the built-in accuracy benchmark ------------------------------------------------------------


def accuracy_child() -> None:
    """Print the accuracy table and draw the before/after figure (run by ``run_one``)."""
    import numpy as np

    from hubless.data.synthetic import make_retrieval_data
    from hubless.demo import run_demo

    data = make_retrieval_data()
    ev = run_demo(data, bootstrap=1000, progress=False)
    base = ev.results[0]
    print("| method | R@1 | ΔR@1 [95% CI] | largest hub | N1 kurtosis |\n|---|---|---|---|---|")
    for r in ev.results:
        ci = r.delta_ci95.get("R@1")
        delta = f"{r.delta['R@1']:+.2f} [{ci[0]:+.2f}, {ci[1]:+.2f}]" if r.delta else ""
        print(f"| {r.spec} | {r.metrics['R@1']:.2f} | {delta} | {int(r.hubness['N1_max'])} | {r.hubness['N1_kurtosis']:.2f} |")
    counts = {}
    for r in (base, next(r for r in ev.results if r.method == "nnn")):
        scores, ids = _search(r.spec, data)
        counts[r.method] = np.bincount(ids[:, 0], minlength=data.gallery.shape[0])
    _before_after_figure(ev, counts, ASSETS / "before-after.png")


def _search(spec: str, data):
    from hubless.corrections import make_correction

    corr = make_correction(spec).fit(data.gallery, data.query_bank, data.gallery_bank)
    return corr.search(data.queries, top_k=1)


def _before_after_figure(ev, counts, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [1.1, 1]})
    base = ev.results[0].metrics["R@1"]
    methods = [r for r in ev.results if r.method != "baseline"]
    y = np.arange(len(methods))
    left.barh(y, [r.metrics["R@1"] - base for r in methods], left=base, color="#3f51b5")
    left.axvline(base, color="#555", linestyle="--", linewidth=1.2)
    left.set_xlim(base - 2, max(r.metrics["R@1"] for r in methods) + 1)
    left.text(base - 0.15, len(methods) - 0.5, f"uncorrected\n{base:.1f}", ha="right", va="bottom", fontsize=9, color="#555")
    left.set_yticks(y, [r.method for r in methods])
    left.invert_yaxis()
    left.set_xlabel("text->image R@1 (%); bars start at the uncorrected R@1")
    left.set_title("Every correction, fitted on a reference bank")
    bins = np.arange(0, max(c.max() for c in counts.values()) + 2)
    for name, color in (("baseline", "#9e9e9e"), ("nnn", "#3f51b5")):
        right.hist(counts[name], bins=bins, alpha=0.65, color=color, label="uncorrected" if name == "baseline" else "NNN")
    right.set_yscale("log")
    right.set_xlabel("captions that rank an image first (N_1; 5 is ideal)")
    right.set_ylabel("images")
    right.set_title("Hubs before and after")
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report_screenshot(path: Path) -> bool:
    """A screenshot of ``hubless eval --report`` on the example files (needs Chromium)."""
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        return False
    import tempfile

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "HUBLESS_PROGRESS": "0", "PYTHONPATH": str(ROOT / "src")}
        subprocess.run([sys.executable, "-m", "hubless", "data", "synthetic", "--out", tmp], check=True, env=env, capture_output=True)
        args = ["eval", "--gallery", "images.npy", "--queries", "captions.npy", "--truth", "t2i:5", "--query-bank", "bank_captions.npy",
                "--gallery-bank", "bank_images.npy", "-m", "nnn", "-m", "is", "-m", "dualis", "--bootstrap", "200", "--report", "report.html"]  # fmt: skip
        subprocess.run([sys.executable, "-m", "hubless", *args], check=True, cwd=tmp, env=env, capture_output=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(chromium), args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.goto(f"file://{tmp}/report.html")
            page.screenshot(path=str(path), full_page=True)
            browser.close()
    return True


# --- plots of the other benchmarks --------------------------------------------------------------


def _figure(width=9, height=3.6, ncols=1):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(width, height))
    return plt, fig, axes


def plot(name: str, found: list[list[list[str]]], path: Path) -> bool:
    """A plot of a benchmark's tables, where one helps; returns whether one was drawn."""
    if not found:
        return False
    if name == "serve_load":
        head, rows = found[0][0], found[0][1:]
        col = {h.strip(): i for i, h in enumerate(head)}
        if "queries as" in col:  # concurrency curves are of JSON queries; base64 / binary at concurrency 1 only
            rows = [r for r in rows if r[col["queries as"]].strip() == "json"]
        plt, fig, (qps, p50) = _figure(ncols=2)
        for index in dict.fromkeys(r[0] for r in rows):
            mine = [r for r in rows if r[0] == index]
            conc = [number(r[col["concurrency"]]) for r in mine]
            qps.plot(conc, [number(r[col["QPS"]]) for r in mine], marker="o", label=index)
            p50.plot(conc, [number(r[col["p50 ms"]]) for r in mine], marker="o", label=index)
        qps.set(xlabel="concurrent clients", ylabel="queries per second", xscale="log")
        p50.set(xlabel="concurrent clients", ylabel="p50 latency (ms)", xscale="log")
        qps.legend()
    elif name == "store_speed":
        rows = [r for r in found[0][1:] if number(r[2]) is not None]
        plt, fig, (lat, rec) = _figure(ncols=2, height=0.35 * len(rows) + 1.5)
        labels = [r[0] for r in rows]
        lat.barh(labels, [number(r[2]) for r in rows], color="#3f51b5")
        lat.set(xscale="log", xlabel="p50 latency, 1 query (ms, log)")
        lat.invert_yaxis()
        rec.barh(labels, [number(r[4]) for r in rows], color="#009688")
        rec.set(xlim=(0, 1.02), xlabel="recall@10 of the exact corrected top 10", yticks=[])
        rec.invert_yaxis()
    elif name == "rerank_cost":
        rows = found[0][1:]
        plt, fig, ax = _figure()
        import numpy as np

        x = np.arange(len(rows))
        ax.bar(x - 0.2, [number(r[1]) for r in rows], 0.4, label="retrieve (corrected top k)")
        ax.bar(x + 0.2, [number(r[2]) for r in rows], 0.4, label="rerank the top k")
        ax.set_xticks(x, [r[0].replace("gallery ", "").replace(", ", "\n") for r in rows])
        ax.set_ylabel("ms per query")
        ax.legend()
    elif name in ("coco_text", "accuracy"):
        plt, fig, axes = _figure(ncols=len(found[:2]), height=4)
        axes = axes if len(found[:2]) > 1 else [axes]
        for ax, table in zip(axes, found[:2]):
            head = table[0]
            col = next(i for i, h in enumerate(head) if h.startswith("ΔR@1"))
            rows = [r for r in table[1:] if r[col]]
            values = [[float(v) for v in re.findall(r"[-+]\d+\.\d+", r[col])] for r in rows]
            ax.barh([r[0].split(":")[0] for r in rows], [v[0] for v in values], color="#3f51b5",
                    xerr=[[v[0] - v[1] for v in values], [v[2] - v[0] for v in values]], capsize=3)  # fmt: skip
            ax.axvline(0, color="#555", linewidth=1)
            ax.invert_yaxis()
            ax.set_xlabel("change in R@1 vs uncorrected (points, 95% CI)")
            if name == "coco_text":
                ax.set_title(["text -> item", "item -> text"][list(axes).index(ax)])
    elif name == "bank_robustness":
        table = found[0]
        import numpy as np

        methods, banks = table[0][3:], [r for r in table[1:] if "mean" not in r[0]]
        plt, fig, ax = _figure(width=10, height=4)
        width = 0.8 / len(banks)
        x = np.arange(len(methods))
        for i, bank in enumerate(banks):
            deltas = [float((re.findall(r"\(([-+]\d+\.\d+)", c) or ["nan"])[0]) for c in bank[3:]]
            ax.bar(x + i * width - 0.4 + width / 2, deltas, width, label=bank[0])
        ax.axhline(0, color="#555", linewidth=1)
        ax.set_xticks(x, methods)
        ax.set_ylabel("change in R@1 vs uncorrected (points)")
        ax.legend(fontsize=8)
    elif name == "distributed_fit":
        rows = found[0][1:]
        plt, fig, ax = _figure(height=0.5 * len(rows) + 1.2)
        ax.barh([r[0] for r in rows], [number(r[1]) for r in rows], color="#3f51b5")
        ax.invert_yaxis()
        ax.set_xlabel("seconds")
    else:
        return False
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


# --- the page -----------------------------------------------------------------------------------


def write_page(notes: dict[str, str]) -> Path:
    lines = [
        "# Benchmarks",
        "",
        "The latest run of every benchmark in `benchmarks/`, written by `python benchmarks/report.py` (see its",
        "docstring for `--quick`, `--only` and `--from-saved`). Each section says the command, the date,",
        "the machine and the time it took; ratios measured in one run are what to compare across machines.",
        "A floor is the target an issue set for that benchmark at its default size. Earlier runs, with",
        "the analysis made when they were measured, are in [measured runs](measured.md).",
        "",
    ]
    for name, (title, what, *_rest) in BENCHMARKS.items():
        saved = RESULTS / f"{name}.txt"
        lines += [f"## {title}", "", what[0].upper() + what[1:] + ".", ""]
        if not saved.is_file():
            why = f" ({notes[name]})" if name in notes else ""
            lines += [
                f"Not run by `report.py` yet{why}: `python benchmarks/report.py --only {name}`. Earlier runs, if any: [measured runs](measured.md).",
                "",
            ]
            continue
        header, _, body = saved.read_text().partition("---\n")
        meta = dict(line.split(": ", 1) for line in header.strip().splitlines())
        lines += [
            f"`{meta['command']}`: {meta['date']}, {meta['machine']}, {int(float(meta['seconds'])) // 60} min {int(float(meta['seconds'])) % 60} s.",
            "",
        ]
        if name in notes:
            lines += [f"!!! note\n    Not rerun in the latest report: {notes[name]}.", ""]
        found = tables(body)
        png = OUT / f"{name}.png"
        if plot(name, found, png):
            lines += [f"![{title}]({png.name})", ""]
        elif png.exists():
            png.unlink()
        lines += ["```text", body.strip(), "```", ""] if not found else _as_markdown(body)
    page = OUT / "index.md"
    page.write_text("\n".join(lines).rstrip() + "\n")
    return page


def _as_markdown(body: str) -> list[str]:
    """The benchmark's output: its tables as Markdown tables, everything else as text blocks."""
    out, text = [], []
    for line in body.strip().splitlines():
        is_row = line.startswith("|") and line.rstrip().endswith("|")
        if is_row:
            if text:
                out += ["```text", *text, "```", ""] if any(t.strip() for t in text) else []
                text = []
            out.append(line)
        else:
            if out and out[-1].startswith("|"):
                out.append("")
            text.append(line)
    if text and any(t.strip() for t in text):
        out += ["```text", *text, "```"]
    return [*out, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated benchmark names (default: all): " + ", ".join(BENCHMARKS))
    parser.add_argument(
        "--quick", nargs="?", const="all", default="", help="smaller sizes where a benchmark has them (all, or a comma-separated list)"
    )
    parser.add_argument("--from-saved", action="store_true", help="write the page from the saved outputs; run nothing")
    parser.add_argument("--accuracy-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.accuracy_child:
        accuracy_child()
        return
    names = list(BENCHMARKS) if not args.only else [n.strip() for n in args.only.split(",")]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    notes = {}
    if not args.from_saved:
        sys.path.insert(0, str(ROOT / "src"))
        from hubless.data.karpathy import data_dir

        for name in names:
            needs = BENCHMARKS[name][4]
            if needs and not (data_dir() / needs).is_dir():
                notes[name] = f"needs {needs} under {data_dir()} (`hubless data fetch`)"
                print(f"skipping {name}: {notes[name]}")
                continue
            try:
                quick = args.quick == "all" or name in args.quick.split(",")
                (RESULTS / f"{name}.txt").write_text(run_one(name, quick))
            except RuntimeError as exc:
                notes[name] = str(exc).splitlines()[0]
                print(f"{name}: {exc}", file=sys.stderr)
        if "accuracy" in names and report_screenshot(ASSETS / "report.png"):
            print(f"wrote {ASSETS / 'report.png'}")
    print(f"wrote {write_page(notes)}")


if __name__ == "__main__":
    main()
