"""DBNorm: DualIS and DualDIS (Wang et al. 2023, "Balance act"), as in NNN appendix A1."""

from __future__ import annotations

import numpy as np

from hubless.corrections.base import AdditiveCorrection
from hubless.corrections.qbnorm import LOG_BETAS, ActivationGated, check_beta
from hubless.engine import StatisticsRequest

__all__ = ["DualIS", "DualDIS"]


class DualIS(AdditiveCorrection):
    """DBNorm dual inverted softmax (Wang et al. 2023; NNN paper appendix A1, eqs. 3-5).

        score(q, r) = exp(bq s(q, r)) / sum_b exp(bq s(b, r))  *  exp(bg s(q, r)) / sum_g exp(bg s(g, r))

    with b over the query bank (``beta_query`` = bq) and g over the gallery bank (``beta_gallery``
    = bg; s(g, r) compares two items of the gallery's modality, e.g. image-image). In log space
    this is (bq + bg) * (s - bias) - log(nb) - log(ng) with the centred (log-mean-exp) bias

        bias(r) = [log mean_b exp(bq s(b, r)) + log mean_g exp(bg s(g, r))] / (bq + bg)

    (nb, ng: the bank sizes; see InvertedSoftmax for why the bias is centred). Each beta is 0 or
    within [1e-6, 1e6]. beta_gallery = 0 (the gallery bank's beta) reduces DualIS to IS at
    beta_query (QB-Norm). ``gallery_bank`` is required.
    """

    name = "dualis"
    summary = "DBNorm dual inverted softmax (Wang et al. 2023): normalised over the query and gallery banks"
    default_grid = {"beta_query": LOG_BETAS, "beta_gallery": LOG_BETAS}
    gallery_bank_use = "required"

    def __init__(self, beta_query: float = 20.0, beta_gallery: float = 20.0, *, normalize: bool = True) -> None:
        self.beta_query = beta_query
        self.beta_gallery = beta_gallery
        super().__init__(normalize=normalize)

    def _validate_params(self) -> None:
        super()._validate_params()
        bq = check_beta(self.beta_query, "beta_query", allow_zero=True)
        bg = check_beta(self.beta_gallery, "beta_gallery", allow_zero=True)
        if bq + bg == 0:
            raise ValueError("beta_query and beta_gallery cannot both be 0")

    @property
    def _beta_sum(self) -> float:
        return float(self.beta_query) + float(self.beta_gallery)

    def statistics_request(self) -> StatisticsRequest:
        return StatisticsRequest(
            query_betas=frozenset({float(self.beta_query)}),
            gallery_betas=frozenset({float(self.beta_gallery)}),
        )

    def _log_normalizers(self, statistics) -> np.ndarray:
        """(n_gallery, 2): logsumexp over the query bank and over the gallery bank; keeps the
        log bank sizes that centre them."""
        self.log_normalizers_ = np.stack(
            [statistics.query_lse[float(self.beta_query)], statistics.gallery_lse[float(self.beta_gallery)]],
            axis=1,
        )
        self.log_bank_sizes_ = np.log([statistics.n_query_bank, statistics.n_gallery_bank])
        return self.log_normalizers_

    def _centred_columns(self, statistics) -> np.ndarray:
        """(n_gallery, 2) float64: each bank's log-mean-exp over (bq + bg)."""
        return (self._log_normalizers(statistics) - self.log_bank_sizes_) / self._beta_sum

    def _bias_columns(self, statistics) -> np.ndarray:
        return self._centred_columns(statistics).sum(axis=1)

    def method_scores(self, batch, ranking):
        log_sizes = self._normaliser_log_sizes(batch)[:, None]
        with np.errstate(over="ignore"):  # beyond float32 shows as inf; ranking uses log scores
            return np.exp(self._beta_sum * ranking.astype(np.float64) - log_sizes).astype(np.float32)

    def _normaliser_log_sizes(self, batch) -> np.ndarray:
        """Per query, the log bank sizes the centred biases left out (both banks' here)."""
        return np.full(len(batch), self.log_bank_sizes_.sum())


class DualDIS(ActivationGated, DualIS):
    """DBNorm DualDIS: DualIS with each factor gated by its own activation set.

    A_B (A_G) is the union, over query-bank (gallery-bank) items, of their ``k_activation``
    nearest gallery items. For a query whose raw top-1 item is in A_B the query-bank factor is
    the normalised exp(bq s) / sum_b exp(bq s(b, r)); otherwise it is left unnormalised as
    exp(bq s) (our documented choice: the "ungated" factor in log space is beta * s). Likewise
    for the gallery-bank factor with A_G. In bias form there are two bias columns,
    logsumexp_B / (bq + bg) and logsumexp_G / (bq + bg), weighted per query by the two gates.
    """

    name = "dualdis"
    summary = "DBNorm DualDIS: DualIS with each bank's factor gated by its activation set"

    def __init__(
        self,
        beta_query: float = 20.0,
        beta_gallery: float = 20.0,
        k_activation: int = 1,
        *,
        normalize: bool = True,
    ) -> None:
        self.k_activation = k_activation
        super().__init__(beta_query=beta_query, beta_gallery=beta_gallery, normalize=normalize)

    def statistics_request(self) -> StatisticsRequest:
        return (
            super()
            .statistics_request()
            .merge(StatisticsRequest(query_activation_k=self.k_activation, gallery_activation_k=self.k_activation))
        )

    def _bias_columns(self, statistics) -> np.ndarray:
        self.activation_masks_ = np.stack(
            [
                statistics.activation_mask("query", self.k_activation),
                statistics.activation_mask("gallery", self.k_activation),
            ],
            axis=1,
        )
        return self._centred_columns(statistics)

    def weights(self, batch):
        return self.gates(batch, self.activation_masks_)

    def _normaliser_log_sizes(self, batch) -> np.ndarray:
        return (self.weights(batch) > 0).astype(np.float64) @ self.log_bank_sizes_  # only the open gates' banks
