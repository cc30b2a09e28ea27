"""The score-matrix modes of ``hubless eval`` and ``hubless tune`` (:mod:`hubless.cli.modes`), and
``hubless correct``.

Thin layers over :mod:`hubless.score_matrices`: the matrices are memory-mapped (or read safely from the
QB-Norm authors' .pkl files), the banks are read in one pass each, S in row blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import typer
from rich.table import Table

from hubless.cli._common import (
    METHOD_HELP,
    OVERWRITE_HELP,
    check_outputs,
    describe_file,
    friendly_errors,
    parse_ints,
    print_note,
    print_results,
    wide_console,
    write_evaluation,
    write_tuning,
)
from hubless.cli.eval_options import TRANSPOSE_HELP
from hubless.cli.modes import Mode
from hubless.errors import check_available

if TYPE_CHECKING:
    from hubless.evaluation import JSONValue


def load_matrix(path: Path | None, name: str):
    """A score matrix file (None passes through), memory-mapped when the format allows."""
    if path is None:
        return None
    from hubless.score_matrices import load_scores

    return load_scores(path, name)


def load_query_mask(path: Path | None, scores):
    if path is None:
        return None
    from hubless.score_matrices import load_mask

    return load_mask(path, scores.shape[0])


@dataclass(frozen=True)
class ScoreEval(Mode):
    """``hubless eval --scores S --truth T``: fit on the bank score matrices, rank the rows of S, report."""

    what: ClassVar[str] = "score matrices"
    selector: ClassVar[str] = "--scores"
    needs: ClassVar[tuple[str, ...]] = ("scores", "truth")

    scores: Path
    truth: str
    query_bank_scores: Path | None
    gallery_bank_scores: Path | None
    query_mask: Path | None
    transpose: bool
    method: list[str]
    ks: str
    bootstrap: int
    seed: int
    ties: str
    out: Path | None
    report: Path | None
    progress: bool | None
    overwrite: bool

    @classmethod
    def chosen(cls, values: dict[str, Any]) -> bool:
        return values["scores"] is not None

    def run(self) -> None:
        from hubless.score_matrices import evaluate_scores

        paths = {"scores": self.scores, "query_bank_scores": self.query_bank_scores, "gallery_bank_scores": self.gallery_bank_scores}
        inputs = {f"--{name.replace('_', '-')}": path for name, path in paths.items()}
        check_outputs(
            {"--out": self.out, "--report": self.report},
            {**inputs, "--truth": self.truth, "--query-mask": self.query_mask},
            overwrite=self.overwrite,
        )
        if self.report is not None:
            check_available("matplotlib", "--report", "report")
        matrices = {name: load_matrix(path, name.replace("_", " ")) for name, path in paths.items()}
        files: dict[str, JSONValue] = {name: describe_file(path, matrices[name]) for name, path in paths.items() if path is not None}
        ev = evaluate_scores(
            matrices["scores"],
            self.truth,
            matrices["query_bank_scores"],
            self.method,
            gallery_bank_scores=matrices["gallery_bank_scores"],
            ks=parse_ints(self.ks, "--ks"),
            bootstrap=self.bootstrap,
            seed=self.seed,
            ties=self.ties,
            query_mask=load_query_mask(self.query_mask, matrices["scores"]),
            transpose=self.transpose,
            progress=self.progress,
            inputs={"files": {**files, "truth": self.truth}},
        )
        masked = f", {ev.inputs['n_masked']} masked rows" if ev.inputs["n_masked"] else ""
        print_results(ev, f"{ev.n_queries} queries over {ev.n_gallery} items (score matrices, ties: {self.ties}{masked})")
        write_evaluation(ev, self.out, self.report, self.progress)


@dataclass(frozen=True)
class ScoreTune(Mode):
    """``hubless tune --validation-scores V --validation-truth VT``: choose on validation score
    rows, then, with ``--scores`` and ``--truth``, test."""

    what: ClassVar[str] = "score matrices"
    selector: ClassVar[str] = "--validation-scores"
    needs: ClassVar[tuple[str, ...]] = ("validation_scores", "validation_truth")

    validation_scores: Path
    validation_truth: str
    validation_query_bank_scores: Path | None
    validation_gallery_bank_scores: Path | None
    validation_query_mask: Path | None
    scores: Path | None
    truth: str | None
    query_bank_scores: Path | None
    gallery_bank_scores: Path | None
    query_mask: Path | None
    transpose: bool
    method: list[str]
    objective: str
    ks: str
    bootstrap: int
    ties: str
    out: Path | None
    report: Path | None
    progress: bool | None
    overwrite: bool

    @classmethod
    def chosen(cls, values: dict[str, Any]) -> bool:
        return values["validation_scores"] is not None

    def run(self) -> None:
        from hubless.score_matrices import evaluate_scores, tune_scores

        names = (
            "validation_scores",
            "scores",
            "query_bank_scores",
            "gallery_bank_scores",
            "validation_query_bank_scores",
            "validation_gallery_bank_scores",
        )
        paths = {name: getattr(self, name) for name in names}
        inputs = {f"--{name.replace('_', '-')}": path for name, path in paths.items()}
        check_outputs(
            {"--out": self.out, "--report": self.report},
            {**inputs, "--validation-truth": self.validation_truth, "--truth": self.truth},
            overwrite=self.overwrite,
        )
        if self.report is not None:
            check_available("matplotlib", "--report", "report")
        if self.truth is not None and self.scores is None:
            raise typer.BadParameter("--truth needs --scores (the test queries' score matrix)")
        m = {name: load_matrix(path, name.replace("_", " ")) for name, path in paths.items()}
        k_list = parse_ints(self.ks, "--ks")
        tuned = tune_scores(
            m["validation_scores"],
            self.validation_truth,
            m["query_bank_scores"] if m["validation_query_bank_scores"] is None else m["validation_query_bank_scores"],
            self.method,
            gallery_bank_scores=m["gallery_bank_scores"]
            if m["validation_gallery_bank_scores"] is None
            else m["validation_gallery_bank_scores"],
            test_scores=m["scores"],
            objective=self.objective,
            ks=k_list,
            ties=self.ties,
            query_mask=load_query_mask(self.validation_query_mask, m["validation_scores"]),
            transpose=self.transpose,
            progress=self.progress,
        )
        n_val = m["validation_scores"].shape[1 if self.transpose else 0]
        print_choice(tuned, f"chosen on {n_val} validation queries ({self.objective}, ties: {self.ties})", self.objective)
        ev = None
        if self.truth is not None:
            ev = evaluate_scores(
                m["scores"],
                self.truth,
                m["query_bank_scores"],
                tuned.best_specs,
                gallery_bank_scores=m["gallery_bank_scores"],
                ks=k_list,
                bootstrap=self.bootstrap,
                ties=self.ties,
                query_mask=load_query_mask(self.query_mask, m["scores"]),
                transpose=self.transpose,
                progress=self.progress,
            )
            print_results(ev, f"test: {ev.n_queries} queries over {ev.n_gallery} items, chosen parameters")
        write_tuning(tuned, ev, self.out, self.report, self.progress)


def print_choice(tuned, title: str, objective: str) -> None:
    """The parameters chosen per method (a table), and a note for each chosen at a grid's edge."""
    table = Table(title=title)
    for col in ("method", "chosen", f"validation {objective}", "grid points"):
        table.add_column(col, justify="left" if col in ("method", "chosen") else "right")
    for m, b in tuned.best.items():
        table.add_row(m, b.spec, f"{b.value:.2f}", str(len(tuned.tables[m])))
    wide_console().print(table)
    for m, b in tuned.best.items():
        if b.at_edge:
            print_note(f"{m}: {', '.join(b.at_edge)} chosen at the edge of the grid; the best value may lie beyond it")


