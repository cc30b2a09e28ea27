"""Leak-free hyper-parameter search (NNN paper, appendix B).

    tuned = hubless.tune(gallery, val_queries, val_truth, query_bank,
                         methods=["nnn", "is"], test_queries=queries)
    tuned.best_specs      # e.g. ["nnn:alpha=0.75,k=16", "is:beta=20.0"]

Parameters are chosen on a validation split that the caller passes explicitly; it must share
no row with the test queries or with the query bank (checked by exact row equality, refused
otherwise), so nothing about the test queries leaks into the choice. Every grid point of every
method is fitted from one streamed pass per bank (:func:`hubless.fit_many` merges their
statistics: NNN's whole (alpha, k) grid costs one top-512 pass, shared with IS's betas), and
each block of validation similarities is computed once and shared by every grid point and by
the uncorrected baseline (``TuneResult.baseline``), so a choice can be compared with doing nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from hubless._validation import as_embeddings
from hubless.banks import BankReport, coverage_report
from hubless.corrections import METHODS, Correction, MethodName, fit_shared, make_correction
from hubless.engine import StatisticsRequest, use_device
from hubless.engine.device import DeviceName, checked_on_device
from hubless.errors import InvalidInput
from hubless.evaluation.core import rank_queries
from hubless.evaluation.evaluate import Evaluation, evaluate
from hubless.evaluation.results import TunedMethod, TuneResult, choose, grid_edges
from hubless.evaluation.robustness import BankEvaluation, checked_banks
from hubless.metrics.retrieval import PerQuery, check_ks, check_ties, per_query_metrics, summarize
from hubless.metrics.truth import Truth, TruthLike, load_truth

__all__ = ["DEFAULT_GRIDS", "TuneResult", "check_disjoint", "grid_edges", "shared_rows", "tune", "tune_banks"]

#: Default grids, from each method's ``default_grid`` (the papers': NNN, Chowdhury 2024, app. B;
#: QB-Norm, Bogolin 2022; DBNorm, Wang 2023, log grid of both betas; DN, Zhou 2023, lambda in [0, 1]).
DEFAULT_GRIDS: dict[str, dict[str, tuple[float, ...]]] = {name: dict(cls.default_grid) for name, cls in METHODS.items()}


def shared_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Boolean mask over the rows of ``a``: True where the row equals some row of ``b`` exactly."""
    if a.shape[1] != b.shape[1]:
        return np.zeros(a.shape[0], dtype=bool)
    row = np.dtype((np.void, a.dtype.itemsize * a.shape[1]))
    va = np.ascontiguousarray(a).view(row).ravel()
    vb = np.ascontiguousarray(b, dtype=a.dtype).view(row).ravel()
    return np.isin(va, vb)


