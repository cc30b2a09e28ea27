"""The hubness panel: N_1 of every gallery item over the stored query bank, before and after
the correction (``GET /hubness/{name}``)."""

from __future__ import annotations

import numpy as np
from fastapi import HTTPException

from hubless.service.state import Served

__all__ = ["HUBNESS_SAMPLE", "bank_hubness"]

#: Bank queries the hubness panel measures on (a seeded sample of the stored query bank).
HUBNESS_SAMPLE = 2000


def bank_hubness(s: Served) -> dict:
    """N_1 of every gallery item over the stored query bank, before and after the correction,
    with their skewness and kurtosis, the largest hubs and the bank's coverage (computed once
    per served version of the index)."""
    index = s.index
    cached = s.hubness
    if cached is not None and cached[0] is index:
        return cached[1]
    from hubless.banks import bank_report
    from hubless.engine import exact_search
    from hubless.metrics.hubness import kurtosis, skewness

    bank = index.query_bank
    if bank is None:
        raise HTTPException(422, f"index {s.name!r} was saved without its query bank: no hubness to show")
    if bank.shape[0] > HUBNESS_SAMPLE:
        bank = bank[np.sort(np.random.default_rng(0).choice(bank.shape[0], HUBNESS_SAMPLE, replace=False))]
    gallery = index.correction.gallery_
    before = np.bincount(exact_search(bank, gallery, 1)[1][:, 0], minlength=index.ntotal)
    ids = index.search(bank, 1)[1][:, 0]
    after = np.bincount(ids[ids >= 0], minlength=index.ntotal)
    hubs = np.argsort(-before, kind="stable")[:10]
    meta = index.metadata
    result = {
        "index": s.name,
        "n_bank_queries": int(bank.shape[0]),
        "before": {"skewness": skewness(before), "kurtosis": kurtosis(before), "max": int(before.max())},
        "after": {"skewness": skewness(after), "kurtosis": kurtosis(after), "max": int(after.max())},
        "coverage": bank_report(gallery, bank, normalize=False).coverage,
        "hubs": [
            {"id": int(j), "n1_before": int(before[j]), "n1_after": int(after[j]), "metadata": None if meta is None else meta[int(j)]}
            for j in hubs
        ],  # fmt: skip
        "histogram": {"before": np.bincount(before).tolist(), "after": np.bincount(after).tolist()},
    }
    s.hubness = (index, result)
    return result