@friendly_errors
def correct_command(
    scores: Path = typer.Option(..., help="Query x gallery scores to correct (.npy memory-mapped, .npz, or the authors' .pkl)."),
    query_bank_scores: Path = typer.Option(None, help="Query bank x gallery scores (reference queries, disjoint from the test queries)."),
    gallery_bank_scores: Path = typer.Option(
        None, help="Gallery bank x gallery scores (reference items of the gallery's modality): DualIS/DualDIS."
    ),
    method: str = typer.Option("dis", "--method", "-m", help=METHOD_HELP.replace(", repeatable", "")),
    out: Path = typer.Option(
        ..., help="Where to write: the corrected matrix (.npy, float32), or with --top-k the best ids and scores (.npz)."
    ),
    top_k: int = typer.Option(None, help="Write only each query's best K (ids and scores, best first) instead of the whole matrix."),
    values: str = typer.Option(
        "method",
        help="method: each method's own scores (QB-Norm's exp(beta s) / sum_b exp(beta s(b, r)), as the authors' qb_norm returns); ranking: the scores it ranks by (s - bias, never overflows).",
    ),
    transpose: bool = typer.Option(False, "--transpose", help=TRANSPOSE_HELP.rsplit(" Truth", 1)[0] + " The output is queries x gallery."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:
    """Correct a score matrix with a method fitted on the bank score matrices and write it: a
    drop-in for the QB-Norm authors' script in your own pipeline (streamed, bounded memory)."""
    from hubless.score_matrices import correct_scores

    if values not in ("method", "ranking"):
        raise typer.BadParameter(f"--values must be method or ranking; got {values!r}")
    check_outputs(
        {"--out": out},
        {"--scores": scores, "--query-bank-scores": query_bank_scores, "--gallery-bank-scores": gallery_bank_scores},
        overwrite=overwrite,
    )
    s = load_matrix(scores, "scores")
    written = correct_scores(
        s,
        load_matrix(query_bank_scores, "query bank scores"),
        method,
        gallery_bank_scores=load_matrix(gallery_bank_scores, "gallery bank scores"),
        out=out,
        top_k=top_k,
        ranking=values == "ranking",
        transpose=transpose,
        progress=progress,
    )
    n_queries, n_gallery = s.shape[::-1] if transpose else s.shape
    shape = f"top {top_k} of {n_gallery} items for {n_queries} queries" if top_k else f"{n_queries} x {n_gallery}"
    typer.echo(f"corrected ({method}, {values} scores, {shape}): {written}")
