"""``hubless eval --attached SIDECAR --queries q.npy``: the attached search of a collection you
already have measured against exact corrected search (a full scan with the sidecar's biases):
recall@k, the share of queries certified and the mean k' per cut-off. A thin layer over
:meth:`hubless.attached.AttachedCollection.evaluate_at`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hubless.cli._common import check_outputs, generator_mark, parse_ints, wide_console
from hubless.errors import InvalidInput


def refuse_for_attached(flags: dict[str, object]) -> None:
    """``--attached`` mode: refuse the options that evaluate embeddings against a truth."""
    given = [flag for flag, value in flags.items() if value]
    if given:
        raise InvalidInput(
            f"--attached measures an attached collection against exact search (no truth, no method); {', '.join(given)} do not apply"
        )


def eval_attached(
    sidecar: Path,
    queries: Path | None,
    ks: str,
    *,
    candidates: int | None,
    max_candidates: int | None,
    nprobe: int | None,
    ef_search: int | None,
    weight: float | None,
    out: Path | None,
    overwrite: bool,
) -> None:
    """Open the collection the sidecar names (found from the sidecar's folder), evaluate at each
    cut-off of ``ks``, print a table and write ``out`` (JSON) when given."""
    from hubless._atomic import write_json
    from hubless.attached import AttachedCollection
    from hubless.inputs import load_array

    if queries is None:
        raise typer.BadParameter("--attached needs --queries (the query embeddings to search with)")
    check_outputs({"--out": out}, {"--attached": sidecar, "--queries": queries}, overwrite=overwrite)
    attached = AttachedCollection.from_sidecar(sidecar)
    options: dict[str, float | int] = {k: v for k, v in (("nprobe", nprobe), ("ef_search", ef_search), ("weight", weight)) if v is not None}
    rows = attached.evaluate_at(
        load_array(queries), parse_ints(ks, "--ks"), candidates=candidates, max_candidates=max_candidates, **options
    )
    table = Table(title=f"{attached.spec} attached to {attached.source.kind} ({attached.ntotal} items): against exact corrected search")
    for column in ("k", "recall@k", "certified", "mean k'", "queries"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["top_k"]), f"{row['recall']:.4f}", f"{row['certified']:.1%}", f"{row['candidates']:.0f}", str(row["queries"]))
    wide_console().print(table)
    if out is not None:
        info = {"sidecar": str(sidecar), "method": attached.spec, "source": attached.source.kind, "n_items": attached.ntotal}
        write_json(out, {**generator_mark(), "attached": info, "results": rows})
        typer.echo(f"results: {out}")
