"""``hubless fairness``: NDCG, AP and NDKL per attribute (and joint) for each correction."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hubless.cli._common import (
    METHOD_HELP,
    NORMALIZE_HELP,
    OVERWRITE_HELP,
    check_outputs,
    friendly_errors,
    generator_mark,
    load,
    wide_console,
)
from hubless.errors import InvalidInput


@friendly_errors
def fairness_command(
    gallery: Path = typer.Option(..., help="Gallery (image) embeddings (.npy/.npz)."),
    gallery_meta: Path = typer.Option(
        ..., help="One row per gallery item (.csv/.tsv/.parquet) with the attribute columns and the match column."
    ),
    queries: Path = typer.Option(..., help="Query (text) embeddings, one per row of --query-meta."),
    query_meta: Path = typer.Option(
        ..., help="One row per query (.csv/.tsv/.parquet) with the match column (e.g. profession) and optionally 'text'."
    ),
    attributes: str = typer.Option(
        "gender", help="Protected attribute columns of --gallery-meta, comma-separated (e.g. gender,ethnicity)."
    ),
    match: str = typer.Option("profession", help="Column whose exact equality makes a gallery item relevant to a query."),
    query_bank: Path = typer.Option(None, help="Reference queries the corrections are fitted on."),
    gallery_bank: Path = typer.Option(None, help="Reference gallery-modality items (DualIS/DualDIS, DN)."),
    method: list[str] = typer.Option(["baseline"], "--method", "-m", help=METHOD_HELP),
    top_n: int = typer.Option(10, help="n of precision@n and gender bias@n."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP),
    out: Path = typer.Option(None, help="Write the audit (overall and per query) as JSON."),
    report: Path = typer.Option(None, help="Write an HTML report with per-query NDKL distributions and NDCG vs NDKL."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:
    """Audit retrieval fairness (SISPI protocol) before and after each correction."""
    from hubless._atomic import write_json
    from hubless.data.fairness import relevance_by_column
    from hubless.fairness import audit
    from hubless.inputs import read_records
    from hubless.reports.fairness import fairness_report, overall_rows

    check_outputs(
        {"--out": out, "--report": report},
        {
            "--gallery": gallery,
            "--gallery-meta": gallery_meta,
            "--queries": queries,
            "--query-meta": query_meta,
            "--query-bank": query_bank,
            "--gallery-bank": gallery_bank,
        },
        overwrite=overwrite,
    )
    if report is not None:
        from hubless.errors import check_available

        check_available("matplotlib", "--report", "report")
    g_rows, q_rows = read_records(gallery_meta), read_records(query_meta)
    g = load(gallery, "gallery", normalize=normalize)
    q = load(queries, "queries", normalize=normalize, dim=g.shape[1])
    if len(g_rows) != g.shape[0] or len(q_rows) != q.shape[0]:
        raise InvalidInput(
            f"metadata rows ({len(g_rows)} gallery, {len(q_rows)} queries) must match the embeddings ({g.shape[0]}, {q.shape[0]})"
        )
    names = [a.strip() for a in attributes.split(",") if a.strip()]
    missing = [a for a in names if a not in g_rows[0]]
    if missing:
        raise InvalidInput(f"--gallery-meta has no column(s) {', '.join(missing)} (columns: {', '.join(g_rows[0])})")
    relevant = relevance_by_column(g_rows, q_rows, match)
    labels = [str(r.get("text") or r[match]) for r in q_rows]
    result = audit(
        g,
        q,
        relevant,
        {a: [r[a] for r in g_rows] for a in names},
        load(query_bank, "query bank", normalize=normalize, dim=g.shape[1]),
        method,
        gallery_bank=load(gallery_bank, "gallery bank", normalize=normalize, dim=g.shape[1]),
        top_n=top_n,
        query_names=labels,
        normalize=normalize,
        progress=progress,
    )
    console = wide_console()
    table = Table(title=f"fairness: {q.shape[0]} queries over {g.shape[0]} items (NDKL: lower is fairer)")
    metrics = list(result.results[0].metrics)
    table.add_column("method")
    for m in metrics:
        table.add_column(m, justify="right")
    for row in overall_rows(result):
        table.add_row(*row.values())
    console.print(table)
    key = "NDKL_joint" if "NDKL_joint" in metrics else f"NDKL_{names[0]}"
    most, least = result.extremes(key)
    console.print(f"most biased queries (baseline {key}): " + "; ".join(f"{n} {v:.3f}" for n, v in most))
    console.print(f"least biased queries (baseline {key}): " + "; ".join(f"{n} {v:.3f}" for n, v in least))
    if out is not None:
        write_json(out, {**generator_mark(), **result.to_dict()})
        typer.echo(f"results: {out}")
    if report is not None:
        from hubless.progress import stage

        with stage(f"writing the report {report}", progress):
            fairness_report(result, report)
        typer.echo(f"report: {report}")
