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
    index = s.index.snapshot()  # one version for the whole computation
    cached = s.hubness
    if cached is not None and cached[0] is index:
        return cached[1]
    from hubless.metrics.hubness import kurtosis, skewness
    from hubless.search import AttachedIndex, StoreIndex

    bank = index.query_bank
    if isinstance(index, AttachedIndex):
        note = (
            "an attached collection: its sidecar keeps the query bank's fingerprint, not the bank, so there are no bank-based "
            "figures; 'served' counts the answers of its certified searches"
        )
        return {"index": s.name, "n_bank_queries": 0, "note": note}
    if isinstance(index, StoreIndex):
        note = "a store written by hubless export keeps no query bank, so there are no bank-based figures; 'served' counts its answers"
        return {"index": s.name, "n_bank_queries": 0, "note": note}
    if bank is None:
        return {"index": s.name, "n_bank_queries": 0, "note": "the index was saved without its query bank: no bank-based figures"}
    if bank.shape[0] > HUBNESS_SAMPLE:
        bank = bank[np.sort(np.random.default_rng(0).choice(bank.shape[0], HUBNESS_SAMPLE, replace=False))]
    raw_top = index.search_uncorrected(bank, 1, nprobe=1 << 30, ef_search=4096)[1][:, 0]  # exact: every list probed
    top = index.search(bank, 1)[1][:, 0]
    before = np.bincount(index.positions(raw_top[raw_top >= 0]), minlength=index.ntotal)  # N_1 per item, in index order
    after = np.bincount(index.positions(top[top >= 0]), minlength=index.ntotal)
    hubs = np.argsort(-before, kind="stable")[:10]
    hub_ids = index.ids[hubs]
    meta = None if index.metadata_schema is None else index.records(hub_ids)
    result = {
        "index": s.name,
        "n_bank_queries": int(bank.shape[0]),
        "before": {"skewness": skewness(before), "kurtosis": kurtosis(before), "max": int(before.max())},
        "after": {"skewness": skewness(after), "kurtosis": kurtosis(after), "max": int(after.max())},
        "coverage": float(np.count_nonzero(before)) / index.ntotal,  # the bank's nearest items: the N_1 above
        "hubs": [
            {"id": int(i), "n1_before": int(before[j]), "n1_after": int(after[j]), "metadata": None if meta is None else meta[r]}
            for r, (i, j) in enumerate(zip(hub_ids, hubs))
        ],
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
    largest N_1 and the top hubs. Counts are kept per item id (ids are stable: writes never
    move them); ``n_items`` is the index's latest size."""

    def __init__(self, n_items: int) -> None:
        from collections import Counter

        self.lock = threading.Lock()
        self.queries = 0
        self.n_items = n_items
        self.n1_by_id: Counter = Counter()
        self.nk_by_id: Counter = Counter()

    def add(self, ids: np.ndarray, n_items: int) -> None:
        """Count one search's results (``ids`` (n_queries, k) item ids, -1 for an unfilled slot)."""
        ids = np.asarray(ids)
        if ids.size == 0:
            return
        top = ids[:, 0]
        flat = ids.ravel()
        with self.lock:
            self.n_items = n_items
            self.n1_by_id.update(top[top >= 0].tolist())
            self.nk_by_id.update(flat[flat >= 0].tolist())
            self.queries += ids.shape[0]

    @property
    def n1(self) -> np.ndarray:
        """N_1 of every item (0 for the items never returned first), in no particular order."""
        return self._counts(self.n1_by_id)

    @property
    def nk(self) -> np.ndarray:
        return self._counts(self.nk_by_id)

    def _counts(self, counter) -> np.ndarray:
        values = np.fromiter(counter.values(), np.int64, count=len(counter))
        return np.concatenate([values, np.zeros(max(0, self.n_items - values.size), np.int64)])

    def summary(self, top: int = 10) -> dict:
        """queries, n1_skewness, top1pct_share, n1_max and the ``top`` largest hubs (id, N_1, N_k)."""
        from hubless.metrics.hubness import skewness

        with self.lock:
            n1, nk, queries = self.n1, self.nk, self.queries
            common = self.n1_by_id.most_common(top) if top else []
            hubs = [{"id": int(i), "n1": int(c), "nk": int(self.nk_by_id[i])} for i, c in common]
        n = n1.shape[0]
        if queries == 0 or n == 0:
            return {"queries": queries, "n1_skewness": None, "top1pct_share": None, "n1_max": 0, "hubs": []}
        share_items = max(1, -(-n // 100))
        total = int(nk.sum())
        top_share = float(np.partition(nk, n - share_items)[n - share_items :].sum() / total) if total else None
        return {"queries": queries, "n1_skewness": skewness(n1), "top1pct_share": top_share, "n1_max": int(n1.max()), "hubs": hubs}
