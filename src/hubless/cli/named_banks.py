"""``hubless eval`` and ``hubless tune`` with several named query banks (``--query-bank
NAME=PATH``, repeated): the bank robustness protocol (:mod:`hubless.evaluation.robustness`,
:func:`hubless.tuning.tune_banks`), a table per bank and the geometric mean over banks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import typer
from rich.table import Table

from hubless.cli._common import check_outputs, generator_mark, load, parse_ints, print_note, print_results, wide_console
from hubless.cli.modes import Mode
from hubless.errors import InvalidInput


def parse_banks(values: list[str] | None) -> dict[str, Path] | None:
    """``--query-bank`` values: one unnamed PATH -> {"": PATH}; NAME=PATH (repeatable) -> by name."""
    if not values:
        return None
    banks: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep:
            name, path = "", value
        elif not name.strip() or not path:
            raise InvalidInput(f"--query-bank {value!r}: expected NAME=PATH (or a single PATH)")
        if name in banks:
            raise InvalidInput(f"--query-bank {name or value!r} is given twice")
        banks[name.strip()] = Path(path)
    if "" in banks and len(banks) > 1:
        raise InvalidInput("several --query-bank values must all be named: NAME=PATH")
    return banks


def named(values: dict[str, Any]) -> bool:
    """Whether the command's ``--query-bank`` values name their banks (NAME=PATH)."""
    banks = parse_banks(values.get("query_bank"))
    return banks is not None and "" not in banks


def bank_inputs(banks: dict[str, Path] | None) -> dict[str, Path]:
    """The banks as inputs of :func:`~hubless.cli._common.check_outputs` (by flag)."""
    return {f"--query-bank {name}".strip(): path for name, path in (banks or {}).items()}


@dataclass(frozen=True)
class BankEval(Mode):
    """``hubless eval ... --query-bank A=a.npy --query-bank B=b.npy``."""

    what: ClassVar[str] = "several named query banks"
    selector: ClassVar[str] = "--query-bank NAME=PATH"
    needs: ClassVar[tuple[str, ...]] = ("gallery", "queries", "truth")

    gallery: Path
    queries: Path
    truth: str
    query_bank: list[str]
    gallery_bank: Path | None
    distractors: Path | None
    normalize: bool
    method: list[str]
    ks: str
    bootstrap: int
    seed: int
    ties: str
    out: Path | None
    progress: bool | None
    overwrite: bool

    @classmethod
    def chosen(cls, values: dict[str, Any]) -> bool:
        return named(values)

    def run(self) -> None:
        from hubless.evaluation.robustness import evaluate_banks

        banks = parse_banks(self.query_bank)
        inputs = {"--gallery": self.gallery, "--queries": self.queries, "--truth": self.truth, "--gallery-bank": self.gallery_bank}
        check_outputs({"--out": self.out}, {**inputs, "--distractors": self.distractors, **bank_inputs(banks)}, overwrite=self.overwrite)
        g = load(self.gallery, "gallery", normalize=self.normalize)
        arrays = {n: load(p, n, normalize=self.normalize, dim=g.shape[1]) for n, p in _paths(self).items()}
        assert banks is not None  # named: chosen
        loaded = {name: load(path, f"query bank {name}", normalize=self.normalize, dim=g.shape[1]) for name, path in banks.items()}
        result = evaluate_banks(
            g,
            arrays["queries"],
            self.truth,
            loaded,
            self.method,
            gallery_bank=arrays["gallery bank"],
            ks=parse_ints(self.ks, "--ks"),
            bootstrap=self.bootstrap,
            seed=self.seed,
            normalize=self.normalize,
            distractors=arrays["distractors"],
            progress=self.progress,
            ties=self.ties,
        )
        print_banks(result, self.out)


@dataclass(frozen=True)
class BankTune(Mode):
    """``hubless tune ... --query-bank A=a.npy --query-bank B=b.npy --queries Q --truth T``."""

    what: ClassVar[str] = "several named query banks"
    selector: ClassVar[str] = "--query-bank NAME=PATH"
    needs: ClassVar[tuple[str, ...]] = ("gallery", "validation_queries", "queries", "truth")

    gallery: Path
    validation_queries: Path
    validation_truth: str
    validation_gallery: Path | None
    queries: Path
    truth: str
    query_bank: list[str]
    gallery_bank: Path | None
    distractors: Path | None
    normalize: bool
    method: list[str]
    objective: str
    ks: str
    bootstrap: int
    ties: str
    out: Path | None
    progress: bool | None
    overwrite: bool

    @classmethod
    def chosen(cls, values: dict[str, Any]) -> bool:
        return named(values)

    def run(self) -> None:
        from hubless.tuning import tune_banks

        banks = parse_banks(self.query_bank)
        assert banks is not None  # named: chosen
        inputs: dict[str, object] = {"--gallery": self.gallery, "--validation-queries": self.validation_queries, "--queries": self.queries}
        inputs |= {"--validation-truth": self.validation_truth, "--truth": self.truth, "--validation-gallery": self.validation_gallery}
        inputs |= {"--gallery-bank": self.gallery_bank, "--distractors": self.distractors, **bank_inputs(banks)}
        check_outputs({"--out": self.out}, inputs, overwrite=self.overwrite)
        g = load(self.gallery, "gallery", normalize=self.normalize)
        arrays = {n: load(p, n, normalize=self.normalize, dim=g.shape[1]) for n, p in _paths(self).items()}
        loaded = {name: load(path, f"query bank {name}", normalize=self.normalize, dim=g.shape[1]) for name, path in banks.items()}
        result = tune_banks(
            g,
            arrays["validation queries"],
            self.validation_truth,
            loaded,
            self.method,
            queries=arrays["queries"],
            truth=self.truth,
            val_gallery=arrays["validation gallery"],
            gallery_bank=arrays["gallery bank"],
            objective=self.objective,
            ks=parse_ints(self.ks, "--ks"),
            bootstrap=self.bootstrap,
            normalize=self.normalize,
            distractors=arrays["distractors"],
            progress=self.progress,
            ties=self.ties,
        )
        for name, tuned in (result.tuned or {}).items():
            typer.echo(f"bank {name}: chosen {', '.join(tuned.best_specs)}")
        print_banks(result, self.out)


def _paths(mode: BankEval | BankTune) -> dict[str, Path | None]:
    """The embeddings files of a mode but the gallery and the banks, by the name errors use."""
    names = ("queries", "validation_queries", "validation_gallery", "gallery_bank", "distractors")
    return {name.replace("_", " "): getattr(mode, name) for name in names if hasattr(mode, name)}


def print_banks(result, out: Path | None) -> None:
    """A table per bank (with its coverage), the geometric-mean table, and the JSON."""
    from hubless._atomic import write_json

    for name, ev in result.evaluations.items():
        report = result.reports[name]
        print_results(ev, f"bank {name}: {report.n_bank} queries, coverage {report.coverage:.1%} (relative {report.relative_coverage:.0%})")
        warning = report.warning_after(ev.losses(), f"R@{ev.ks[0]}")
        if warning:
            print_note(f"bank {name}: {warning}", "warning")
    table = Table(title=f"overall: geometric mean over {len(result.evaluations)} banks")
    metrics = list(next(iter(result.overall.values())))
    for col in ("method", *metrics):
        table.add_column(col, justify="left" if col == "method" else "right")
    for spec, values in result.overall.items():
        table.add_row(spec, *(f"{values[m]:.2f}" for m in metrics))
    wide_console().print(table)
    if out is not None:
        write_json(out, {**generator_mark(), **result.to_dict()})
        typer.echo(f"results: {out}")
