"""HTML report of an evaluation: the results table, R@K with CI whiskers, N_1 before/after."""

from __future__ import annotations

import html
import os
from pathlib import Path

import numpy as np

from hubless.evaluation import Evaluation, TuneResult
from hubless.reports.html import Report, html_table, require_matplotlib

__all__ = ["evaluation_report", "recall_figure", "results_rows", "tune_report"]


def results_rows(ev: Evaluation) -> list[dict[str, object]]:
    """One flat row per method (the table of the CLI and of the report)."""
    rows = []
    for r in ev.results:
        row: dict[str, object] = {"method": r.spec}
        row.update(r.metrics)
        ci = r.delta_ci95.get("R@1")
        row["ΔR@1 [95% CI]"] = (f"{r.delta['R@1']:+.2f}" + (f" [{ci[0]:+.2f},{ci[1]:+.2f}]" if ci else "")) if r.delta else ""
        row["N1 max"] = int(r.hubness["N1_max"])
        row["N1 kurt"] = r.hubness["N1_kurtosis"]
        rows.append(row)
    return rows


def recall_figure(ev: Evaluation):
    """Horizontal R@K bars, one panel per K so small differences stay visible."""
    plt = require_matplotlib()
    names = [r.spec for r in ev.results]
    y = np.arange(len(names))
    fig, axes = plt.subplots(1, len(ev.ks), figsize=(2.2 + 2.6 * len(ev.ks), 0.8 + 0.35 * len(names)), sharey=True, squeeze=False)
    for ax, k in zip(axes[0], ev.ks):
        values = np.array([r.metrics[f"R@{k}"] for r in ev.results])
        err = None
        if all(f"R@{k}" in r.ci95 for r in ev.results):
            err = np.abs(np.array([r.ci95[f"R@{k}"] for r in ev.results]).T - values)
        ax.barh(y, values, xerr=err, capsize=2, color=["#999999"] + ["#4c72b0"] * (len(names) - 1))
        ax.axvline(values[0], color="#555555", linestyle="--", linewidth=1)
        lo = values.min() if err is None else (values - err[0]).min()
        hi = values.max() if err is None else (values + err[1]).max()
        pad = max(1.0, 0.1 * (hi - lo))
        ax.set_xlim(max(0.0, lo - pad), min(100.0, hi + pad))
        ax.set_title(f"R@{k} (%)", fontsize=10)
        ax.grid(axis="x", alpha=0.3)
    axes[0, 0].set_yticks(y, names, fontsize=8)
    axes[0, 0].invert_yaxis()
    fig.tight_layout()
    return fig


def _hubness_tables(ev: Evaluation) -> list[str]:
    """One table per k-occurrence (N_1, N_10, ...): a row per method, a column per statistic."""
    parts = []
    prefixes = sorted({key.split("_", 1)[0] for key in ev.results[0].hubness}, key=lambda p: int(p[1:]))
    for prefix in prefixes:
        rows = [
            {
                "method": r.spec,
                **{key.split("_", 1)[1].replace("_", " "): v for key, v in r.hubness.items() if key.startswith(prefix + "_")},
            }
            for r in ev.results
        ]
        parts.append(f"<p class='note'>{prefix} (k-occurrence at k={prefix[1:]})</p>" + html_table(rows))
    return parts


