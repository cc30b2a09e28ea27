"""``hubless eval``: measure corrections on your embeddings (R@K, ranks, CIs, hubness)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from hubless.cli._common import (
    METHOD_HELP,
    NORMALIZE_HELP,
    OVERWRITE_HELP,
    check_outputs,
    describe_file,
    friendly_errors,
    generator_mark,
    load,
    parse_ints,
    print_note,
    print_results,
    warn_coverage,
    wide_console,
)
from hubless.cli.score_matrices import MASK_HELP, TIES_HELP, TRANSPOSE_HELP, eval_scores, refuse_embeddings, refuse_scores
from hubless.errors import InvalidInput


@friendly_errors
def eval_command(
    gallery: Path = typer.Option(None, help="Gallery embeddings (.npy, or .npz / file.npz:KEY), one row per item."),
    queries: Path = typer.Option(None, help="Test query embeddings, same dimension."),
    truth: str = typer.Option(
        None, help="Relevant gallery ids per query: .npy (ids, or -1-padded rows), .json, or a layout: t2i:5 / i2t:5."
    ),
    query_bank: list[str] = typer.Option(
        None,
        help="Reference queries (same modality as the queries, disjoint from them). Needed by every method but the baseline. "
        "Repeat as NAME=PATH to evaluate with several banks: one row per method x bank and the geometric mean over banks.",
    ),
    gallery_bank: Path = typer.Option(None, help="Reference items of the gallery's modality (DualIS/DualDIS need it; DN uses its mean)."),
    distractors: Path = typer.Option(
        None, help="Extra gallery items that are never relevant, appended after the gallery (a distractor-enlarged gallery)."
    ),
    method: list[str] = typer.Option(["baseline", "nnn"], "--method", "-m", help=METHOD_HELP),
    ks: str = typer.Option("1,5,10", help="Cut-offs K of R@K, comma-separated."),
    bootstrap: int = typer.Option(1000, help="Bootstrap resamples for 95% CIs (0: none)."),
    seed: int = typer.Option(0, help="Seed of the bootstrap."),
    normalize: bool = typer.Option(True, "--normalize/--no-normalize", help=NORMALIZE_HELP),
    out: Path = typer.Option(None, help="Write the results as JSON here (atomic)."),
    report: Path = typer.Option(None, help="Write a self-contained HTML report with plots here."),
    rerank: str = typer.Option(
        None,
        help="Cross-encoder to rerank each method's top --rerank-k with (BLIP ITM or sentence-transformers CrossEncoder name/folder); reports retrieve-only vs retrieve+rerank R@K and latency.",
    ),
    rerank_k: int = typer.Option(20, help="Candidates per query given to the reranker."),
    fusion: str = typer.Option(None, help="Score fusion: add or norm_add (default: plain rerank)."),
    fusion_weight: float = typer.Option(None, help="Weight of the bi-encoder score in fusion (default 0.1)."),
    lam: float = typer.Option(None, hidden=True, help="Deprecated name of --fusion-weight."),
    gallery_items: Path = typer.Option(
        None, help="With --rerank: the gallery items (image paths or texts), .txt/.json or an embed .meta.json."
    ),
    query_items: Path = typer.Option(None, help="With --rerank: the query items (texts or image paths), same formats."),
    eccv: bool = typer.Option(
        False,
        "--eccv",
        help="COCO-5k only (gallery: the 5,000 test images, queries: their 25,000 captions, Karpathy order): also report ECCV Caption mAP@R, R-Precision, R@1 and CxC R@1, both directions (needs --gallery-bank as the image bank).",
    ),
    ties: str = typer.Option("index", help=TIES_HELP),
    scores: Path = typer.Option(
        None, help="Instead of embeddings: query x gallery score matrix (.npy memory-mapped, .npz, or the QB-Norm authors' .pkl)."
    ),
    query_bank_scores: Path = typer.Option(None, help="With --scores: query bank x gallery scores (NNN, CSLS, IS, DIS, GC, ...)."),
    gallery_bank_scores: Path = typer.Option(None, help="With --scores: gallery bank x gallery scores (DualIS/DualDIS)."),
    query_mask: Path = typer.Option(None, help="With --scores: " + MASK_HELP),
    transpose: bool = typer.Option(False, "--transpose", help="With --scores: " + TRANSPOSE_HELP),
    attached: Path = typer.Option(
        None, help="Instead of embeddings and a truth: an attached collection's sidecar (hubless attach), measured against exact search."
    ),
    candidates: int = typer.Option(None, help="With --attached: the first k' plain candidates per query (default 8 x k)."),
    max_candidates: int = typer.Option(None, help="With --attached: the largest k' an uncertified query is widened to."),
    nprobe: int = typer.Option(None, help="With --attached: IVF partitions the store probes (FAISS IVF, LanceDB)."),
    ef_search: int = typer.Option(None, help="With --attached: the store's HNSW beam (FAISS HNSW, Qdrant, pgvector, Milvus)."),
    weight: float = typer.Option(None, help="With --attached: the correction's weight (NNN's alpha, DN's lambda)."),
    progress: bool = typer.Option(None, "--progress/--no-progress", help="Progress bars (default: on a terminal)."),
    overwrite: bool = typer.Option(False, help=OVERWRITE_HELP),
) -> None:
    """Fit each correction on the banks, rank the queries and report R@K, MdR, MnR, MRR, mAP@R,
    bootstrap CIs, the change vs the baseline and hubness. The baseline is always included.
    With --scores, the same from score matrices (docs/score-matrices.md); with --attached, an
    attached collection's search against exact search (docs/attach.md)."""
    if attached is not None:
        from hubless.cli.eval_attached import eval_attached, refuse_for_attached

        refuse_for_attached({"--gallery": gallery, "--truth": truth, "--query-bank": query_bank, "--gallery-bank": gallery_bank,
                             "--scores": scores, "--distractors": distractors, "--rerank": rerank, "--report": report, "--eccv": eccv})  # fmt: skip
        return eval_attached(attached, queries, ks, candidates=candidates, max_candidates=max_candidates, nprobe=nprobe,
                             ef_search=ef_search, weight=weight, out=out, overwrite=overwrite)  # fmt: skip
    attached_only = {
        "--candidates": candidates,
        "--max-candidates": max_candidates,
        "--nprobe": nprobe,
        "--ef-search": ef_search,
        "--weight": weight,
    }
    if any(v is not None for v in attached_only.values()):
        raise InvalidInput(f"{', '.join(k for k, v in attached_only.items() if v is not None)} only apply with --attached")
    if truth is None:
        raise typer.BadParameter("give --truth (the relevant gallery ids per query), or --attached SIDECAR")

    if scores is not None:
        refuse_embeddings({"--gallery": gallery, "--queries": queries, "--query-bank": query_bank, "--gallery-bank": gallery_bank,
                           "--distractors": distractors, "--rerank": rerank, "--eccv": eccv})  # fmt: skip
        return eval_scores(
            scores=scores, truth=truth, query_bank_scores=query_bank_scores, gallery_bank_scores=gallery_bank_scores, method=method,
            ks=ks, bootstrap=bootstrap, seed=seed, ties=ties, query_mask=query_mask, transpose=transpose, out=out, report=report,
            progress=progress, overwrite=overwrite,
        )  # fmt: skip
    refuse_scores({"--query-bank-scores": query_bank_scores, "--gallery-bank-scores": gallery_bank_scores,
                   "--query-mask": query_mask, "--transpose": transpose})  # fmt: skip
    if gallery is None or queries is None:
        raise typer.BadParameter("give --gallery and --queries (embeddings), or --scores (a score matrix)")

    from hubless._atomic import write_json
    from hubless.cli._common import deprecated_flag

    fusion_weight = deprecated_flag(fusion_weight, lam, "--lam", "--fusion-weight")
    fusion_weight = 0.1 if fusion_weight is None else fusion_weight
    from hubless.errors import check_available
    from hubless.evaluation import evaluate

    banks = parse_banks(query_bank)
    # Everything that can fail without computing anything is checked first.
    check_outputs(
        {"--out": out, "--report": report},
        {"--gallery": gallery, "--queries": queries, "--truth": truth, "--gallery-bank": gallery_bank, "--gallery-items": gallery_items,
         "--query-items": query_items, "--distractors": distractors, **{f"--query-bank {n}".strip(): p for n, p in (banks or {}).items()}},
        overwrite=overwrite,
    )  # fmt: skip
    if banks is not None and (len(banks) > 1 or "" not in banks):  # named banks: the robustness protocol
        if report is not None or eccv or rerank:
            raise InvalidInput(
                "with several named query banks, eval writes tables and --out JSON; --report, --eccv and --rerank take one bank"
            )
        return _eval_banks(
            gallery, queries, truth, banks, gallery_bank, distractors, method, ks, bootstrap, seed, normalize, out, progress, ties
        )
    query_bank = None if not banks else banks[""]
    if report is not None:
        check_available("matplotlib", "--report", "report")
    if distractors is not None and (eccv or rerank):
        raise InvalidInput("--distractors cannot be combined with --eccv or --rerank (they assume the gallery as given)")
    if eccv:
        check_available("eccv_caption", "--eccv", "eccv", "eccv-caption")
        if gallery_bank is None:
            raise typer.BadParameter("--eccv evaluates image->text too, which needs an image bank: pass --gallery-bank")
    reranker = None
    if rerank:
        if gallery_items is None or query_items is None:
            raise typer.BadParameter("--rerank needs --gallery-items and --query-items (what the cross-encoder reads)")
        from hubless.rerank import load_reranker

        reranker = load_reranker(rerank)
    g = load(gallery, "gallery", normalize=normalize)
    q = load(queries, "queries", normalize=normalize, dim=g.shape[1])
    qb = load(query_bank, "query bank", normalize=normalize, dim=g.shape[1])
    gb = load(gallery_bank, "gallery bank", normalize=normalize, dim=g.shape[1])
    extra = load(distractors, "distractors", normalize=normalize, dim=g.shape[1])
    inputs = {
        name: describe_file(path, arr)
        for name, path, arr in (
            ("gallery", gallery, g),
            ("queries", queries, q),
            ("query_bank", query_bank, qb),
            ("gallery_bank", gallery_bank, gb),
            ("distractors", distractors, extra),
        )
        if path is not None
    }
    inputs["truth"] = truth
    ev = evaluate(
        g,
        q,
        truth,
        qb,
        method,
        gallery_bank=gb,
        ks=parse_ints(ks, "--ks"),
        bootstrap=bootstrap,
        seed=seed,
        normalize=normalize,
        progress=progress,
        inputs={"files": inputs},
        distractors=extra,
        ties=ties,
        coverage=True,
    )
    size = f"{g.shape[0]} items" if extra is None else f"{g.shape[0]} items + {extra.shape[0]} distractors"
    print_results(ev, f"{q.shape[0]} queries over {size}")
    warn_coverage(ev.bank, ev.losses(), f"R@{ev.ks[0]}")
    if eccv:
        _eccv(ev, q, qb, gb, progress)
    if rerank:
        _rerank(ev, q, truth, reranker, rerank, rerank_k, fusion, fusion_weight, gallery_items, query_items, progress)
    if out is not None:
        write_json(out, {**generator_mark(), **ev.to_dict()})
        typer.echo(f"results: {out}")
    if report is not None:
        from hubless.reports.evaluation import evaluation_report

        evaluation_report(ev, report)
        typer.echo(f"report: {report}")


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


