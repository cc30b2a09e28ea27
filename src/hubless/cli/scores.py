"""Score-matrix mode of ``hubless eval`` and ``hubless tune``, and ``hubless correct``.

Thin layers over :mod:`hubless.scores`: the matrices are memory-mapped (or read safely from the
QB-Norm authors' .pkl files), the banks are read in one pass each, S in row blocks.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.table import Table

from hubless.cli._common import (
    METHOD_HELP,
    OVERWRITE_HELP,
    check_outputs,
    describe_file,
    friendly_errors,
    generator_mark,
    parse_ints,
    print_note,
    wide_console,
)
from hubless.errors import InvalidInput

if TYPE_CHECKING:
    from hubless.evaluation import JSONValue

TIES_HELP = (
    "How tied scores rank: index (the lower gallery index first, hubless's rule), average (the mean of the tied positions: "
    "the collaborative-experts metric of the QB-Norm tables) or optimistic (tied relevant items first); several relevant items tied together never cost a hit."
)
TRANSPOSE_HELP = (
    "Every score matrix is stored the other way round (gallery x queries, e.g. a text x video matrix evaluated video->text; "
    "bank matrices gallery x bank): read them transposed. Truth follows the queries, e.g. i2t:20."
)
MASK_HELP = (
    "One boolean per stored row of --scores (.npy/.pkl; the authors' test_query_masks): False rows are padding (MSR-VTT has two "
    "videos with 19 of 20 captions). Left out as queries; with --transpose, removed from the gallery."
)


def load_matrix(path: Path | None, name: str):
    """A score matrix file (None passes through), memory-mapped when the format allows."""
    if path is None:
        return None
    from hubless.scores import load_scores

    return load_scores(path, name)


def load_query_mask(path: Path | None, scores):
    if path is None:
        return None
    from hubless.scores import load_mask

    return load_mask(path, scores.shape[0])


def refuse_embeddings(flags: dict[str, object]) -> None:
    """Score-matrix mode: refuse the options that take embeddings."""
    given = [flag for flag, value in flags.items() if value]
    if given:
        raise InvalidInput(f"--scores evaluates score matrices; {', '.join(given)} take embeddings: give one kind of input")


def refuse_scores(flags: dict[str, object]) -> None:
    """Embedding mode: refuse the options that only apply to score matrices."""
    given = [flag for flag, value in flags.items() if value]
    if given:
        raise InvalidInput(f"{', '.join(given)} only apply to score matrices: pass --scores (or drop them)")


def eval_scores(
    *, scores: Path, truth: str, query_bank_scores: Path | None, gallery_bank_scores: Path | None, method: list[str], ks: str,
    bootstrap: int, seed: int, ties: str, query_mask: Path | None, transpose: bool, out: Path | None, report: Path | None,
    progress: bool | None, overwrite: bool,
) -> None:  # fmt: skip
    """``hubless eval --scores``: fit on the bank score matrices, rank the rows of S, report."""
    from hubless._io import write_json
    from hubless.cli._common import print_results
    from hubless.errors import check_available
    from hubless.scores import evaluate_scores

    check_outputs(
        {"--out": out, "--report": report},
        {"--scores": scores, "--truth": truth, "--query-bank-scores": query_bank_scores, "--gallery-bank-scores": gallery_bank_scores,
         "--query-mask": query_mask},
        overwrite=overwrite,
    )  # fmt: skip
    if report is not None:
        check_available("matplotlib", "--report", "report")
    s = load_matrix(scores, "scores")
    sb = load_matrix(query_bank_scores, "query bank scores")
    sg = load_matrix(gallery_bank_scores, "gallery bank scores")
    mask = load_query_mask(query_mask, s)
    files: dict[str, JSONValue] = {
        name: describe_file(path, arr)
        for name, path, arr in (("scores", scores, s), ("query_bank_scores", query_bank_scores, sb), ("gallery_bank_scores", gallery_bank_scores, sg))
        if path is not None
    }  # fmt: skip
    files["truth"] = truth
    ev = evaluate_scores(
        s, truth, sb, method, gallery_bank_scores=sg, ks=parse_ints(ks, "--ks"), bootstrap=bootstrap, seed=seed, ties=ties,
        query_mask=mask, transpose=transpose, progress=progress, inputs={"files": files},
    )  # fmt: skip
    masked = f", {ev.inputs['n_masked']} masked rows" if ev.inputs["n_masked"] else ""
    print_results(ev, f"{ev.n_queries} queries over {ev.n_gallery} items (score matrices, ties: {ties}{masked})")
    if out is not None:
        write_json(out, {**generator_mark(), **ev.to_dict()})
        typer.echo(f"results: {out}")
    if report is not None:
        from hubless.reports.evaluation import evaluation_report

        evaluation_report(ev, report)
        typer.echo(f"report: {report}")


def tune_scores_cli(
    *, validation_scores: Path, validation_truth: str, validation_query_bank_scores: Path | None,
    validation_gallery_bank_scores: Path | None, validation_query_mask: Path | None, scores: Path | None, truth: str | None,
    query_bank_scores: Path | None, gallery_bank_scores: Path | None, query_mask: Path | None, method: list[str], objective: str,
    ks: str, bootstrap: int, ties: str, transpose: bool, out: Path | None, report: Path | None, progress: bool | None, overwrite: bool,
) -> None:  # fmt: skip
    """``hubless tune --validation-scores``: choose on validation score rows, then test."""
    from hubless._io import write_json
    from hubless.scores import evaluate_scores, tune_scores

    check_outputs(
        {"--out": out, "--report": report},
        {"--validation-scores": validation_scores, "--validation-truth": validation_truth, "--scores": scores, "--truth": truth,
         "--query-bank-scores": query_bank_scores, "--gallery-bank-scores": gallery_bank_scores,
         "--validation-query-bank-scores": validation_query_bank_scores, "--validation-gallery-bank-scores": validation_gallery_bank_scores},
        overwrite=overwrite,
    )  # fmt: skip
    if report is not None:
        from hubless.errors import check_available

        check_available("matplotlib", "--report", "report")
    if truth is not None and scores is None:
        raise typer.BadParameter("--truth needs --scores (the test queries' score matrix)")
    vs = load_matrix(validation_scores, "validation scores")
    s = load_matrix(scores, "scores")
    sb = load_matrix(query_bank_scores, "query bank scores")
    sg = load_matrix(gallery_bank_scores, "gallery bank scores")
    vsb = load_matrix(validation_query_bank_scores, "validation query bank scores") if validation_query_bank_scores else sb
    vsg = load_matrix(validation_gallery_bank_scores, "validation gallery bank scores") if validation_gallery_bank_scores else sg
    k_list = parse_ints(ks, "--ks")
    tuned = tune_scores(
        vs, validation_truth, vsb, method, gallery_bank_scores=vsg, test_scores=s, objective=objective, ks=k_list, ties=ties,
        query_mask=load_query_mask(validation_query_mask, vs), transpose=transpose, progress=progress,
    )  # fmt: skip
    n_val = vs.shape[1] if transpose else vs.shape[0]
    table = Table(title=f"chosen on {n_val} validation queries ({objective}, ties: {ties})")
    for col in ("method", "chosen", f"validation {objective}", "grid points"):
        table.add_column(col, justify="left" if col in ("method", "chosen") else "right")
    for m, b in tuned.best.items():
        table.add_row(m, b.spec, f"{b.value:.2f}", str(len(tuned.tables[m])))
    wide_console().print(table)
    for m, b in tuned.best.items():
        if b.at_edge:
            print_note(f"{m}: {', '.join(b.at_edge)} chosen at the edge of the grid; the best value may lie beyond it")
    ev = None
    if truth is not None:
        from hubless.cli._common import print_results

        ev = evaluate_scores(
            s, truth, sb, tuned.best_specs, gallery_bank_scores=sg, ks=k_list, bootstrap=bootstrap, ties=ties,
            query_mask=load_query_mask(query_mask, s), transpose=transpose, progress=progress,
        )  # fmt: skip
        print_results(ev, f"test: {ev.n_queries} queries over {ev.n_gallery} items, chosen parameters")
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


@friendly_errors
def correct_command(
    scores: Path = typer.Option(..., help="Query x gallery scores to correct (.npy memory-mapped, .npz, or the authors' .pkl)."),
    query_bank_scores: Path = typer.Option(None, help="Query bank x gallery scores (reference queries, disjoint from the test queries)."),
    gallery_bank_scores: Path = typer.Option(None, help="Gallery bank x gallery scores (reference items of the gallery's modality): DualIS/DualDIS."),
    method: str = typer.Option("dis", "--method", "-m", help=METHOD_HELP.replace(", repeatable", "")),
    out: Path = typer.Option(..., help="Where to write: the corrected matrix (.npy, float32), or with --top-k the best ids and scores (.npz)."),
    top_k: int = typer.Option(None, help="Write only each query's best K (ids and scores, best first) instead of the whole matrix."),
    values: str = typer.Option("method", help="method: each method's own scores (QB-Norm's exp(beta s) / sum_b exp(beta s(b, r)), as the authors' qb_norm returns); ranking: the scores it ranks by (s - bias, never overflows)."),
    transpose: bool = typer.Option(False, "--transpose", help=TRANSPOSE_HELP.rsplit(" Truth", 1)[0] + " The output is queries x gallery."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:  # fmt: skip
    """Correct a score matrix with a method fitted on the bank score matrices and write it: a
    drop-in for the QB-Norm authors' script in your own pipeline (streamed, bounded memory)."""
    from hubless.scores import correct_scores

    if values not in ("method", "ranking"):
        raise typer.BadParameter(f"--values must be method or ranking; got {values!r}")
    check_outputs(
        {"--out": out},
        {"--scores": scores, "--query-bank-scores": query_bank_scores, "--gallery-bank-scores": gallery_bank_scores},
        overwrite=overwrite,
    )
    s = load_matrix(scores, "scores")
    written = correct_scores(
        s, load_matrix(query_bank_scores, "query bank scores"), method, gallery_bank_scores=load_matrix(gallery_bank_scores, "gallery bank scores"),
        out=out, top_k=top_k, ranking=values == "ranking", transpose=transpose, progress=progress,
    )  # fmt: skip
    n_queries, n_gallery = s.shape[::-1] if transpose else s.shape
    shape = f"top {top_k} of {n_gallery} items for {n_queries} queries" if top_k else f"{n_queries} x {n_gallery}"
    typer.echo(f"corrected ({method}, {values} scores, {shape}): {written}")
