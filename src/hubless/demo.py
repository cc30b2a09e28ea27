"""The built-in demo: every correction on a synthetic benchmark, before and after."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hubless.corrections import METHODS, fit_many
from hubless.data.synthetic import SyntheticRetrieval, make_retrieval_data
from hubless.metrics import k_occurrence, recall_at_k

__all__ = ["DemoRow", "DEFAULT_METHODS", "run_demo"]

#: Every correction at its documented defaults.
DEFAULT_METHODS = tuple(METHODS)


@dataclass
class DemoRow:
    """One method's text->image result: R@1 (%) and the largest hub (max N_1)."""

    method: str
    spec: str
    r_at_1: float
    largest_hub: int


def run_demo(
    data: SyntheticRetrieval | None = None,
    methods=DEFAULT_METHODS,
    *,
    progress: bool | None = None,
) -> list[DemoRow]:
    """Fit every method on the banks of ``data`` (default: :func:`make_retrieval_data`) and
    search its queries; returns one row per method, the baseline first when present."""
    data = make_retrieval_data() if data is None else data
    fitted = fit_many(methods, data.gallery, data.query_bank, data.gallery_bank, progress=progress)
    rows = []
    for corr in fitted:
        _, ids = corr.search(data.queries, top_k=1, progress=progress)
        hubs = k_occurrence(ids, data.gallery.shape[0], k=1)
        rows.append(
            DemoRow(
                method=corr.name,
                spec=corr.spec,
                r_at_1=recall_at_k(ids, data.query_item, 1),
                largest_hub=int(np.max(hubs)),
            )
        )
    rows.sort(key=lambda r: r.method != "baseline")
    return rows
