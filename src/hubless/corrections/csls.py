"""Cross-domain Similarity Local Scaling (Conneau et al. 2018)."""

from __future__ import annotations

import numpy as np

from hubless._validation import check_k, check_positive_int
from hubless.corrections.base import AdditiveCorrection
from hubless.corrections.nnn import topk_mean
from hubless.engine import StatisticsRequest, exact_search

__all__ = ["CSLS"]


class CSLS(AdditiveCorrection):
    """CSLS (Conneau et al. 2018; as cast in QB-Norm, Bogolin et al. 2022, section 3.4).

        score(q, r) = 2 s(q, r) - r_q - r_r
        r_r = mean of the k largest s(b, r) over query-bank items b
        r_q = mean of the k largest s(q, g) over gallery items g

    r_q is constant for a query, so CSLS ranks exactly as NNN with alpha = 1/2 and the same k
    (weight 0.5, not adjustable). ``gallery_bank`` is ignored.
    """

    name = "csls"

    def __init__(self, k: int = 10, *, normalize: bool = True) -> None:
        self.k = k
        super().__init__(normalize=normalize)

    def _validate_params(self) -> None:
        super()._validate_params()
        check_positive_int(self.k, "k")

    def statistics_request(self) -> StatisticsRequest:
        return StatisticsRequest(query_topk=self.k)

    def _check_sizes(self, n_gallery, n_query_bank, n_gallery_bank) -> None:
        check_k(self.k, n_query_bank, "k", "the query bank")
        check_k(self.k, n_gallery, "k", "the gallery")

    def weight(self) -> float:
        return 0.5

    def _bias_columns(self, statistics) -> np.ndarray:
        return topk_mean(statistics, self.k)

    def to_method_scores(self, ranking, queries, weights):
        r_q = exact_search(queries, self.gallery_, self.k)[0].mean(axis=1, dtype=np.float64)
        return (2.0 * ranking - r_q[:, None]).astype(np.float32)

    def _score_block(self, queries, sims):
        n = sims.shape[1]
        r_q = np.partition(sims, n - self.k, axis=1)[:, n - self.k :].mean(axis=1, dtype=np.float64)
        return (2.0 * sims - r_q[:, None].astype(np.float32)) - self.bias_columns_[:, 0]
