"""Test-time hubness corrections, each a per-candidate bias fitted on reference banks.

See ``docs/explanation/methods.md`` for every method and its formula. Every class shares the
interface of :class:`~hubless.corrections.base.Correction` (``fit``, ``search``, ``score``,
``bias``, ``save``; :func:`load_correction` reads a saved one back). In-place updates are the
functions of :mod:`~hubless.corrections.incremental`, fitting on score matrices those of
:mod:`~hubless.corrections.score_fit`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hubless.corrections import (
    deprecated_methods,  # noqa: F401  (sets the methods moved to incremental and score_fit, until 0.2.0)
    incremental,
    score_fit,
)
from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.base import Correction, is_own_copy
from hubless.corrections.baseline import Baseline
from hubless.corrections.csls import CSLS
from hubless.corrections.dn import DN
from hubless.corrections.dual_inverted_softmax import DualDIS, DualIS
from hubless.corrections.fit_inputs import validate_fit_inputs
from hubless.corrections.global_correction import GlobalCorrection
from hubless.corrections.inverted_softmax import DynamicInvertedSoftmax, InvertedSoftmax
from hubless.corrections.nnn import NNN
from hubless.corrections.queries import QueryBatch, QueryRequest, QueryStatistics
from hubless.corrections.saved import load_correction
from hubless.corrections.spec import METHODS, MethodName, make_additive, make_correction, method_help
from hubless.engine import BankStatistics, StatisticsRequest, compute_statistics, use_device
from hubless.engine.device import DeviceName
from hubless.engine.duplicates import find_duplicates
from hubless.errors import InvalidInput

__all__ = [
    "AdditiveCorrection",
    "Baseline",
    "CSLS",
    "Correction",
    "DN",
    "DualDIS",
    "DualIS",
    "DynamicInvertedSoftmax",
    "GlobalCorrection",
    "InvertedSoftmax",
    "METHODS",
    "MethodName",
    "NNN",
    "QueryBatch",
    "QueryRequest",
    "QueryStatistics",
    "fit_many",
    "fit_shared",
    "incremental",
    "load_correction",
    "make_additive",
    "make_correction",
    "method_help",
    "score_fit",
    "statistics_request",
]


def statistics_request(corrections: Iterable[Correction]) -> StatisticsRequest:
    """The one request that satisfies every correction (parameters validated first): what a
    shared pass over the banks must compute."""
    request = StatisticsRequest()
    for c in corrections:
        c._validate_params()
        request = request.merge(c.statistics_request())
    return request


def fit_many(
    corrections: Iterable[Correction | MethodName | str],
    gallery,
    query_bank=None,
    gallery_bank=None,
    *,
    progress: bool | None = None,
    device: DeviceName = None,
) -> list[Correction]:
    """Fit several corrections on the same arrays with one streamed pass per bank.

    Their statistics requests are merged (e.g. NNN at k=4 and k=64 and CSLS share one top-64
    pass; IS at several betas shares one pass), computed once, and each correction is fitted
    from them. Accepts correction objects or specs such as ``"nnn:alpha=0.5,k=16"``; returns the
    fitted corrections in order. Corrections with different ``normalize`` settings are grouped.
    """
    return fit_shared(corrections, gallery, query_bank, gallery_bank, progress=progress, device=device)[0]


def fit_shared(
    corrections: Iterable[Correction | MethodName | str],
    gallery,
    query_bank=None,
    gallery_bank=None,
    *,
    also: StatisticsRequest | None = None,
    progress: bool | None = None,
    device: DeviceName = None,
) -> tuple[list[Correction], BankStatistics]:
    """:func:`fit_many`, also returning the bank statistics of the pass, with ``also`` computed
    in it (e.g. ``StatisticsRequest(query_nearest=True)``: the bank's coverage, from the very
    blocks that fit the corrections). With several ``normalize`` groups, the statistics are the
    first group's (``also`` is computed there)."""
    items: Sequence[Correction] = [make_correction(c) for c in corrections]
    if not items:
        raise InvalidInput("no correction to fit")
    first: BankStatistics | None = None
    for flag in dict.fromkeys(bool(c.normalize) for c in items):
        group = [c for c in items if bool(c.normalize) == flag]
        request = statistics_request(group)
        if first is None and also is not None:
            request = request.merge(also)
        g, b, gb = validate_fit_inputs(group, gallery, query_bank, gallery_bank, use_query_bank=first is None and also is not None)
        duplicates = find_duplicates(g)  # once for every correction of the group
        with use_device(device):  # where the block products run (see hubless.engine.device)
            stats = compute_statistics(g, b, gb, request, progress=progress, gallery_duplicates=duplicates)
        for c in group:
            c._fit_arrays(g, stats, duplicates, own=is_own_copy(g, gallery))
        first = stats if first is None else first
    assert first is not None  # at least one group
    return list(items), first
