"""Test-time hubness corrections, each a per-candidate bias fitted on reference banks.

See ``docs/explanation/methods.md`` for every method and its formula. Every class shares the interface of
:class:`~hubless.corrections.base.Correction` (``fit``, ``score``, ``search``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.base import Correction
from hubless.corrections.baseline import Baseline
from hubless.corrections.csls import CSLS
from hubless.corrections.dbnorm import DualDIS, DualIS
from hubless.corrections.dn import DN
from hubless.corrections.fit_inputs import validate_fit_inputs
from hubless.corrections.gc import GlobalCorrection
from hubless.corrections.nnn import NNN
from hubless.corrections.qbnorm import DynamicInvertedSoftmax, InvertedSoftmax
from hubless.corrections.queries import QueryBatch, QueryRequest, QueryStatistics
from hubless.corrections.spec import METHODS, MethodName, make_additive, make_correction, method_help
from hubless.engine import BankStatistics, StatisticsRequest, compute_statistics, use_device
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
    "make_additive",
    "make_correction",
    "method_help",
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
    device: str | None = None,
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
    device: str | None = None,
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
            c._fit_arrays(g, stats, duplicates)
        first = stats if first is None else first
    assert first is not None  # at least one group
    return list(items), first
