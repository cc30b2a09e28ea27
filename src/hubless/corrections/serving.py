"""What an inner-product index or store can serve, and the query rows it is searched with.

An additive correction ranks by ``s(q, r) - W(q) . bias(r)``, the inner product of
``[q, -W(q)]`` and ``[r, bias(r)]`` (DESIGN.md; the one idea of docs/architecture.md):

* :func:`check_additive`: a per-candidate bias at all (GC, which ranks by probes, is not): what a
  hubless ``Index`` serves, re-scoring its candidates exactly with the ranking hook;
* :func:`check_servable_as_rows`: additive *and* needing nothing of each query's raw neighbours
  (DIS/DualDIS gates, CSLS's r_q), so rows ``[r, bias(r)]`` searched with ``[q, -W(q)]`` alone
  give its ranking: what a vector database or exported row files serve;
* :func:`weighted_query_rows` / :func:`query_vectors`: those ``[q, -W(q)]`` rows.
"""

from __future__ import annotations

import numpy as np

from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.base import Correction
from hubless.errors import InvalidInput, InvalidType

__all__ = ["check_additive", "check_servable_as_rows", "query_vectors", "weighted_query_rows"]


def check_additive(corr: Correction) -> AdditiveCorrection:
    """``corr`` if it is a per-candidate bias; InvalidType otherwise (GC ranks by probes)."""
    if not isinstance(corr, AdditiveCorrection):
        raise InvalidType(
            f"{type(corr).__name__} is not additive (GC ranks by probes): it cannot be served from a vector index or store; "
            "use its exact search()"
        )
    return corr


def check_servable_as_rows(corr) -> None:
    """Refuse a correction that [r, bias(r)] rows and [q, -W(q)] cannot serve: its score needs
    each query's raw neighbours (DIS/DualDIS gates, CSLS's r_q) or is not additive (GC)."""
    if not getattr(corr, "exactly_additive", False) or corr.query_request.depth:
        raise InvalidInput(
            f"{corr.spec} needs each query's raw neighbours (DIS/DualDIS gates, CSLS's r_q) or is not additive (GC): "
            "it cannot be served as [r, bias] rows; search it with hubless's own Index"
        )


def weighted_query_rows(corr, batch, pad: int = 0) -> np.ndarray:
    """[q, -W(q)] of a :class:`~hubless.corrections.queries.QueryBatch` (and ``pad`` zero columns
    where a store's layout pads its rows), float32."""
    parts = [batch.vectors, -corr.weights(batch)]
    if pad:
        parts.append(np.zeros((len(batch.vectors), int(pad)), np.float32))
    return np.hstack(parts).astype(np.float32)


def query_vectors(corr, queries, **weight) -> np.ndarray:
    """[q, -W(q)] of ``queries`` for a correction served as [r, bias(r)] rows elsewhere (a
    store, parts written on Ray): ``xq . row = s(q, r) - W(q) . bias(r)``, the ranking score.
    ``corr`` is fitted, or set up with :meth:`~hubless.corrections.additive.AdditiveCorrection.for_queries`."""
    check_servable_as_rows(corr)
    return weighted_query_rows(corr, corr.queries(queries, **weight))
