"""HTML report of a fairness audit: the table, per-query NDKL distributions, NDCG vs NDKL."""

from __future__ import annotations

import html
import os
from pathlib import Path

from hubless.fairness.audit import FairnessAudit
from hubless.reports.html import Report, html_table, require_matplotlib

__all__ = ["fairness_report", "overall_rows"]


def overall_rows(result: FairnessAudit) -> list[dict[str, str]]:
    """A row per method: each mean metric with 3 decimals and its change vs the baseline."""
    return [
        {"method": r.spec, **{m: f"{v:.3f}" + (f" ({r.delta[m]:+.3f})" if r.delta else "") for m, v in r.metrics.items()}}
        for r in result.results
    ]


def fairness_report(result: FairnessAudit, path: str | os.PathLike, *, title: str = "hubless fairness audit") -> Path:
    plt = require_matplotlib()
    report = Report(title)
    report.section("Overall (means over queries, change vs baseline)", html_table(overall_rows(result)), section_id="overall")
    ndkl_keys = [k for k in result.results[0].metrics if k.startswith("NDKL_")]
    fig, axes = plt.subplots(1, len(ndkl_keys), figsize=(4.5 * len(ndkl_keys), 3.5), squeeze=False)
    for ax, key in zip(axes[0], ndkl_keys):
        ax.boxplot([r.per_query[key] for r in result.results])
        ax.set_xticks(range(1, len(result.results) + 1), [r.method for r in result.results])
        ax.set_title(key)
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    report.figure(fig, caption="Per-query NDKL per method (lower is fairer)", alt="NDKL distributions")
    key = "NDKL_joint" if "NDKL_joint" in ndkl_keys else ndkl_keys[0]
    fig, ax = plt.subplots(figsize=(5, 4))
    for r in result.results:
        ax.scatter(r.metrics["NDCG"], r.metrics[key], label=r.spec, s=40)
    # Honest scales: NDCG lives in [0, 1] and NDKL starts at 0, so at least a 0.1-wide NDCG span
    # and the NDKL axis from 0 are shown, without offset notation, and noise does not look large.
    ndcg = [r.metrics["NDCG"] for r in result.results]
    ax.set_xlim(max(0.0, min(min(ndcg), 0.9) - 0.01), 1.0 + 0.005)
    ax.set_ylim(0.0, max(1e-3, 1.15 * max(r.metrics[key] for r in result.results)))
    ax.ticklabel_format(useOffset=False)
    ax.set_xlabel("NDCG (higher is better)")
    ax.set_ylabel(f"{key} (lower is fairer)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    report.figure(fig, caption="Utility vs fairness (SISPI figure 5): best is bottom right", alt="NDCG vs NDKL")
    most, least = result.extremes(key)
    items = "".join(f"<li>{html.escape(n)}: {v:.3f}</li>" for n, v in most)
    items2 = "".join(f"<li>{html.escape(n)}: {v:.3f}</li>" for n, v in least)
    report.section(
        f"Most and least biased queries (baseline {key})",
        f"<p>Most:</p><ul>{items}</ul><p>Least:</p><ul>{items2}</ul>",
        section_id="queries",
    )
    per_query = [
        {"query": n, **{f"{r.spec} {key}": float(r.per_query[key][i]) for r in result.results}} for i, n in enumerate(result.query_names)
    ]
    report.section("Per query", html_table(per_query), section_id="per-query")
    return report.write(path)
