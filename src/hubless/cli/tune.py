"""``hubless tune``: choose each correction's parameters on a validation split, then test them:
on embeddings, with several named query banks, or on score matrices (``--validation-scores``).
One options object per mode (:mod:`hubless.cli.modes`): this module holds the command and the
embeddings mode; the others are in :mod:`hubless.cli.named_banks` and :mod:`hubless.cli.score_matrices`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import typer

from hubless.cli import eval_options as o
from hubless.cli._common import check_outputs, friendly_errors, load, parse_ints, print_results, warn_coverage, write_tuning
from hubless.cli.modes import Mode, choose_mode
from hubless.cli.named_banks import BankTune, bank_inputs, parse_banks
from hubless.cli.score_matrices import ScoreTune, print_choice


@friendly_errors
def tune_command(
    ctx: typer.Context,
    gallery: Path = o.TUNE_GALLERY,
    validation_queries: Path = o.VALIDATION_QUERIES,
    validation_truth: str = o.VALIDATION_TRUTH,
    validation_gallery: Path = o.VALIDATION_GALLERY,
    queries: Path = o.TEST_QUERIES,
    truth: str = o.TEST_TRUTH,
    query_bank: list[str] = o.TUNE_QUERY_BANK,
    gallery_bank: Path = o.GALLERY_BANK,
    distractors: Path = o.DISTRACTORS,
    normalize: bool = o.NORMALIZE,
    validation_scores: Path = o.VALIDATION_SCORES,
    validation_query_bank_scores: Path = o.VALIDATION_QUERY_BANK_SCORES,
    validation_gallery_bank_scores: Path = o.VALIDATION_GALLERY_BANK_SCORES,
    validation_query_mask: Path = o.VALIDATION_QUERY_MASK,
    scores: Path = o.TUNE_SCORES,
    query_bank_scores: Path = o.QUERY_BANK_SCORES,
    gallery_bank_scores: Path = o.GALLERY_BANK_SCORES,
    query_mask: Path = o.QUERY_MASK,
    transpose: bool = o.TRANSPOSE,
    method: list[str] = o.TUNE_METHODS,
    objective: str = o.OBJECTIVE,
    ks: str = o.KS,
    bootstrap: int = o.TEST_BOOTSTRAP,
    ties: str = o.TIES,
    out: Path = o.TUNE_OUT,
    report: Path = o.TUNE_REPORT,
    progress: bool = o.PROGRESS,
    overwrite: bool = o.OVERWRITE,
) -> None:
    """Grid-search each method on the validation split (never on the test queries) and report
    the chosen parameters; with --queries and --truth, evaluate them on the test queries.
    With several --query-bank NAME=PATH, with each bank; with --validation-scores, the same
    from score matrices (docs/score-matrices.md). An option of another mode is refused."""
    values = {name: value for name, value in locals().items() if name != "ctx"}
    choose_mode(ctx, TUNE_MODES, values).run()


@dataclass(frozen=True)
class EmbeddingTune(Mode):
    """``hubless tune --gallery G --validation-queries VQ --validation-truth VT``: the library's
    :func:`hubless.tune`, then :func:`hubless.evaluate` of the choice on ``--queries``."""

    what: ClassVar[str] = "embeddings"
    needs: ClassVar[tuple[str, ...]] = ("gallery", "validation_queries")

    gallery: Path
    validation_queries: Path
    validation_truth: str
    validation_gallery: Path | None
    queries: Path | None
    truth: str | None
    query_bank: list[str] | None
    gallery_bank: Path | None
    distractors: Path | None
    normalize: bool
    method: list[str]
    objective: str
    ks: str
    bootstrap: int
    ties: str
    out: Path | None
    report: Path | None
    progress: bool | None
    overwrite: bool

    def run(self) -> None:
        from hubless.evaluation import evaluate
        from hubless.tuning import tune

        banks = parse_banks(self.query_bank)
        check_outputs({"--out": self.out, "--report": self.report}, {**self._inputs(), **bank_inputs(banks)}, overwrite=self.overwrite)
        self._check()
        g = load(self.gallery, "gallery", normalize=self.normalize)
        paths = {"validation gallery": self.validation_gallery, "validation queries": self.validation_queries}
        paths |= {"queries": self.queries, "query bank": None if not banks else banks[""]}
        paths |= {"gallery bank": self.gallery_bank, "distractors": self.distractors}
        a = {name: load(path, name, normalize=self.normalize, dim=g.shape[1]) for name, path in paths.items()}
        k_list = parse_ints(self.ks, "--ks")
        tuned = tune(
            g if a["validation gallery"] is None else a["validation gallery"],
            a["validation queries"],
            self.validation_truth,
            a["query bank"],
            self.method,
            gallery_bank=a["gallery bank"],
            test_queries=a["queries"],
            objective=self.objective,
            ks=k_list,
            normalize=self.normalize,
            progress=self.progress,
            ties=self.ties,
            coverage=True,
        )
        print_choice(tuned, f"chosen on {a['validation queries'].shape[0]} validation queries ({self.objective})", self.objective)
        ev = None
        if self.truth is not None:
            # tuned on the test gallery itself: the chosen corrections are used as fitted (the bank is not read again)
            same = a["validation gallery"] is None and a["distractors"] is None
            ev = evaluate(
                g,
                a["queries"],
                self.truth,
                a["query bank"],
                list(tuned.fitted.values()) if same else tuned.best_specs,
                gallery_bank=a["gallery bank"],
                ks=k_list,
                bootstrap=self.bootstrap,
                normalize=self.normalize,
                progress=self.progress,
                distractors=a["distractors"],
                ties=self.ties,
                refit=False,
            )
            extra = "" if a["distractors"] is None else f" + {a['distractors'].shape[0]} distractors"
            print_results(ev, f"test: {a['queries'].shape[0]} queries over {g.shape[0]} items{extra}, chosen parameters")
        # measured: on the test queries when given, else on the validation split
        losses, metric = (tuned.losses(), self.objective) if ev is None else (ev.losses(), f"R@{ev.ks[0]}")
        warn_coverage(tuned.bank, losses, metric)
        write_tuning(tuned, ev, self.out, self.report, self.progress)

    def _inputs(self) -> dict[str, object]:
        return {
            "--gallery": self.gallery,
            "--validation-queries": self.validation_queries,
            "--validation-truth": self.validation_truth,
            "--validation-gallery": self.validation_gallery,
            "--queries": self.queries,
            "--truth": self.truth,
            "--gallery-bank": self.gallery_bank,
            "--distractors": self.distractors,
        }

    def _check(self) -> None:
        if self.report is not None:
            from hubless.errors import check_available

            check_available("matplotlib", "--report", "report")
        if self.truth is not None and self.queries is None:
            raise typer.BadParameter("--truth needs --queries")
        if self.distractors is not None and self.truth is None:
            raise typer.BadParameter("--distractors enlarge the test gallery: they need --queries and --truth")


#: The modes of ``hubless tune``, the first one the values select is run (embeddings: the rest).
TUNE_MODES: list[type[Mode]] = [ScoreTune, BankTune, EmbeddingTune]
