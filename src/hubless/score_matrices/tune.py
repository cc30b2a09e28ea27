"""Leak-free hyper-parameter search on score matrices (the protocol of :func:`hubless.tune`).

Parameters are chosen on validation score rows (validation queries x gallery) disjoint from the
test queries and from the query bank. With score matrices the rows are compared instead of
embeddings: two identical queries give identical score rows over one gallery, so a validation
row equal to a test row or a bank row (over the same gallery) is refused as a leak. Every grid
point of a method is fitted from one streamed pass per bank matrix, and each block of
validation rows is read once and ranked by every grid point.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence

import numpy as np

from hubless.corrections import METHODS, Correction, make_correction
from hubless.corrections.score_fit import check_score_methods, fit_on_scores
from hubless.engine.duplicates import row_hashes
from hubless.engine.score_statistics import check_score_matrix, read_rows, row_blocks
from hubless.errors import InvalidInput
from hubless.evaluation.results import TunedMethod, TuneResult, choose
from hubless.metrics.retrieval import PerQuery, check_ks, check_ties, per_query_metrics, summarize
from hubless.metrics.truth import TruthLike
from hubless.score_matrices.evaluate import ScoreMatrix, ScoreSource, prepare_scores
from hubless.score_matrices.files import load_scores
from hubless.score_matrices.rank import rank_score_rows
from hubless.tuning import DEFAULT_GRIDS

__all__ = ["shared_score_rows", "tune_scores"]


def _fingerprints(matrix: ScoreMatrix) -> np.ndarray:
    """One 64-bit hash per row, read in row blocks: equal rows always get equal ones
    (:func:`hubless.engine.duplicates.row_hashes`, integer arithmetic; a dot product with a
    random vector, as before, rounded two equal rows in different blocks apart on some BLAS
    kernels, and the leak went unseen)."""
    out = np.empty(matrix.shape[0], dtype=np.uint64)
    for start, stop in row_blocks(*matrix.shape):
        out[start:stop] = row_hashes(read_rows(matrix, start, stop, "scores"))
    return out


def shared_score_rows(a: ScoreMatrix, b: ScoreMatrix) -> int:
    """How many rows of ``a`` equal some row of ``b`` exactly (both n x same columns), found
    by fingerprints and confirmed on the candidate rows only (bounded memory)."""
    if a.shape[1] != b.shape[1]:
        return 0
    fa, fb = _fingerprints(a), _fingerprints(b)
    candidates = np.flatnonzero(np.isin(fa, fb))
    shared = 0
    for row in candidates:
        matches = np.flatnonzero(fb == fa[row])
        ra = read_rows(a, int(row), int(row) + 1, "scores")
        if any(np.array_equal(ra, read_rows(b, int(m), int(m) + 1, "scores")) for m in matches[:8]):
            shared += 1
    return shared


def _check_disjoint(a: ScoreMatrix, b: ScoreMatrix, name_a: str, name_b: str) -> None:
    shared = shared_score_rows(a, b)
    if shared:
        raise InvalidInput(
            f"{name_a} and {name_b} share {shared} identical score row(s): the same queries, and tuning on them "
            f"would leak; pass validation queries disjoint from the {name_b}"
        )


def tune_scores(
    val_scores: ScoreSource,
    val_truth: TruthLike,
    query_bank_scores: ScoreSource | None = None,
    methods: Sequence[str] = ("dis",),
    *,
    gallery_bank_scores: ScoreSource | None = None,
    test_scores: ScoreSource | None = None,
    grids: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
    objective: str = "R@1",
    ks: Sequence[int] = (1, 5, 10),
    ties: str = "index",
    query_mask: ScoreSource | None = None,
    transpose: bool = False,
    progress: bool | None = None,
) -> TuneResult:
    """Grid-search each method's parameters on validation score rows; returns the best per method
    (a :class:`~hubless.tuning.TuneResult`, as :func:`hubless.tune` gives).

    ``val_scores`` (validation queries x gallery), ``query_bank_scores`` / ``gallery_bank_scores``
    over the same gallery; ``test_scores`` (test queries x the same gallery, recommended) only
    serve to check that no validation row is a test row. ``ties``, ``query_mask`` (over
    ``val_scores``' stored rows) and ``transpose`` as in :func:`hubless.evaluate_scores`.
    """
    check_ties(ties)
    data = prepare_scores(val_scores, val_truth, query_bank_scores, gallery_bank_scores, query_mask=query_mask, transpose=transpose)
    ks = check_ks(ks, data.truth.n_gallery)
    valid = {f"R@{k}" for k in ks} | {"MdR", "MnR", "MRR", "mAP@R"}
    if objective not in valid:
        raise InvalidInput(f"objective must be one of {', '.join(sorted(valid))}; got {objective!r}")
    if test_scores is not None:
        test = load_scores(test_scores, "test_scores") if isinstance(test_scores, (str, os.PathLike)) else test_scores
        test = check_score_matrix(test, "test_scores")
        _check_disjoint(data.scores, test.T if transpose else test, "validation scores", "test queries")
    if data.query_bank_scores is not None:
        _check_disjoint(data.scores, data.query_bank_scores, "validation scores", "query bank")
    best: dict[str, TunedMethod] = {}
    tables: dict[str, list[dict[str, float]]] = {}
    for method in dict.fromkeys(m.partition(":")[0].strip().lower() for m in methods):
        if method not in METHODS:
            raise InvalidInput(f"unknown method {method!r}; choose from {', '.join(METHODS)}")
        grid = DEFAULT_GRIDS[method] if grids is None or method not in grids else grids[method]
        names = list(grid)
        points = [dict(zip(names, values)) for values in itertools.product(*(grid[n] for n in names))]
        candidates = [(p, make_correction(method).set_params(**p)) for p in points]
        check_score_methods([c for _, c in candidates[:1]])
        sizes = (
            data.n_gallery,
            None if data.query_bank_scores is None else data.query_bank_scores.shape[0],
            None if data.gallery_bank_scores is None else data.gallery_bank_scores.shape[0],
        )
        candidates = [(p, c) for p, c in candidates if _fits(c, sizes)]
        if not candidates:
            raise InvalidInput(f"no grid point of {method} fits these data (e.g. every k exceeds the bank)")
        points, corrections = [p for p, _ in candidates], [c for _, c in candidates]
        fit_on_scores(corrections, data.query_bank_scores, data.gallery_bank_scores, n_gallery=data.n_gallery, progress=progress)
        ranked = rank_score_rows(
            corrections,
            data.scores,
            data.truth,
            rows=data.rows,
            ties=ties,
            progress=progress,
            desc=f"tune {method} ({len(corrections)} points)",
        )
        metrics = [summarize(per_query_metrics(PerQuery(r.ranks, data.truth), ks)) for r in ranked]
        best[method], tables[method] = choose(objective, points, corrections, metrics)
    return TuneResult(objective, best, tables)


def _fits(corr: Correction, sizes: tuple[int, int | None, int | None]) -> bool:
    try:
        corr.check_sizes(*sizes)
    except ValueError:
        return False
    return True