def evaluation_report(ev: Evaluation, path: str | os.PathLike, *, title: str = "hubless evaluation") -> Path:
    """Write a self-contained HTML report (figures inlined) of ``ev`` to ``path``."""
    plt = require_matplotlib()
    report = Report(title)
    inputs = ", ".join(f"{k}: {v}" for k, v in ev.inputs.items() if not isinstance(v, dict))
    report.section("Inputs", f"<p>{html.escape(inputs)}</p>", section_id="inputs")
    report.section("Results", html_table(results_rows(ev)), section_id="results")

    report.figure(
        recall_figure(ev),
        caption="R@K per method (one panel per K, axis zoomed to the values), whiskers: bootstrap 95% CI, dashed: baseline",
        alt="recall bars",
    )

    base = ev.results[0]
    others = ev.results[1:] or ev.results
    cols = min(3, len(others))
    rows = int(np.ceil(len(others) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    top = max(int(r.n1.max()) for r in ev.results if r.n1 is not None) + 1
    bins = np.arange(0, top + 1)
    for ax, r in zip(axes.ravel(), others):
        ax.hist(base.n1, bins=bins, alpha=0.5, label="baseline", log=True)
        ax.hist(r.n1, bins=bins, alpha=0.5, label=r.method, log=True)
        ax.set_title(r.spec, fontsize=8)
        ax.set_xlabel("N_1 (times ranked first)")
        ax.legend(fontsize=7)
    for ax in axes.ravel()[len(others) :]:
        ax.axis("off")
    fig.tight_layout()
    report.figure(fig, caption="Distribution of N_1 before (baseline) and after each correction (log counts)", alt="N1 histograms")

    report.section("Hubness", "".join(_hubness_tables(ev)), section_id="hubness")
    return report.write(path)


def tune_report(tuned: TuneResult, path: str | os.PathLike, ev: Evaluation | None = None, *, title: str = "hubless tuning") -> Path:
    """Write an HTML report of a :class:`~hubless.tuning.TuneResult`: the chosen parameters, a
    heat map of every two-parameter grid (NNN's alpha x k) with the choice marked, the
    validation tables and, when given, the test evaluation of the chosen parameters."""
    plt = require_matplotlib()
    report = Report(title)
    objective = tuned.objective
    chosen = [
        {"method": m, "chosen": b.spec, f"validation {objective}": b.value, "at grid edge": ", ".join(b.at_edge) or "-"}
        for m, b in tuned.best.items()
    ]
    report.section("Chosen parameters", html_table(chosen), section_id="chosen")
    if any(b.at_edge for b in tuned.best.values()):
        report.paragraph("A parameter chosen at the edge of its grid may have its best value beyond it: widen that grid.")
    for method, rows in tuned.tables.items():
        params = list(tuned.best[method].params)
        shown = [{k: (f"{v:g}" if k in params and isinstance(v, float) else v) for k, v in r.items()} for r in rows]
        report.section(
            f"Validation: {method}",
            f"<details><summary>{len(rows)} grid points</summary>{html_table(shown)}</details>",
            section_id=f"validation-{method}",
        )
        if len(params) == 2:
            report.figure(
                _grid_heatmap(plt, rows, params, tuned.best[method].params, objective, method),
                caption=f"{method}: validation {objective} over the ({params[0]}, {params[1]}) grid; box: chosen",
                alt=f"{method} heat map",
            )
    if ev is not None:
        report.section("Test queries, chosen parameters", html_table(results_rows(ev)), section_id="test")
    return report.write(path)


def _grid_heatmap(plt, rows, params, chosen, objective: str, method: str):
    a_name, b_name = params
    a_vals = sorted({r[a_name] for r in rows})
    b_vals = sorted({r[b_name] for r in rows})
    grid = np.full((len(a_vals), len(b_vals)), np.nan)
    for r in rows:
        grid[a_vals.index(r[a_name]), b_vals.index(r[b_name])] = r[objective]
    fig, ax = plt.subplots(figsize=(1.5 + 0.6 * len(b_vals), 1 + 0.4 * len(a_vals)))
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(b_vals)), [f"{v:g}" for v in b_vals])
    ax.set_yticks(range(len(a_vals)), [f"{v:g}" for v in a_vals])
    i, j = a_vals.index(chosen[a_name]), b_vals.index(chosen[b_name])
    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2))
    ax.set_xlabel(b_name)
    ax.set_ylabel(a_name)
    fig.colorbar(im, ax=ax, label=f"validation {objective}")
    ax.set_title(method)
    fig.tight_layout()
    return fig