def _rerank(ev, q, truth, reranker, model, k, fusion, fusion_weight, gallery_items, query_items, progress) -> None:
    """Rerank every method's top k with a cross-encoder; print retrieve vs retrieve+rerank R@K."""
    from hubless.inputs import read_items
    from hubless.rerank import rerank_evaluation

    results = rerank_evaluation(
        ev, q, read_items(query_items), truth, reranker, read_items(gallery_items), k=k, fusion=fusion, fusion_weight=fusion_weight,
        progress=progress,
    )  # fmt: skip
    ks = [k_ for k_ in ev.ks if k_ <= k]
    table = Table(title=f"retrieve (top {k}) + rerank with {model}")
    table.add_column("method")
    for k_ in ks:
        table.add_column(f"R@{k_} retrieve -> +rerank", justify="right")
    table.add_column("ms/query retrieve, rerank", justify="right")
    for spec, res in results.items():
        cells = [f"{res.retrieve[f'R@{k_}']:.2f} -> {res.reranked[f'R@{k_}']:.2f}" for k_ in ks]
        table.add_row(spec, *cells, f"{res.ms_retrieve:.2f}, {res.ms_rerank:.1f}")
    wide_console().print(table)


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


def _eval_banks(
    gallery, queries, truth, banks, gallery_bank, distractors, method, ks, bootstrap, seed, normalize, out, progress, ties="index"
) -> None:
    """The bank robustness protocol (hubless.evaluation.robustness) from the command line."""
    from hubless.evaluation.robustness import evaluate_banks

    g = load(gallery, "gallery", normalize=normalize)
    loaded = {name: load(path, f"query bank {name}", normalize=normalize, dim=g.shape[1]) for name, path in banks.items()}
    result = evaluate_banks(
        g, load(queries, "queries", normalize=normalize, dim=g.shape[1]), truth, loaded, method,
        gallery_bank=load(gallery_bank, "gallery bank", normalize=normalize, dim=g.shape[1]), ks=parse_ints(ks, "--ks"),
        bootstrap=bootstrap, seed=seed, normalize=normalize, distractors=load(distractors, "distractors", normalize=normalize, dim=g.shape[1]),
        progress=progress, ties=ties,
    )  # fmt: skip
    print_banks(result, out)


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
