"""``hubless tune``: choose each correction's parameters on a validation split, then test them."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hubless.cli._common import (
    NORMALIZE_HELP,
    OVERWRITE_HELP,
    check_outputs,
    friendly_errors,
    generator_mark,
    load,
    parse_ints,
    print_note,
    warn_coverage,
    wide_console,
)
from hubless.cli.score_matrices import MASK_HELP, TIES_HELP, TRANSPOSE_HELP
from hubless.errors import InvalidInput


@friendly_errors
def tune_command(
    gallery: Path = typer.Option(None, help="Gallery embeddings (.npy/.npz)."),
    validation_queries: Path = typer.Option(None, help="Validation queries: disjoint from the test queries and the query bank (checked)."),
    validation_truth: str = typer.Option(..., help="Relevant gallery ids of each validation query (.npy/.json or t2i:5 / i2t:5)."),
    validation_gallery: Path = typer.Option(None, help="Gallery the validation queries search (default: --gallery)."),
    queries: Path = typer.Option(
        None, help="Test queries: checked for overlap, then evaluated with the chosen parameters when --truth is given."
    ),
    truth: str = typer.Option(None, help="Relevant gallery ids of each test query."),
    query_bank: list[str] = typer.Option(
        None,
        help="Reference queries the corrections are fitted on; repeat as NAME=PATH to tune and test with several banks "
        "(needs --queries and --truth; a table per bank and the geometric mean over banks).",
    ),
    gallery_bank: Path = typer.Option(None, help="Reference gallery-modality items (DualIS/DualDIS, DN)."),
    distractors: Path = typer.Option(None, help="Extra test-gallery items that are never relevant (a distractor-enlarged test gallery)."),
    method: list[str] = typer.Option(
        ["nnn"], "--method", "-m", help="Method name to tune, repeatable, e.g. nnn (grids from the papers; `hubless methods` lists them)."
    ),
    objective: str = typer.Option("R@1", help="Metric to maximise (R@K, MRR, mAP@R) or minimise (MdR, MnR)."),
    ks: str = typer.Option("1,5,10", help="Cut-offs K of R@K."),
    bootstrap: int = typer.Option(1000, help="Bootstrap resamples for the test evaluation."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP),
    out: Path = typer.Option(None, help="Write the choice, validation tables and test results as JSON."),
    report: Path = typer.Option(None, help="Write an HTML report (grid heat maps, tables)."),
    ties: str = typer.Option("index", help=TIES_HELP),
    validation_scores: Path = typer.Option(
        None, help="Instead of embeddings: validation queries x gallery scores (.npy/.npz/.pkl), disjoint from the test and bank rows."
    ),
    validation_query_bank_scores: Path = typer.Option(
        None, help="With --validation-scores over another gallery than --scores: the query bank's scores over it."
    ),
    validation_gallery_bank_scores: Path = typer.Option(None, help="Likewise the gallery bank's scores over the validation gallery."),
    validation_query_mask: Path = typer.Option(None, help="With --validation-scores: its padding rows (see --query-mask)."),
    scores: Path = typer.Option(None, help="With --validation-scores: test queries x gallery scores, evaluated with --truth."),
    query_bank_scores: Path = typer.Option(None, help="With --validation-scores: query bank x gallery scores."),
    gallery_bank_scores: Path = typer.Option(None, help="With --validation-scores: gallery bank x gallery scores (DualIS/DualDIS)."),
    query_mask: Path = typer.Option(None, help="With --scores: " + MASK_HELP),
    transpose: bool = typer.Option(False, "--transpose", help="With --validation-scores: " + TRANSPOSE_HELP),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:
    """Grid-search each method on the validation split (never on the test queries) and report
    the chosen parameters; with --queries and --truth, evaluate them on the test queries.
    With --validation-scores, the same from score matrices (docs/score-matrices.md)."""
    from hubless._atomic import write_json
    from hubless.cli.eval import parse_banks
    from hubless.cli.score_matrices import refuse_embeddings, refuse_scores, tune_scores_cli
    from hubless.evaluation import evaluate
    from hubless.tuning import tune

    if validation_scores is not None:
        refuse_embeddings({"--gallery": gallery, "--validation-queries": validation_queries, "--validation-gallery": validation_gallery,
                           "--queries": queries, "--query-bank": query_bank, "--gallery-bank": gallery_bank,
                           "--distractors": distractors})  # fmt: skip
        return tune_scores_cli(
            validation_scores=validation_scores, validation_truth=validation_truth,
            validation_query_bank_scores=validation_query_bank_scores, validation_gallery_bank_scores=validation_gallery_bank_scores,
            validation_query_mask=validation_query_mask, scores=scores, truth=truth, query_bank_scores=query_bank_scores,
            gallery_bank_scores=gallery_bank_scores, query_mask=query_mask, method=method, objective=objective, ks=ks,
            bootstrap=bootstrap, ties=ties, transpose=transpose, out=out, report=report, progress=progress, overwrite=overwrite,
        )  # fmt: skip
    refuse_scores({"--scores": scores, "--query-bank-scores": query_bank_scores, "--gallery-bank-scores": gallery_bank_scores,
                   "--validation-query-bank-scores": validation_query_bank_scores,
                   "--validation-gallery-bank-scores": validation_gallery_bank_scores, "--query-mask": query_mask,
                   "--validation-query-mask": validation_query_mask, "--transpose": transpose})  # fmt: skip
    if gallery is None or validation_queries is None:
        raise typer.BadParameter("give --gallery and --validation-queries (embeddings), or --validation-scores (a score matrix)")

    banks = parse_banks(query_bank)
    check_outputs(
        {"--out": out, "--report": report},
        {"--gallery": gallery, "--validation-queries": validation_queries, "--validation-truth": validation_truth,
         "--validation-gallery": validation_gallery, "--queries": queries, "--truth": truth, "--gallery-bank": gallery_bank,
         "--distractors": distractors, **{f"--query-bank {n}".strip(): p for n, p in (banks or {}).items()}},
        overwrite=overwrite,
    )  # fmt: skip
    if report is not None:
        from hubless.errors import check_available

        check_available("matplotlib", "--report", "report")
    if banks is not None and (len(banks) > 1 or "" not in banks):  # named banks: the robustness protocol
        if report is not None or queries is None or truth is None:
            raise InvalidInput(
                "with several named query banks, tune needs --queries and --truth and writes tables and --out JSON (no --report)"
            )
        return _tune_banks(gallery, validation_queries, validation_truth, validation_gallery, queries, truth, banks, gallery_bank,
                           distractors, method, objective, ks, bootstrap, normalize, out, progress, ties)  # fmt: skip
    query_bank = None if not banks else banks[""]
    g = load(gallery, "gallery", normalize=normalize)
    dim = g.shape[1]
    vg = load(validation_gallery, "validation gallery", normalize=normalize, dim=dim)
    vq = load(validation_queries, "validation queries", normalize=normalize, dim=dim)
    q = load(queries, "queries", normalize=normalize, dim=dim)
    qb = load(query_bank, "query bank", normalize=normalize, dim=dim)
    gb = load(gallery_bank, "gallery bank", normalize=normalize, dim=dim)
    extra = load(distractors, "distractors", normalize=normalize, dim=dim)
    k_list = parse_ints(ks, "--ks")
    if truth is not None and q is None:
        raise typer.BadParameter("--truth needs --queries")
    if extra is not None and truth is None:
        raise typer.BadParameter("--distractors enlarge the test gallery: they need --queries and --truth")
    tuned = tune(vg if vg is not None else g, vq, validation_truth, qb, method, gallery_bank=gb, test_queries=q,
                 objective=objective, ks=k_list, normalize=normalize, progress=progress, ties=ties, coverage=True)  # fmt: skip
    console = wide_console()
    table = Table(title=f"chosen on {vq.shape[0]} validation queries ({objective})")
    for col in ("method", "chosen", f"validation {objective}", "grid points"):
        table.add_column(col, justify="left" if col in ("method", "chosen") else "right")
    for m, b in tuned.best.items():
        table.add_row(m, b.spec, f"{b.value:.2f}", str(len(tuned.tables[m])))
    console.print(table)
    for m, b in tuned.best.items():
        if b.at_edge:
            print_note(f"{m}: {', '.join(b.at_edge)} chosen at the edge of the grid; the best value may lie beyond it")
    ev = None
    if truth is not None:
        from hubless.cli._common import print_results

        # tuned on the test gallery itself: the chosen corrections are used as fitted (the bank is not read again)
        chosen = list(tuned.fitted.values()) if vg is None and extra is None else tuned.best_specs
        ev = evaluate(g, q, truth, qb, chosen, gallery_bank=gb, ks=k_list, bootstrap=bootstrap, normalize=normalize,
                      progress=progress, distractors=extra, ties=ties, refit=False)  # fmt: skip
        size = f"{g.shape[0]} items" if extra is None else f"{g.shape[0]} items + {extra.shape[0]} distractors"
        print_results(ev, f"test: {q.shape[0]} queries over {size}, chosen parameters")
    # measured: on the test queries when given, else on the validation split
    warn_coverage(tuned.bank, ev.losses() if ev is not None else tuned.losses(), f"R@{ev.ks[0]}" if ev is not None else objective)
    if out is not None:
        data = tuned.to_dict()
        if ev is not None:
            data["test"] = ev.to_dict()
        write_json(out, {**generator_mark(), **data})
        typer.echo(f"results: {out}")
    if report is not None:
        from hubless.reports.evaluation import tune_report

        tune_report(tuned, report, ev)
        typer.echo(f"report: {report}")


def _tune_banks(gallery, val_queries, val_truth, val_gallery, queries, truth, banks, gallery_bank, distractors, method, objective, ks,
                bootstrap, normalize, out, progress, ties="index") -> None:  # fmt: skip
    """Tune and test with each named bank (hubless.tuning.tune_banks)."""
    from hubless.cli.eval import print_banks
    from hubless.tuning import tune_banks

    g = load(gallery, "gallery", normalize=normalize)
    dim = g.shape[1]
    result = tune_banks(
        g, load(val_queries, "validation queries", normalize=normalize, dim=dim), val_truth,
        {name: load(path, f"query bank {name}", normalize=normalize, dim=dim) for name, path in banks.items()}, method,
        queries=load(queries, "queries", normalize=normalize, dim=dim), truth=truth,
        val_gallery=load(val_gallery, "validation gallery", normalize=normalize, dim=dim),
        gallery_bank=load(gallery_bank, "gallery bank", normalize=normalize, dim=dim), objective=objective, ks=parse_ints(ks, "--ks"),
        bootstrap=bootstrap, normalize=normalize, distractors=load(distractors, "distractors", normalize=normalize, dim=dim), progress=progress,
        ties=ties,
    )  # fmt: skip
    for name, tuned in (result.tuned or {}).items():
        typer.echo(f"bank {name}: chosen {', '.join(tuned.best_specs)}")
    print_banks(result, out)
