"""DBNorm: DualIS and DualDIS (Wang et al. 2023, "Balance act"), as in NNN appendix A1."""

from __future__ import annotations

import numpy as np

from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.inverted_softmax import LOG_BETAS, ActivationGated, check_beta, log_mean_exp_bias
from hubless.corrections.spec import METHODS
from hubless.engine import StatisticsRequest
from hubless.errors import InvalidInput

__all__ = ["DualIS", "DualDIS"]


@METHODS.register
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
    order = 60
    query_state_attrs = ("log_bank_sizes_",)
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
            raise InvalidInput("beta_query and beta_gallery cannot both be 0")

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
        sizes = np.array([statistics.n_query_bank, statistics.n_gallery_bank])
        return log_mean_exp_bias(self._log_normalizers(statistics), sizes, self._beta_sum)

    def _bias_columns(self, statistics) -> np.ndarray:
        return self._centred_columns(statistics).sum(axis=1)

    def method_scores(self, batch, ranking):
        log_sizes = self._normaliser_log_sizes(batch)[:, None]
        with np.errstate(over="ignore"):  # beyond float32 shows as inf; ranking uses log scores
            return np.exp(self._beta_sum * ranking.astype(np.float64) - log_sizes).astype(np.float32)

    def _normaliser_log_sizes(self, batch) -> np.ndarray:
        """Per query, the log bank sizes the centred biases left out (both banks' here)."""
        return np.full(len(batch), self.log_bank_sizes_.sum())


@METHODS.register
class DualDIS(ActivationGated, DualIS):
    """DBNorm DualDIS: DualIS with each factor gated by its own activation set.

    A_B (A_G) is the union, over query-bank (gallery-bank) items, of their ``k_activation``
    nearest gallery items. For a query whose raw top-1 item is in A_B the query-bank factor is
    the normalised exp(bq s) / sum_b exp(bq s(b, r)); likewise the gallery-bank factor with A_G.
    A factor whose gate does not fire is, as published (NNN paper, appendix A1, and DBNorm),
    the raw score s (``ungated="raw"``, the default):

        score(q, r) = F_B * F_G,   F_X = exp(bX s) / sum_x exp(bX s(x, r)) if q's gate X fires, else s

    With both gates open this is DualIS (a plain bias, served by any inner-product index).
    With one or none open, s enters as a factor, log s + bX s - lse_X(r) or s * s, which is no
    longer a bias: :class:`hubless.Index` serves it by exact re-scoring of the candidates its
    FAISS index finds with the bias form (and by exact search on a Flat index). Items with s <= 0
    would get a score <= 0 (one raw factor) or s * s (two, which would rank opposite vectors
    first): hubless ranks them after every item with s > 0, in index order, and shows 0.

    ``ungated="exp"`` keeps the earlier hubless form, in which an ungated factor is exp(bX s)
    (unnormalised): then every gate combination is a bias, two columns lse_B / (bq + bg) and
    lse_G / (bq + bg) weighted per query by the gates, and any inner-product index serves it.
    """

    name = "dualdis"
    order = 70
    summary = "DBNorm DualDIS: DualIS with each bank's factor gated by its activation set (raw score when a gate does not fire)"

    def __init__(
        self,
        beta_query: float = 20.0,
        beta_gallery: float = 20.0,
        k_activation: int = 1,
        *,
        ungated: str = "raw",
        normalize: bool = True,
    ) -> None:
        self.k_activation = k_activation
        self.ungated = ungated
        super().__init__(beta_query=beta_query, beta_gallery=beta_gallery, normalize=normalize)

    def _validate_params(self) -> None:
        super()._validate_params()
        if self.ungated not in ("raw", "exp"):
            raise InvalidInput(f"ungated must be 'raw' (as published) or 'exp'; got {self.ungated!r}")

    @property
    def exactly_additive(self) -> bool:
        return self.ungated == "exp"

    def statistics_request(self) -> StatisticsRequest:
        return (
            super()
            .statistics_request()
            .merge(StatisticsRequest(query_activation_k=self.k_activation, gallery_activation_k=self.k_activation))
        )

    def _fit_gates(self, statistics) -> None:
        self.activation_masks_ = np.stack(
            [
                statistics.activation_mask("query", self.k_activation),
                statistics.activation_mask("gallery", self.k_activation),
            ],
            axis=1,
        )

    def _bias_columns(self, statistics) -> np.ndarray:
        return self._centred_columns(statistics)

    def gate_masks(self) -> np.ndarray:
        return self.activation_masks_

    def _normaliser_log_sizes(self, batch) -> np.ndarray:
        return (self.weights(batch) > 0).astype(np.float64) @ self.log_bank_sizes_  # only the open gates' banks

    # ------------------------------------------------------------------ the published (raw) form
    def _rank(self, batch, sims, columns, out):
        if self.ungated == "exp":
            return super()._rank(batch, sims, columns, out)
        gates = np.greater(self.weights(batch), 0)
        cols = (
            self.bias_columns_[columns]
            if isinstance(columns, np.ndarray)
            else (self.bias_columns_ if columns is None else self.bias_columns_[columns])
        )
        out = np.empty_like(sims) if out is None else out
        bq, bg, bsum = float(self.beta_query), float(self.beta_gallery), self._beta_sum
        for open_q, open_g in ((True, True), (True, False), (False, True), (False, False)):
            rows = np.flatnonzero((gates[:, 0] == open_q) & (gates[:, 1] == open_g))
            if not rows.size:
                continue
            s = sims[rows]
            c = cols[rows] if cols.ndim == 3 else cols[None, :, :]
            if open_q and open_g:  # DualIS: s - cQ - cG (centred; exp(bsum * this) / (nB nG) is the score)
                out[rows] = s - c[..., 0] - c[..., 1]
                continue
            s64 = s.astype(np.float64)
            with np.errstate(divide="ignore"):
                log_s = np.log(np.where(s > 0, s64, 0.0))
            if open_q:  # log F + log nB = log s + bq s - lse_B = log s + bq s - bsum cQ
                r = log_s + bq * s64 - bsum * c[..., 0]
            elif open_g:
                r = log_s + bg * s64 - bsum * c[..., 1]
            else:  # F = s * s: ranks as s for s > 0
                r = np.where(s > 0, s64, -np.inf)
            out[rows] = np.where(s > 0, r, -np.inf)
        return out

    def method_scores(self, batch, ranking):
        if self.ungated == "exp":
            return super().method_scores(batch, ranking)
        gates = np.greater(self.weights(batch), 0)
        r = ranking.astype(np.float64)
        # per query, the ranking is (bq + bg) s - ... (both gates), log F + log n_X (one) or s (none):
        # the score is exp(scale r - log sizes of the open gates' banks), or r * r with no gate open
        scale = np.where(gates.all(axis=1), self._beta_sum, 1.0)[:, None]
        none = ~gates.any(axis=1)[:, None]
        with np.errstate(over="ignore", invalid="ignore"):
            score = np.where(none, r * r, np.exp(scale * r - self._normaliser_log_sizes(batch)[:, None]))
        return np.where(np.isneginf(r), 0.0, score).astype(np.float32)
