"""Fitting corrections on score matrices instead of embeddings.

The QB-Norm authors' own code works on similarity matrices (Bogolin et al. 2022: the bank x
gallery and query x gallery scores of CE+, TT-CE+, CLIP4Clip, CLIP2Video, MMT, ...), because
those models score with mixtures of experts or cross-attention and have no single embedding per
item. Every correction whose bias comes from bank *scores* can be fitted from them:

======================  ==========================================================  ==============
method                  what it reads                                              matrices
======================  ==========================================================  ==============
baseline                nothing                                                     S
NNN, CSLS               each gallery item's top-k bank scores (CSLS: r_q from S)    S, SB
IS, DIS                 log sum_b exp(beta s(b, r)); DIS: bank rows' top-k_a       S, SB
DualIS, DualDIS         the same over the query bank and the gallery bank           S, SB, SG
GC                      every bank score of each item, sorted                       S, SB
DN                      refused: needs the banks' mean *embeddings*                 --
======================  ==========================================================  ==============

(S: queries x gallery, SB: query bank x gallery, SG: gallery bank x gallery.) The statistics
come from one streamed pass per bank matrix (:mod:`hubless.engine.score_statistics`); a
correction fitted this way ranks rows of S with :func:`correct_rows` exactly as one fitted on
embeddings ranks their similarities, and equals it when S = Q G^T:

    from hubless.corrections import score_fit
    nnn = score_fit.fit_scores(hubless.NNN(k=8), SB)              # or fit_on_scores([...], SB, SG): one pass
    corrected = score_fit.correct_rows(nnn, S, weight=0.5)       # (n_queries, n_gallery) float32

(Until 0.2.0 the correction's methods ``fit_scores`` and ``correct`` do the same, with a
DeprecationWarning; files of any size go through :func:`hubless.correct_scores`.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import numpy as np

from hubless.corrections.base import Correction
from hubless.corrections.queries import QueryBatch, QueryStatistics
from hubless.corrections.spec import MethodName, make_correction
from hubless.engine.score_statistics import check_score_matrix, read_rows, score_statistics
from hubless.engine.statistics import BankStatistics, StatisticsRequest
from hubless.errors import InvalidInput, MissingInput

__all__ = ["check_score_methods", "correct_rows", "fit_on_scores", "fit_scores", "fitted_on_scores"]

_C = TypeVar("_C", bound=Correction)


def check_score_methods(corrections: Iterable[Correction]) -> None:
    """Refuse, before any work, corrections that cannot be computed from score matrices."""
    for c in corrections:
        if c.needs_embeddings:
            raise InvalidInput(f"{c.spec} cannot be computed from score matrices: {c.needs_embeddings}")


def fit_on_scores(
    corrections: Iterable[Correction | MethodName | str],
    query_bank_scores=None,
    gallery_bank_scores=None,
    *,
    n_gallery: int | None = None,
    statistics: BankStatistics | None = None,
    progress: bool | None = None,
) -> list[Correction]:
    """Fit several corrections (instances or specs such as ``"nnn:k=8"``) on the same score
    matrices with one streamed pass per bank (their statistics requests are merged, as
    :func:`hubless.fit_many` does for embeddings); :func:`fit_scores` fits one.

    ``query_bank_scores`` SB (n_bank, n_gallery), ``gallery_bank_scores`` SG (n_gallery_bank,
    n_gallery): arrays or memory maps; ``n_gallery`` is needed only when neither is given;
    ``statistics``: bank statistics already computed for these matrices (checked to hold what
    every correction needs). Returns the fitted corrections in order.
    """
    items = [make_correction(c) for c in corrections]
    check_score_methods(items)
    for c in items:
        c._validate_params()
    sb = None if query_bank_scores is None else check_score_matrix(query_bank_scores, "query_bank_scores", n_cols=n_gallery)
    n_gallery = sb.shape[1] if sb is not None else n_gallery
    sg = None if gallery_bank_scores is None else check_score_matrix(gallery_bank_scores, "gallery_bank_scores", n_cols=n_gallery)
    n_gallery = sg.shape[1] if sg is not None else n_gallery
    if n_gallery is None:
        raise InvalidInput("give query_bank_scores (or n_gallery for the baseline): nothing says how many gallery items there are")
    needing = [c for c in items if c.needs_query_bank]
    if needing and sb is None:
        raise MissingInput(
            "query_bank_scores", f"{needing[0].spec} needs the query bank's scores (reference queries x gallery): pass {{arg}}"
        )
    requiring = [c for c in items if c.gallery_bank_use == "required"]
    if requiring and sg is None:
        raise MissingInput(
            "gallery_bank_scores",
            f"{requiring[0].spec} needs the gallery bank's scores (reference items of the gallery's modality x gallery): pass {{arg}}",
        )
    for c in items:
        c.check_sizes(n_gallery, None if sb is None else sb.shape[0], None if sg is None else sg.shape[0])
    request = StatisticsRequest()
    for c in items:
        request = request.merge(c.statistics_request())
    if statistics is None:
        statistics = score_statistics(sb, sg, request, n_gallery=n_gallery, progress=progress)
    elif statistics.n_gallery != n_gallery or statistics.missing(request):
        raise InvalidInput("statistics were computed for other score matrices (sizes differ or values are missing)")
    gallery = np.zeros((n_gallery, 0), dtype=np.float32)  # no embeddings: dim 0 marks a fit on scores
    for c in items:
        c._fit_arrays(gallery, statistics)
    return list(items)


def fit_scores(
    corr: _C,
    query_bank_scores=None,
    gallery_bank_scores=None,
    *,
    n_gallery: int | None = None,
    statistics: BankStatistics | None = None,
    progress: bool | None = None,
) -> _C:
    """Fit ``corr`` on score matrices instead of embeddings (a model whose score is not one dot
    product: mixtures of experts, cross-attention); returns it.

    query_bank_scores : (n_bank, n_gallery) s(b, r) of every query-bank item b and gallery
        item r, an array or a memory-mapped .npy (read once, in row blocks).
    gallery_bank_scores : (n_gallery_bank, n_gallery) s(g, r) of reference items g of the
        gallery's modality (DualIS / DualDIS).
    n_gallery : the gallery size when no bank is given (the baseline).

    Rank rows of a query x gallery score matrix with :func:`correct_rows` (or
    :func:`hubless.correct_scores` for files). Methods that need embeddings (DN) are refused
    with :class:`~hubless.errors.InvalidInput` saying what they need.
    """
    fit_on_scores([corr], query_bank_scores, gallery_bank_scores, n_gallery=n_gallery, statistics=statistics, progress=progress)
    return corr


def fitted_on_scores(corr: Correction) -> bool:
    """Whether ``corr`` was fitted on score matrices (it then ranks score rows, not embeddings:
    see :func:`correct_rows`)."""
    return corr.is_fitted and corr.dim_ == 0


def rows_batch(corr: Correction, scores, **weight) -> QueryBatch:
    """Rows of a query x gallery score matrix (n_queries, n_gallery), checked, as a batch of
    ``corr``'s ranking hook (:meth:`Correction.rank`, :meth:`Correction.method_scores`), with
    this call's ``weight=``; the raw-neighbour statistics (DIS gates, CSLS's r_q) come from the
    rows (:func:`hubless.score_matrices.rank.score_batch` does the same for several corrections
    over a block already read)."""
    corr._check_fitted()
    scores = check_score_matrix(scores, "scores", n_cols=corr.n_gallery_)
    rows = read_rows(scores, 0, scores.shape[0], "scores")
    request = corr.query_request
    stats = QueryStatistics.from_similarities(request, rows) if request.depth else None
    return QueryBatch(np.empty((rows.shape[0], 0), np.float32), corr._weight_override(weight, rows.shape[0]), stats)


def correct_rows(corr: Correction, scores, *, ranking: bool = False, **weight) -> np.ndarray:
    """The corrected scores of rows of a query x gallery score matrix, (n_queries, n_gallery)
    float32: the method's own scores (e.g. QB-Norm's exp(beta s) / sum_b exp(beta s(b, r)),
    the raw score for DIS queries whose gate stays closed), or with ``ranking`` the scores it
    ranks by (e.g. s - bias(r), which never overflows). Works for a correction fitted on
    embeddings too (with the scores of its own gallery) and on scores (:func:`fit_scores`);
    ``weight=`` overrides its weight for this call."""
    batch = rows_batch(corr, scores, **weight)
    rows = read_rows(scores, 0, len(batch), "scores")
    ranked = corr.rank(batch, rows)
    if ranked is rows or np.shares_memory(ranked, np.asarray(scores)):
        ranked = np.array(ranked, dtype=np.float32, copy=True)
    return ranked if ranking else np.asarray(corr.method_scores(batch, ranked), dtype=np.float32)
