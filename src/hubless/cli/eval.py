"""``hubless eval``: measure corrections on your embeddings (R@K, ranks, CIs, hubness), on score
matrices (``--scores``), with several named query banks, or an attached collection's search
(``--attached``). One options object per mode (:mod:`hubless.cli.modes`): this module holds the
command and the embeddings mode; the others are in :mod:`hubless.cli.score_matrices`,
:mod:`hubless.cli.named_banks` and :mod:`hubless.cli.eval_attached`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import typer
from rich.table import Table

from hubless.cli import eval_options as o
from hubless.cli._common import (
    check_outputs,
    deprecated_flag,
    describe_file,
    friendly_errors,
    load,
    parse_ints,
    print_results,
    warn_coverage,
    wide_console,
    write_evaluation,
)
from hubless.cli.eval_attached import AttachedEval
from hubless.cli.modes import Mode, choose_mode
from hubless.cli.named_banks import BankEval, bank_inputs, parse_banks
from hubless.cli.score_matrices import ScoreEval
from hubless.errors import InvalidInput


@friendly_errors
def eval_command(
    ctx: typer.Context,
    gallery: Path = o.GALLERY,
    queries: Path = o.QUERIES,
    truth: str = o.TRUTH,
    query_bank: list[str] = o.QUERY_BANK,
    gallery_bank: Path = o.GALLERY_BANK,
    distractors: Path = o.DISTRACTORS,
    normalize: bool = o.NORMALIZE,
    scores: Path = o.EVAL_SCORES,
    query_bank_scores: Path = o.QUERY_BANK_SCORES,
    gallery_bank_scores: Path = o.GALLERY_BANK_SCORES,
    query_mask: Path = o.QUERY_MASK,
    transpose: bool = o.TRANSPOSE,
    attached: Path = o.SIDECAR,
    candidates: int = o.CANDIDATES,
    max_candidates: int = o.MAX_CANDIDATES,
    nprobe: int = o.NPROBE,
    ef_search: int = o.EF_SEARCH,
    weight: float = o.WEIGHT,
    rerank: str = o.RERANK_MODEL,
    rerank_k: int = o.RERANK_K,
    fusion: str = o.FUSION,
    fusion_weight: float = o.FUSION_WEIGHT,
    lam: float = o.LAM,
    gallery_items: Path = o.GALLERY_ITEMS,
    query_items: Path = o.QUERY_ITEMS,
    eccv: bool = o.ECCV,
    method: list[str] = o.METHODS,
    ks: str = o.KS,
    bootstrap: int = o.BOOTSTRAP,
    seed: int = o.SEED,
    ties: str = o.TIES,
    out: Path = o.OUT,
    report: Path = o.REPORT,
    progress: bool = o.PROGRESS,
    overwrite: bool = o.OVERWRITE,
) -> None:
    """Fit each correction on the banks, rank the queries and report R@K, MdR, MnR, MRR, mAP@R,
    bootstrap CIs, the change vs the baseline and hubness. The baseline is always included.
    With --scores, the same from score matrices (docs/score-matrices.md); with several
    --query-bank NAME=PATH, with each bank and the geometric mean over them; with --attached, an
    attached collection's search against exact search (docs/attach.md). An option of another
    mode than the one given is refused."""
    values = {name: value for name, value in locals().items() if name != "ctx"}
    choose_mode(ctx, EVAL_MODES, values).run()


@dataclass(frozen=True)
class EmbeddingEval(Mode):
    """``hubless eval --gallery G --queries Q --truth T``: the library's :func:`hubless.evaluate`,
    optionally with the ECCV Caption metrics (``--eccv``) and a cross-encoder (``--rerank``)."""

    what: ClassVar[str] = "embeddings"
    needs: ClassVar[tuple[str, ...]] = ("gallery", "queries", "truth")

    gallery: Path
    queries: Path
    truth: str
    query_bank: list[str] | None
    gallery_bank: Path | None
    distractors: Path | None
    normalize: bool
    method: list[str]
    ks: str
    bootstrap: int
    seed: int
    ties: str
    rerank: str | None
    rerank_k: int
    fusion: str | None
    fusion_weight: float | None
    lam: float | None
    gallery_items: Path | None
    query_items: Path | None
    eccv: bool
    out: Path | None
    report: Path | None
    progress: bool | None
    overwrite: bool

    def run(self) -> None:
        from hubless.evaluation import evaluate

        fusion_weight = deprecated_flag(self.fusion_weight, self.lam, "--lam", "--fusion-weight")
        banks = parse_banks(self.query_bank)
        paths = {
            "gallery": self.gallery,
            "queries": self.queries,
            "query_bank": None if not banks else banks[""],
            "gallery_bank": self.gallery_bank,
            "distractors": self.distractors,
        }
        check_outputs({"--out": self.out, "--report": self.report}, {**self._inputs(), **bank_inputs(banks)}, overwrite=self.overwrite)
        reranker = self._checked()
        g = load(self.gallery, "gallery", normalize=self.normalize)
        arrays = {"gallery": g}
        arrays |= {n: load(p, n.replace("_", " "), normalize=self.normalize, dim=g.shape[1]) for n, p in paths.items() if n != "gallery"}
        q, qb, gb, extra = (arrays[name] for name in ("queries", "query_bank", "gallery_bank", "distractors"))
        files = {name: describe_file(path, arrays[name]) for name, path in paths.items() if path is not None}
        ev = evaluate(
            g,
            q,
            self.truth,
            qb,
            self.method,
            gallery_bank=gb,
            ks=parse_ints(self.ks, "--ks"),
            bootstrap=self.bootstrap,
            seed=self.seed,
            normalize=self.normalize,
            progress=self.progress,
            inputs={"files": {**files, "truth": self.truth}},
            distractors=extra,
            ties=self.ties,
            coverage=True,
        )
        size = f"{g.shape[0]} items" if extra is None else f"{g.shape[0]} items + {extra.shape[0]} distractors"
        print_results(ev, f"{q.shape[0]} queries over {size}")
        warn_coverage(ev.bank, ev.losses(), f"R@{ev.ks[0]}")
        if self.eccv:
            _eccv(ev, q, qb, gb, self.progress)
        if reranker is not None:
            _rerank(ev, q, self, reranker, 0.1 if fusion_weight is None else fusion_weight)
        write_evaluation(ev, self.out, self.report, self.progress)

    def _inputs(self) -> dict[str, object]:
        return {
            "--gallery": self.gallery,
            "--queries": self.queries,
            "--truth": self.truth,
            "--gallery-bank": self.gallery_bank,
            "--gallery-items": self.gallery_items,
            "--query-items": self.query_items,
            "--distractors": self.distractors,
        }

    def _checked(self):
        """Everything that can fail without computing anything; the reranker when asked for."""
        from hubless.errors import check_available

        if self.report is not None:
            check_available("matplotlib", "--report", "report")
        if self.distractors is not None and (self.eccv or self.rerank):
            raise InvalidInput("--distractors cannot be combined with --eccv or --rerank (they assume the gallery as given)")
        if self.eccv:
            check_available("eccv_caption", "--eccv", "eccv", "eccv-caption")
            if self.gallery_bank is None:
                raise typer.BadParameter("--eccv evaluates image->text too, which needs an image bank: pass --gallery-bank")
        if not self.rerank:
            return None
        if self.gallery_items is None or self.query_items is None:
            raise typer.BadParameter("--rerank needs --gallery-items and --query-items (what the cross-encoder reads)")
        from hubless.rerank import load_reranker

        return load_reranker(self.rerank)


#: The modes of ``hubless eval``, the first one the values select is run (embeddings: the rest).
EVAL_MODES: list[type[Mode]] = [AttachedEval, ScoreEval, BankEval, EmbeddingEval]


def _eccv(ev, captions, caption_bank, image_bank, progress) -> None:
    """Add ECCV Caption / CxC metrics to each result (both directions) and print them."""
    from hubless.evaluation.eccv import eccv_evaluation

    scores = eccv_evaluation(ev, captions, caption_bank, image_bank, progress=progress)
    table = Table(title="ECCV Caption (Chun et al. 2022) and CxC, percent: text->image / image->text")
    names = ["eccv_map_at_r", "eccv_rprecision", "eccv_r1", "cxc_r1", "coco_5k_r1"]
    table.add_column("method")
    for name in names:
        table.add_column(name.replace("eccv_", "ECCV ").replace("cxc_r1", "CxC r1").replace("coco_5k_r1", "COCO-5k r1"), justify="right")
    for spec, values in scores.items():
        table.add_row(spec, *(f"{values[n]['t2i']:.2f} / {values[n]['i2t']:.2f}" for n in names))
    wide_console().print(table)


def _rerank(ev, q, options: EmbeddingEval, reranker, fusion_weight: float) -> None:
    """Rerank every method's top k with a cross-encoder; print retrieve vs retrieve+rerank R@K."""
    from hubless.inputs import read_items
    from hubless.rerank import rerank_evaluation

    assert options.query_items is not None and options.gallery_items is not None  # checked before any work
    k = options.rerank_k
    query_items, gallery_items = read_items(options.query_items), read_items(options.gallery_items)
    results = rerank_evaluation(
        ev,
        q,
        query_items,
        options.truth,
        reranker,
        gallery_items,
        k=k,
        fusion=options.fusion,
        fusion_weight=fusion_weight,
        progress=options.progress,
    )
    ks = [k_ for k_ in ev.ks if k_ <= k]
    table = Table(title=f"retrieve (top {k}) + rerank with {options.rerank}")
    table.add_column("method")
    for k_ in ks:
        table.add_column(f"R@{k_} retrieve -> +rerank", justify="right")
    table.add_column("ms/query retrieve, rerank", justify="right")
    for spec, res in results.items():
        cells = [f"{res.retrieve[f'R@{k_}']:.2f} -> {res.reranked[f'R@{k_}']:.2f}" for k_ in ks]
        table.add_row(spec, *cells, f"{res.ms_retrieve:.2f}, {res.ms_rerank:.1f}")
    wide_console().print(table)
