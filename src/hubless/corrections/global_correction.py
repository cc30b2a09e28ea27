"""Globally-corrected retrieval (Dinu et al. 2015), as cast in QB-Norm (Bogolin et al. 2022)."""

from __future__ import annotations

import numpy as np

from hubless._validation import check_positive_int
from hubless.corrections.base import Correction
from hubless.corrections.spec import METHODS
from hubless.engine import StatisticsRequest
from hubless.errors import InvalidInput

__all__ = ["GlobalCorrection"]


@METHODS.register
class GlobalCorrection(Correction):
    """Globally-corrected (GC) retrieval (Dinu et al. 2015; QB-Norm section 3.4).

        score(q, r) = s(q, r) - Rank(s(q, r), p_r)

    where p_r holds the probes s(b, r) of every query-bank item b and Rank counts the probes
    strictly above s(q, r): a candidate ranks high when the query is closer to it than most bank
    queries are. Rank-based, so not additive: exact search only, no vector index. Fitting keeps
    every probe sorted, n_gallery x n_bank float32 values; ``max_probe_bytes`` (default 4 GiB)
    caps that memory. ``gallery_bank`` is ignored.
    """

    name = "gc"
    order = 80
    summary = "globally-corrected retrieval (Dinu et al. 2015): s minus its rank among the bank probes; exact search only"
    resource_params = ("max_probe_bytes",)

    def __init__(self, max_probe_bytes: int = 4 * 2**30, *, normalize: bool = True) -> None:
        self.max_probe_bytes = max_probe_bytes
        super().__init__(normalize=normalize)

    def _validate_params(self) -> None:
        super()._validate_params()
        check_positive_int(self.max_probe_bytes, "max_probe_bytes")

    @property
    def bias_(self):
        raise AttributeError("GlobalCorrection is rank-based and has no additive bias_")

    def statistics_request(self) -> StatisticsRequest:
        return StatisticsRequest(query_probes=True)

    def check_sizes(self, n_gallery, n_query_bank, n_gallery_bank) -> None:
        need = 4 * n_gallery * n_query_bank
        if need > self.max_probe_bytes:
            raise InvalidInput(
                f"GC keeps n_gallery x n_bank = {n_gallery} x {n_query_bank} sorted probes "
                f"({need / 2**30:.1f} GiB), above max_probe_bytes={self.max_probe_bytes}; use a smaller "
                "query bank, raise max_probe_bytes, or prefer an additive correction such as NNN"
            )

    def _fit_statistics(self, statistics) -> None:
        self.probes_ = statistics.query_probes

    def _rank(self, batch, sims, columns, out):
        """sims - (number of probes of each item strictly above sims), item by item."""
        if out is None:
            out = np.array(sims, dtype=np.float32, copy=True)
        elif out is not sims:
            out[...] = sims
        n_bank = self.probes_.shape[1]
        if isinstance(columns, np.ndarray):  # per-query items: one pass per distinct item
            for item in np.unique(columns):
                rows, cols = np.nonzero(columns == item)
                at_or_below = np.searchsorted(self.probes_[item], out[rows, cols], side="right")
                out[rows, cols] -= (n_bank - at_or_below).astype(np.float32)
            return out
        first = 0 if columns is None else columns.start
        for j in range(out.shape[1]):
            at_or_below = np.searchsorted(self.probes_[first + j], out[:, j], side="right")
            out[:, j] -= (n_bank - at_or_below).astype(np.float32)
        return out
