"""``hubless bank check|adversarial``: diagnose a query bank, or build the paper's adversarial one."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from hubless.cli._common import NORMALIZE_HELP, check_outputs, friendly_errors, load, print_note
from hubless.errors import InvalidInput

app = typer.Typer(help="Reference banks: coverage diagnostics and adversarial banks (QB-Norm, Bogolin et al. 2022).", no_args_is_help=True)


@app.command("check")
@friendly_errors
def check_command(
    gallery: Path = typer.Option(..., help="Gallery embeddings (.npy/.npz)."),
    query_bank: Path = typer.Option(..., help="The query bank to diagnose."),
    queries: Path = typer.Option(None, help="A sample of real queries: also measure the bank's distribution shift from them."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP),
) -> None:
    """Coverage (share of gallery items that are some bank query's nearest neighbour), N_1
    skewness under the bank and, with --queries, the shift 1 - cos(mean bank, mean queries)."""
    from hubless.banks import bank_report

    g = load(gallery, "gallery", normalize=normalize)
    report = bank_report(
        g,
        load(query_bank, "query bank", normalize=normalize, dim=g.shape[1]),
        queries=load(queries, "queries", normalize=normalize, dim=g.shape[1]),
        normalize=normalize,
    )
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        typer.echo(
            f"coverage: {report.coverage:.1%} of {report.n_gallery:,} gallery items ({report.distinct_items:,}) are some bank query's nearest item; "
            f"relative coverage {report.relative_coverage:.0%} of what {report.n_bank:,} queries could reach"
        )
        typer.echo(f"N_1 under the bank: skewness {report.n1_skewness:.2f}, largest {report.n1_max} of {report.n_bank:,} bank queries")
        if report.shift is not None:
            typer.echo(f"shift from the queries: 1 - cos(mean bank, mean queries) = {report.shift:.4f}")
    if report.warning:
        print_note(report.warning, "warning")


@app.command("adversarial")
@friendly_errors
def adversarial_command(
    gallery: Path = typer.Option(..., help="Gallery embeddings (.npy/.npz)."),
    candidates: Path = typer.Option(..., help="Candidate queries to pick from (.npy/.npz)."),
    n: int = typer.Option(..., help="Bank size: how many candidates to keep."),
    out: Path = typer.Option(..., help="Where to write the bank (.npy)."),
    overwrite: bool = typer.Option(False, help="Replace an existing --out that hubless did not write."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP),
) -> None:
    """The n candidates whose nearest gallery items cover the fewest distinct items (the QB-Norm
    paper's adversarial bank); also writes OUT.ids.npy, the chosen candidates' row numbers."""
    from hubless._atomic import save_npy
    from hubless.banks import adversarial_bank, bank_report

    if out.suffix != ".npy":
        raise InvalidInput(f"--out must be a .npy file; got {out}")
    ids_out = out.with_suffix(".ids.npy")
    check_outputs({"--out": out, "--out (ids)": ids_out}, {"--gallery": gallery, "--candidates": candidates}, overwrite=True)
    if not overwrite and (out.exists() or ids_out.exists()):
        raise InvalidInput(f"{out} exists; pass --overwrite to replace it")
    g = load(gallery, "gallery", normalize=normalize)
    c = load(candidates, "candidates", normalize=normalize, dim=g.shape[1])
    chosen = adversarial_bank(g, c, n, normalize=normalize)
    save_npy(out, c[chosen])
    save_npy(ids_out, chosen.astype("int64"))
    report = bank_report(g, c[chosen], normalize=normalize)
    typer.echo(
        f"wrote {chosen.size:,} queries covering {report.distinct_items:,} gallery items ({report.coverage:.1%}) -> {out} (rows: {ids_out})"
    )
