"""Nearest Neighbor Normalization (Chowdhury et al. 2024)."""

from __future__ import annotations

import numpy as np

from hubless._validation import check_k, check_positive_int
from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.spec import METHODS
from hubless.engine import StatisticsRequest

__all__ = ["NNN", "TopKMeanBias", "topk_mean"]

#: k in {1, 2, 4, ..., 512}: the NNN paper's grid (appendix B), also used for CSLS.
POWERS_OF_TWO = tuple(2**i for i in range(10))


def topk_mean(statistics, k: int) -> np.ndarray:
    """Mean of the k largest s(b, r) over the query bank, for every gallery item r (float32)."""
    return statistics.query_topk[:, :k].mean(axis=1, dtype=np.float64).astype(np.float32)


class TopKMeanBias(AdditiveCorrection):
    """Shared by NNN and CSLS: bias(r) = mean of the ``k`` largest s(b, r) over the query bank."""

    k: int

    def _validate_params(self) -> None:
        super()._validate_params()
        check_positive_int(self.k, "k")

    def statistics_request(self) -> StatisticsRequest:
        return StatisticsRequest(query_topk=self.k)

    def check_sizes(self, n_gallery, n_query_bank, n_gallery_bank) -> None:
        check_k(self.k, n_query_bank, "k", "the query bank")

    def _bias_columns(self, statistics) -> np.ndarray:
        return topk_mean(statistics, self.k)


@METHODS.register
class NNN(TopKMeanBias):
    """Nearest Neighbor Normalization (Chowdhury et al. 2024, eqs. 1-2).

        bias(r) = (1/k) * sum of the k largest s(b, r) over query-bank items b
        score(q, r) = s(q, r) - alpha * bias(r)

    ``alpha`` (the paper's name) is the weight w (>= 0) and can be changed at search time
    (``search(q, weight=0.5)``); alpha = 0 is the baseline. The paper tunes alpha in {0.25, ..., 1.5}, k in {1, ..., 512}.
    ``gallery_bank`` is ignored.
    """

    name = "nnn"
    order = 10
    summary = "Nearest Neighbor Normalization (Chowdhury et al. 2024): s - alpha x mean top-k bank similarity"
    default_grid = {"alpha": tuple(0.25 + 0.125 * i for i in range(11)), "k": POWERS_OF_TWO}
    weight_param = "alpha"

    def __init__(self, alpha: float = 0.75, k: int = 16, *, normalize: bool = True) -> None:
        self.alpha = alpha
        self.k = k
        super().__init__(normalize=normalize)

    def weight(self) -> float:
        return float(self.alpha)