def check_disjoint(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    """Refuse when any row of ``a`` equals a row of ``b`` exactly (a leak between splits)."""
    shared = int(shared_rows(a, b).sum())
    if shared:
        raise InvalidInput(
            f"{name_a} and {name_b} share {shared} identical row(s): tuning on them would leak; "
            f"pass a validation split disjoint from the {name_b} (hubless.tuning.shared_rows finds them)"
        )


def _grid(method: str, grids: Mapping[str, Mapping[str, Sequence[float]]] | None) -> list[dict[str, float]]:
    if method not in METHODS:
        raise InvalidInput(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
    grid = DEFAULT_GRIDS[method] if grids is None or method not in grids else grids[method]
    names = list(grid)
    return [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]


def _fits(corr: Correction, gallery: np.ndarray, query_bank: np.ndarray | None, gallery_bank: npt.ArrayLike | None) -> bool:
    """Whether a grid point fits the data (e.g. k no larger than the bank); others are skipped."""
    try:
        corr.check_sizes(
            gallery.shape[0],
            None if query_bank is None else query_bank.shape[0],
            None if gallery_bank is None else np.shape(gallery_bank)[0],
        )
    except ValueError:
        return False
    return True


def tune(
    gallery: npt.ArrayLike,
    val_queries: npt.ArrayLike,
    val_truth: TruthLike,
    query_bank: npt.ArrayLike | None = None,
    methods: Sequence[MethodName | str] = ("nnn",),
    *,
    gallery_bank: npt.ArrayLike | None = None,
    test_queries: npt.ArrayLike | None = None,
    grids: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    objective: str = "R@1",
    ks: Sequence[int] = (1, 5, 10),
    normalize: bool = True,
    progress: bool | None = None,
    ties: str = "index",
    coverage: bool = False,
    device: DeviceName = None,
) -> TuneResult:
    """Grid-search each method's parameters on the validation queries; returns the best per method.

    ``methods`` are method names (their grids come from ``grids`` or :data:`DEFAULT_GRIDS`).
    ``objective`` is a metric name (R@K for a K in ``ks``, MRR, mAP@R: higher is better; MdR,
    MnR: lower is better); ties go to the first grid point. ``test_queries`` (recommended) are
    only used to check that no validation query is also a test query. ``ties``: the tie
    convention of the ranks (see :func:`hubless.metrics.relevant_ranks`). ``coverage``: also
    measure the query bank's coverage of the gallery in the fitting pass (``TuneResult.bank``).
    ``device``: where the fits and the ranking pass run, as in :func:`hubless.evaluate`.
    """
    if device is not None:  # the whole call with this device in effect
        arguments = {name: value for name, value in locals().items() if name != "device"}
        with use_device(device):
            return tune(**arguments)
    with checked_on_device():  # on a torch device the input checks run there, and their uploads serve the passes
        check_ties(ties)
        gallery = as_embeddings(gallery, "gallery", normalize=normalize)
        dim = gallery.shape[1]
        val = as_embeddings(val_queries, "validation queries", normalize=normalize, dim=dim, dim_of="the gallery")
        truth = load_truth(val_truth, val.shape[0], gallery.shape[0])
        ks = check_ks(ks, gallery.shape[0])
        valid = {f"R@{k}" for k in ks} | {"MdR", "MnR", "MRR", "mAP@R"}
        if objective not in valid:
            raise InvalidInput(f"objective must be one of {', '.join(sorted(valid))}; got {objective!r}")
        if test_queries is not None:
            test = as_embeddings(test_queries, "test queries", normalize=normalize, dim=dim, dim_of="the gallery")
            check_disjoint(val, test, "validation queries", "test queries")
        if query_bank is not None:
            bank = as_embeddings(query_bank, "query bank", normalize=normalize, dim=dim, dim_of="the gallery")
            check_disjoint(val, bank, "validation queries", "query bank")
            query_bank = bank
        grid: dict[str, tuple[list[dict[str, float]], list[Correction]]] = {}
        for method in dict.fromkeys(m.partition(":")[0].strip().lower() for m in methods):
            candidates = [(p, make_correction(method).set_params(normalize=normalize, **p)) for p in _grid(method, grids)]
            candidates = [(p, c) for p, c in candidates if _fits(c, gallery, query_bank, gallery_bank)]
            if not candidates:
                raise InvalidInput(f"no grid point of {method} fits these data (e.g. every k exceeds the bank)")
            grid[method] = ([p for p, _ in candidates], [c for _, c in candidates])
        # every grid point of every method (and the baseline) from one pass per bank
        everything = [make_correction("baseline").set_params(normalize=normalize)] + [c for _, cs in grid.values() for c in cs]
        also = StatisticsRequest(query_nearest=True) if coverage and query_bank is not None else None
        stats = fit_shared(everything, gallery, query_bank, gallery_bank, also=also, progress=progress)[1]
        metrics = _validate_all(everything, val, truth, ks, progress, ties)
        best: dict[str, TunedMethod] = {}
        tables: dict[str, list[dict[str, float]]] = {}
        fitted: dict[str, Correction] = {}
        start = 1
        for method, (points, corrections) in grid.items():
            found = metrics[start : start + len(corrections)]
            start += len(corrections)
            best[method], tables[method] = choose(objective, points, corrections, found)
            fitted[method] = next(c for c in corrections if c.spec == best[method].spec)
        return TuneResult(objective, best, tables, metrics[0], fitted, coverage_report(stats) if also is not None else None)


def _validate_all(
    corrections: Sequence[Correction], queries: np.ndarray, truth: Truth, ks: Sequence[int], progress: bool | None, ties: str = "index"
) -> list[dict[str, float]]:
    """Metrics of every fitted correction on the validation queries (one streamed pass: each
    block of raw similarities is shared by every grid point)."""
    ranked = rank_queries(corrections, queries, truth, progress=progress, desc=f"tune {len(corrections) - 1} grid points", ties=ties)
    return [summarize(per_query_metrics(PerQuery(r.ranks, truth), ks)) for r in ranked]


def tune_banks(
    gallery: npt.ArrayLike,
    val_queries: npt.ArrayLike,
    val_truth: TruthLike,
    banks: Mapping[str, npt.ArrayLike],
    methods: Sequence[MethodName | str] = ("nnn",),
    *,
    queries: npt.ArrayLike,
    truth: TruthLike,
    val_gallery: npt.ArrayLike | None = None,
    gallery_bank: npt.ArrayLike | None = None,
    objective: str = "R@1",
    ks: Sequence[int] = (1, 5, 10),
    bootstrap: int = 1000,
    seed: int = 0,
    normalize: bool = True,
    distractors: npt.ArrayLike | None = None,
    progress: bool | None = None,
    ties: str = "index",
) -> BankEvaluation:
    """The protocol with every method tuned on the validation split separately for each bank
    (:func:`hubless.tuning.tune`, never on the test queries), then tested on ``queries``."""
    g, checked = checked_banks(gallery, banks, normalize)
    same = val_gallery is None and distractors is None  # tuned on the very gallery tested: one pass per bank in all
    vg = g if val_gallery is None else val_gallery
    evaluations: dict[str, Evaluation] = {}
    tuned: dict[str, TuneResult] = {}
    reports: dict[str, BankReport | None] = {}
    for name, b in checked.items():
        tuned[name] = tune(
            vg,
            val_queries,
            val_truth,
            b,
            methods,
            gallery_bank=gallery_bank,
            test_queries=queries,
            objective=objective,
            ks=ks,
            normalize=normalize,
            progress=progress,
            ties=ties,
            coverage=same,
        )
        # the chosen corrections are used as fitted when the gallery is the same array (refit otherwise)
        chosen = list(tuned[name].fitted.values()) if same else tuned[name].best_specs
        evaluations[name] = evaluate(
            g,
            queries,
            truth,
            b,
            chosen,
            gallery_bank=gallery_bank,
            ks=ks,
            bootstrap=bootstrap,
            seed=seed,
            normalize=normalize,
            distractors=distractors,
            progress=progress,
            ties=ties,
            coverage=not same,
            refit=False,
        )
        reports[name] = tuned[name].bank if same else evaluations[name].bank
    return BankEvaluation(evaluations, {k: v for k, v in reports.items() if v is not None}, tuned)
