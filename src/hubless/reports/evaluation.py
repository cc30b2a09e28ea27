"""HTML report of an evaluation: the results table, R@K with CI whiskers, N_1 before/after."""

from __future__ import annotations

import html
import os
from pathlib import Path

import numpy as np

from hubless.evaluation import Evaluation
from hubless.reports.html import Report, html_table, require_matplotlib

__all__ = ["evaluation_report", "results_rows"]


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


def evaluation_report(ev: Evaluation, path: str | os.PathLike, *, title: str = "hubless evaluation") -> Path:
    """Write a self-contained HTML report (figures inlined) of ``ev`` to ``path``."""
    plt = require_matplotlib()
    report = Report(title)
    inputs = ", ".join(f"{k}: {v}" for k, v in ev.inputs.items() if not isinstance(v, dict))
    report.section("Inputs", f"<p>{html.escape(inputs)}</p>", section_id="inputs")
    report.section("Results", html_table(results_rows(ev)), section_id="results")

    fig, ax = plt.subplots(figsize=(8, 4))
    names = [r.spec for r in ev.results]
    width = 0.8 / len(ev.ks)
    x = np.arange(len(names))
    for i, k in enumerate(ev.ks):
        values = np.array([r.metrics[f"R@{k}"] for r in ev.results])
        if all(f"R@{k}" in r.ci95 for r in ev.results):
            ci = np.array([r.ci95[f"R@{k}"] for r in ev.results])
            err = np.abs(ci.T - values)
        else:
            err = None
        ax.bar(x + i * width, values, width, yerr=err, capsize=3, label=f"R@{k}")
    ax.set_xticks(x + width * (len(ev.ks) - 1) / 2, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("recall (%)")
    ax.legend()
    fig.tight_layout()
    report.figure(fig, caption="R@K per method, whiskers: bootstrap 95% CI", alt="recall bars")

    base = ev.results[0]
    others = ev.results[1:] or ev.results
    cols = min(3, len(others))
    rows = int(np.ceil(len(others) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3 * rows), squeeze=False)
    top = max(int(r.n1.max()) for r in ev.results) + 1
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

    hub_rows = [{"method": r.spec, **{k: v for k, v in r.hubness.items()}} for r in ev.results]
    report.section("Hubness", html_table(hub_rows), section_id="hubness")
    return report.write(path)


def tune_report(tuned, path: str | os.PathLike, ev: Evaluation | None = None, *, title: str = "hubless tuning") -> Path:
    """Write an HTML report of a :class:`~hubless.tuning.TuneResult`: the chosen parameters, a
    heat map of every two-parameter grid (NNN's alpha x k), the validation tables and, when
    given, the test evaluation of the chosen parameters."""
    plt = require_matplotlib()
    report = Report(title)
    chosen = [{"method": m, "chosen": b["spec"], f"validation {tuned.objective}": b[tuned.objective]} for m, b in tuned.best.items()]
    report.section("Chosen parameters", html_table(chosen), section_id="chosen")
    for method, rows in tuned.tables.items():
        params = [k for k in rows[0] if k in tuned.best[method]["params"]]
        if len(params) == 2:
            a_name, b_name = params
            a_vals = sorted({r[a_name] for r in rows})
            b_vals = sorted({r[b_name] for r in rows})
            grid = np.full((len(a_vals), len(b_vals)), np.nan)
            for r in rows:
                grid[a_vals.index(r[a_name]), b_vals.index(r[b_name])] = r[tuned.objective]
            fig, ax = plt.subplots(figsize=(1 + 0.6 * len(b_vals), 1 + 0.4 * len(a_vals)))
            im = ax.imshow(grid, aspect="auto", cmap="viridis")
            ax.set_xticks(range(len(b_vals)), [f"{v:g}" for v in b_vals])
            ax.set_yticks(range(len(a_vals)), [f"{v:g}" for v in a_vals])
            ax.set_xlabel(b_name)
            ax.set_ylabel(a_name)
            fig.colorbar(im, ax=ax, label=f"validation {tuned.objective}")
            ax.set_title(method)
            fig.tight_layout()
            report.figure(fig, caption=f"{method}: validation {tuned.objective} over the ({a_name}, {b_name}) grid", alt=f"{method} heat map")
        report.section(f"Validation: {method}", html_table(rows), section_id=f"validation-{method}")
    if ev is not None:
        report.section("Test queries, chosen parameters", html_table(results_rows(ev)), section_id="test")
    return report.write(path)
