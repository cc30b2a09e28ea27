"""Cross-domain Similarity Local Scaling (Conneau et al. 2018)."""

from __future__ import annotations

import numpy as np

from hubless._validation import check_k
from hubless.corrections.nnn import POWERS_OF_TWO, TopKMeanBias
from hubless.corrections.queries import QueryRequest
from hubless.corrections.spec import METHODS

__all__ = ["CSLS"]


@METHODS.register
class CSLS(TopKMeanBias):
    """CSLS (Conneau et al. 2018; as cast in QB-Norm, Bogolin et al. 2022, section 3.4).

        score(q, r) = 2 s(q, r) - r_q - r_r
        r_r = mean of the k largest s(b, r) over query-bank items b
        r_q = mean of the k largest s(q, g) over gallery items g

    r_q is constant for a query, so CSLS ranks exactly as NNN with alpha = 1/2 and the same k
    (weight 0.5, not adjustable); r_q is only needed for the scores shown, and comes from the
    query's raw top-k (see :attr:`query_request`). ``gallery_bank`` is ignored.
    """

    name = "csls"
    order = 30
    summary = "CSLS (Conneau et al. 2018): 2s - r_q - r_r, ranks as NNN with alpha 1/2"
    default_grid = {"k": POWERS_OF_TWO}

    def __init__(self, k: int = 10, *, normalize: bool = True) -> None:
        self.k = k
        super().__init__(normalize=normalize)

    @property
    def query_request(self) -> QueryRequest:
        return QueryRequest(topk=self.k)

    @property
    def ranking_request(self) -> QueryRequest:
        return QueryRequest()  # r_q is constant per query: ranking needs none of it

    def check_sizes(self, n_gallery, n_query_bank, n_gallery_bank) -> None:
        super().check_sizes(n_gallery, n_query_bank, n_gallery_bank)
        check_k(self.k, n_gallery, "k", "the gallery")

    def weight(self) -> float:
        return 0.5

    def method_scores(self, batch, ranking):
        stats = self.query_statistics(batch)
        assert stats is not None and stats.topk is not None  # query_request asks for the top-k
        r_q = stats.topk[:, : self.k].mean(axis=1, dtype=np.float64)
        return (2.0 * ranking - r_q[:, None]).astype(np.float32)
