"""Distribution Normalization (Zhou et al. 2023)."""

from __future__ import annotations

import numpy as np

from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.spec import METHODS

__all__ = ["DN"]


@METHODS.register
class DN(AdditiveCorrection):
    """Distribution Normalization (Zhou et al. 2023), a first-order approximation of DualIS.

        score(q, r) = (q - lam * mu_B) . (r - lam * mu_G)
                    = s(q, r) - lam * mu_B . r  - lam * q . mu_G + lam^2 * mu_B . mu_G

    mu_B is the mean of the query bank; mu_G the mean of ``gallery_bank`` when given, else of the
    gallery itself. Only ``mu_B . r`` varies with r, so DN ranks as s - lam * bias(r) with
    bias(r) = mu_B . r; ``lam`` (the paper's lambda, >= 0) is the weight and can be changed at
    search time (``search(q, weight=0.5)``).
    """

    name = "dn"
    order = 20
    query_state_attrs = ("query_bank_mean_", "gallery_mean_")
    summary = "Distribution Normalization (Zhou et al. 2023): (q - lam mu_B).(r - lam mu_G)"
    default_grid = {"lam": tuple(round(0.1 * i, 1) for i in range(11))}
    weight_param = "lam"
    gallery_bank_use = "optional"
    needs_embeddings = (
        "DN ranks by s - lam mu_B . r with mu_B the mean of the query bank's embeddings (and shows scores with the gallery "
        "bank's mean): score matrices hold no embeddings; give embeddings (gallery, queries, query bank)"
    )

    def __init__(self, lam: float = 0.5, *, normalize: bool = True) -> None:
        self.lam = lam
        super().__init__(normalize=normalize)

    def weight(self) -> float:
        return float(self.lam)

    def _bias_columns(self, statistics) -> np.ndarray:
        self.query_bank_mean_ = statistics.query_bank_mean
        mean = statistics.gallery_bank_mean
        self.gallery_mean_ = statistics.gallery_mean if mean is None else mean
        return self.gallery_ @ self.query_bank_mean_.astype(np.float32)

    def method_scores(self, batch, ranking):
        lam = self.weights(batch)[:, :1].astype(np.float64)
        per_query = -lam * (batch.vectors @ self.gallery_mean_)[:, None] + lam**2 * (self.query_bank_mean_ @ self.gallery_mean_)
        return (ranking + per_query).astype(np.float32)
