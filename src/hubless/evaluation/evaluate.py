"""Evaluate corrections on a retrieval benchmark: accuracy, confidence, hubness, time.

    result = hubless.evaluate(gallery, queries, "t2i:5", query_bank,
                              methods=["baseline", "nnn:alpha=0.75,k=16", "is:beta=20"])
    result.to_dict()      # the results.json schema of ``hubless eval``

Every method is fitted on the banks only (never on ``queries``), all of them from one streamed
pass per bank (:func:`hubless.corrections.fit_shared`, which also gives the bank's coverage when
asked), then the queries are ranked in blocks of rows by
:func:`hubless.evaluation.core.rank_queries` (the same ranking hook its ``search`` uses), so
memory stays at one block whatever the sizes. From the ranks of every
relevant item come R@K, MdR, MnR, MRR and mAP@R (see :mod:`hubless.metrics.retrieval`), and from
the top 10 the hubness statistics. Bootstrap intervals resample queries with one seed for every
method, so the intervals of the differences to the baseline are paired.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hubless._validation import as_embeddings
from hubless.banks import BankReport, coverage_report
from hubless.corrections import Correction, MethodName, fit_shared
from hubless.engine import StatisticsRequest, use_device
from hubless.engine.device import DeviceName, checked_on_device
from hubless.errors import InvalidInput
from hubless.evaluation.core import Ranked, prepare_methods, rank_queries
from hubless.evaluation.results import Evaluation, JSONValue, MethodResult
from hubless.metrics.bootstrap import bootstrap_ci
from hubless.metrics.hubness import hubness_statistics
from hubless.metrics.retrieval import PerQuery, check_ks, check_ties, per_query_metrics, summarize
from hubless.metrics.truth import Truth, TruthLike, load_truth
from hubless.progress import progress_bar

__all__ = ["Evaluation", "MethodResult", "evaluate"]

#: Top results kept per query for the hubness statistics (N_1 and N_10).
HUBNESS_DEPTH = 10


def evaluate(
    gallery: npt.ArrayLike,
    queries: npt.ArrayLike,
    truth: TruthLike,
    query_bank: npt.ArrayLike | None = None,
    methods: Sequence[MethodName | str | Correction] = ("baseline", "nnn"),
    *,
    gallery_bank: npt.ArrayLike | None = None,
    ks: Sequence[int] = (1, 5, 10),
    bootstrap: int = 1000,
    seed: int = 0,
    normalize: bool = True,
    progress: bool | None = None,
    inputs: Mapping[str, JSONValue] | None = None,
    distractors: npt.ArrayLike | None = None,
    ties: str = "index",
    coverage: bool = False,
    refit: bool = True,
    device: DeviceName = None,
) -> Evaluation:
    """Fit each method on the banks, rank ``queries`` over ``gallery`` and measure.

    ``truth``: a :class:`~hubless.metrics.truth.Truth`, one gallery id per query (int array),
    lists of ids, a file (.npy/.json) or a layout such as ``"t2i:5"`` (see
    :func:`~hubless.metrics.truth.load_truth`). ``methods``: specs like ``"nnn:alpha=0.5,k=16"``
    or corrections (refitted here); the baseline is always evaluated (first) so every method
    gets its difference to it, with a paired bootstrap interval. ``bootstrap=0`` skips intervals.
    ``normalize`` applies to every method built from a spec. ``distractors``: extra gallery
    items that are never relevant, appended after the gallery (the distractor-enlarged galleries
    of Geigle et al.): ``truth`` keeps referring to the gallery's own positions. ``ties``: how
    tied scores rank ("index": the lower gallery index first; "average": the mean of the tied
    positions, the collaborative-experts metric of the QB-Norm tables, and the expected
    positions of several relevant items tied together; "optimistic": the relevant items of a tie
    group first; see :mod:`hubless.metrics.retrieval`; an exact copy of a gallery item always
    scores as its first copy). ``coverage``: also measure the query bank's
    coverage of the gallery searched (``Evaluation.bank``, see
    :func:`hubless.banks.coverage_report`) in the pass that fits the methods. ``refit=False``
    uses corrections already fitted on this very gallery array as they are (e.g. the ones
    :func:`hubless.tune` chose), so their bank is not read again.
    ``device``: where the fits and the ranking pass run ("cuda", "cpu" for torch, "numpy";
    default ``HUBLESS_DEVICE`` or numpy; see :mod:`hubless.engine.device`).
    """
    if device is not None:  # the whole call with this device in effect
        arguments = {name: value for name, value in locals().items() if name != "device"}
        with use_device(device):
            return evaluate(**arguments)
    with checked_on_device():  # on a torch device the input checks run there, and their uploads serve the passes
        gallery = as_embeddings(gallery, "gallery", normalize=normalize)
        queries = as_embeddings(queries, "queries", normalize=normalize, dim=gallery.shape[1], dim_of="the gallery")
        truth = load_truth(truth, queries.shape[0], gallery.shape[0])
        n_distractors = 0
        if distractors is not None:
            extra = as_embeddings(distractors, "distractors", normalize=normalize, dim=gallery.shape[1], dim_of="the gallery")
            n_distractors = extra.shape[0]
            gallery = np.concatenate([gallery, extra])
            truth = dataclasses.replace(truth, n_gallery=gallery.shape[0])  # never relevant: no truth points at them
        ks = check_ks(ks, gallery.shape[0])
        check_bootstrap(bootstrap)
        corrections = prepare_methods(methods, normalize)
        check_ties(ties)
        reuse = [not refit and getattr(c, "gallery_", None) is gallery for c in corrections]
        also = StatisticsRequest(query_nearest=True) if coverage and query_bank is not None else None
        to_fit = [c for c, kept in zip(corrections, reuse) if not kept]
        t0 = time.perf_counter()
        stats = fit_shared(to_fit, gallery, query_bank, gallery_bank, also=also, progress=progress)[1] if to_fit else None
        fit_seconds = time.perf_counter() - t0
        bank = (
            coverage_report(stats, queries=queries) if also is not None and stats is not None and stats.query_nearest is not None else None
        )
        ranked = rank_queries(
            corrections, queries, truth, depth=HUBNESS_DEPTH, progress=progress, desc=f"rank {len(corrections)} methods", ties=ties
        )
        described: dict[str, JSONValue] = {
            "n_gallery": int(gallery.shape[0]),
            "n_distractors": int(n_distractors),
            "n_queries": int(queries.shape[0]),
            "dim": int(gallery.shape[1]),
            "n_query_bank": None if query_bank is None else int(np.shape(query_bank)[0]),
            "n_gallery_bank": None if gallery_bank is None else int(np.shape(gallery_bank)[0]),
            "relevant_per_query": float(truth.counts.mean()),
            "ks": list(ks),
            "bootstrap": int(bootstrap),
            "seed": int(seed),
            "normalize": bool(normalize),
            "ties": ties,
        }
        described.update(inputs or {})
        fit_seconds_each = [0.0 if kept else fit_seconds for kept in reuse]
        return build_evaluation(corrections, ranked, fit_seconds_each, truth, ks, bootstrap, seed, described, bank, progress)


def check_bootstrap(bootstrap: object) -> None:
    """Refuse a resample count that is not an int >= 0 (0: no intervals)."""
    if isinstance(bootstrap, bool) or not isinstance(bootstrap, (int, np.integer)) or bootstrap < 0:
        raise InvalidInput(f"bootstrap must be a number of resamples >= 0; got {bootstrap!r}")


def build_evaluation(
    corrections: Sequence[Correction],
    ranked: Sequence[Ranked],
    fit_seconds: Sequence[float],
    truth: Truth,
    ks: Sequence[int],
    bootstrap: int,
    seed: int,
    inputs: dict[str, JSONValue],
    bank: BankReport | None = None,
    progress: bool | None = None,
) -> Evaluation:
    """The one place an :class:`Evaluation` is made from ranked results, whatever ranked them
    (embeddings, score matrices): each method's numbers (:func:`method_result`), then the change
    of every method against the first (the baseline) with paired bootstrap intervals (the same
    resamples for every method); a progress bar counts the methods (:mod:`hubless.progress`)."""
    bar = progress_bar(None, progress, total=len(corrections), desc="metrics and intervals", unit="method")
    results = []
    for c, r, t in zip(corrections, ranked, fit_seconds):
        results.append(method_result(c, r, t, truth, ks, bootstrap, seed))
        if len(results) > 1:  # the change against the baseline, with its intervals
            diffs = {m: results[-1].per_query[m] - results[0].per_query[m] for m in results[-1].per_query if m != "MdR"}
            delta = {m: float(d.mean()) for m, d in diffs.items()}
            ci95 = bootstrap_ci(diffs, bootstrap, seed=seed) if bootstrap else {}
            results[-1] = dataclasses.replace(results[-1], delta=delta, delta_ci95=ci95)
        bar.update(1)
    bar.close()
    return Evaluation(inputs, results, tuple(ks), bank)


def method_result(
    corr: Correction, ranked: Ranked, fit_seconds: float, truth: Truth, ks: Sequence[int], bootstrap: int, seed: int
) -> MethodResult:
    """One method's numbers from its ranks: R@K, MdR, MnR, MRR, mAP@R with bootstrap intervals,
    the hubness of its top 10 and its times."""
    values = per_query_metrics(PerQuery(ranked.ranks, truth), ks)
    assert ranked.top is not None  # ranked with depth=HUBNESS_DEPTH
    hub = hubness_statistics(ranked.top, truth.n_gallery, ks=(1, 10), expected=truth.expected_occurrence())
    params = {k: v for k, v in corr.get_params().items() if k not in ("normalize", *corr.resource_params)}
    return MethodResult(
        method=corr.name,
        params=params,
        spec=corr.spec,
        metrics=summarize(values),
        ci95=bootstrap_ci(values, bootstrap, seed=seed) if bootstrap else {},
        hubness=hub,
        seconds={"fit": fit_seconds, "search": ranked.seconds},
        per_query=values,
        n1=np.bincount(ranked.top[:, 0], minlength=truth.n_gallery),
        correction=corr,
    )
