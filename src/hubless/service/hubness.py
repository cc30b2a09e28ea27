"""The hubness panel (``GET /hubness/{name}``): N_1 of every gallery item over the stored
query bank, before and after the correction (:func:`bank_hubness`), and the hubness of what is
actually served (:class:`ServedSketch`)."""

from __future__ import annotations

import threading

import numpy as np

__all__ = ["HUBNESS_SAMPLE", "ServedSketch", "bank_hubness"]

#: Bank queries the hubness panel measures on (a seeded sample of the stored query bank).
HUBNESS_SAMPLE = 2000


def bank_hubness(s) -> dict:
    """N_1 of every gallery item over the stored query bank, before and after the correction,
    with their skewness and kurtosis, the largest hubs and the bank's coverage (computed once
    per served version of the index)."""
    index = s.index
    cached = s.hubness
    if cached is not None and cached[0] is index:
        return cached[1]
    from hubless.engine import exact_search
    from hubless.metrics.hubness import kurtosis, skewness

    bank = index.query_bank
    if bank is None:
        return {"index": s.name, "n_bank_queries": 0, "note": "the index was saved without its query bank: no bank-based figures"}
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
        "coverage": float(np.count_nonzero(before)) / index.ntotal,  # the bank's nearest items: the N_1 above
        "hubs": [
            {"id": int(j), "n1_before": int(before[j]), "n1_after": int(after[j]), "metadata": None if meta is None else meta[int(j)]}
            for j in hubs
        ],  # fmt: skip
        "histogram": {"before": np.bincount(before).tolist(), "after": np.bincount(after).tolist()},
    }
    s.hubness = (index, result)
    return result


class ServedSketch:
    """The hubness of what an index actually serves: the k-occurrence of returned items, kept
    as exact counts per item (8 bytes per item and counter; updating costs O(results), not
    O(items)). ``n1[j]``: queries whose top result was item j; ``nk[j]``: queries that got item j
    anywhere in their results. :meth:`summary` gives N_1's skewness (as
    :func:`hubless.metrics.hubness.skewness` over every item, 0 for the unserved), the share of
    all returned results taken by the top 1% of items (the most returned ceil(n/100)), the
    largest N_1 and the top hubs. Counts follow item positions; when items are removed the
    counts restart (positions move)."""

    def __init__(self, n_items: int) -> None:
        self.lock = threading.Lock()
        self.queries = 0
        self.n1 = np.zeros(n_items, np.int64)
        self.nk = np.zeros(n_items, np.int64)

    def add(self, ids: np.ndarray, n_items: int) -> None:
        """Count one search's results (``ids`` (n_queries, k), -1 for an unfilled slot)."""
        ids = np.asarray(ids)
        if ids.size == 0:
            return
        with self.lock:
            if n_items != self.n1.shape[0]:
                self._resize(n_items)
            top = ids[:, 0]
            np.add.at(self.n1, top[(top >= 0) & (top < n_items)], 1)
            flat = ids.ravel()
            np.add.at(self.nk, flat[(flat >= 0) & (flat < n_items)], 1)
            self.queries += ids.shape[0]

    def _resize(self, n_items: int) -> None:
        if n_items > self.n1.shape[0]:  # items added at the end: the others keep their counts
            grow = n_items - self.n1.shape[0]
            self.n1 = np.concatenate([self.n1, np.zeros(grow, np.int64)])
            self.nk = np.concatenate([self.nk, np.zeros(grow, np.int64)])
        else:  # items removed: positions moved, start over
            self.n1, self.nk, self.queries = np.zeros(n_items, np.int64), np.zeros(n_items, np.int64), 0

    def summary(self, top: int = 10) -> dict:
        """queries, n1_skewness, top1pct_share, n1_max and the ``top`` largest hubs (id, N_1, N_k)."""
        from hubless.metrics.hubness import skewness

        with self.lock:
            n1, nk, queries = self.n1.copy(), self.nk.copy(), self.queries
        n = n1.shape[0]
        if queries == 0 or n == 0:
            return {"queries": queries, "n1_skewness": None, "top1pct_share": None, "n1_max": 0, "hubs": []}
        share_items = max(1, -(-n // 100))
        total = int(nk.sum())
        top_share = float(np.partition(nk, n - share_items)[n - share_items :].sum() / total) if total else None
        hubs = np.argsort(-n1, kind="stable")[: min(top, n)] if top else np.empty(0, np.int64)
        return {
            "queries": queries,
            "n1_skewness": skewness(n1),
            "top1pct_share": top_share,
            "n1_max": int(n1.max()),
            "hubs": [{"id": int(j), "n1": int(n1[j]), "nk": int(nk[j])} for j in hubs if n1[j] > 0],
        }
