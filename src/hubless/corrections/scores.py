"""Fitting corrections on score matrices, given as instances or specs: the public face of
:mod:`hubless.corrections.score_fit` (which says what each method reads from which matrix).
"""

from __future__ import annotations

from collections.abc import Iterable

from hubless.corrections.base import Correction
from hubless.corrections.score_fit import check_score_methods, fit_corrections_on_scores
from hubless.corrections.spec import make_correction
from hubless.engine.statistics import BankStatistics

__all__ = ["check_score_methods", "fit_on_scores"]


def fit_on_scores(
    corrections: Iterable[Correction | str],
    query_bank_scores=None,
    gallery_bank_scores=None,
    *,
    n_gallery: int | None = None,
    statistics: BankStatistics | None = None,
    progress: bool | None = None,
) -> list[Correction]:
    """Fit several corrections (instances or specs such as ``"nnn:k=8"``) on the same score
    matrices with one streamed pass per bank: :func:`~hubless.corrections.score_fit.fit_corrections_on_scores`."""
    items = [make_correction(c) for c in corrections]
    return fit_corrections_on_scores(
        items, query_bank_scores, gallery_bank_scores, n_gallery=n_gallery, statistics=statistics, progress=progress
    )
