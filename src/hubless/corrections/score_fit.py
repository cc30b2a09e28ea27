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
correction fitted this way ranks rows of S with :meth:`Correction.correct` exactly as one fitted
on embeddings ranks their similarities, and equals it when S = Q G^T.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from hubless.engine.score_statistics import check_score_matrix, score_statistics
from hubless.engine.statistics import BankStatistics, StatisticsRequest
from hubless.errors import InvalidInput, MissingInputError

if TYPE_CHECKING:  # the corrections call this module: no import at run time
    from hubless.corrections.base import Correction
    from hubless.corrections.spec import MethodName

__all__ = ["check_score_methods", "fit_on_scores"]


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
    :func:`hubless.fit_many` does for embeddings). The one definition:
    :meth:`Correction.fit_scores <hubless.corrections.base.Correction.fit_scores>` calls it
    with ``[self]``, :mod:`hubless.corrections.scores` re-exports it.

    ``query_bank_scores`` SB (n_bank, n_gallery), ``gallery_bank_scores`` SG (n_gallery_bank,
    n_gallery): arrays or memory maps; ``n_gallery`` is needed only when neither is given;
    ``statistics``: bank statistics already computed for these matrices (checked to hold what
    every correction needs). Returns the fitted corrections in order.
    """
    from hubless.corrections import make_correction  # the package's registry, complete once imported

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
        raise MissingInputError(
            "query_bank_scores", f"{needing[0].spec} needs the query bank's scores (reference queries x gallery): pass {{arg}}"
        )
    requiring = [c for c in items if c.gallery_bank_use == "required"]
    if requiring and sg is None:
        raise MissingInputError(
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
