"""Querybank Normalisation: inverted softmax (IS) and dynamic inverted softmax (DIS).

Bogolin et al. 2022, "Cross modal retrieval with querybank normalisation", eqs. 1-2.
"""

from __future__ import annotations

import numpy as np

from hubless._validation import check_k, check_nonnegative_float, check_positive_int
from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.base import Correction
from hubless.corrections.queries import QueryRequest
from hubless.corrections.spec import METHODS
from hubless.engine import StatisticsRequest
from hubless.errors import InvalidInput

__all__ = ["ActivationGated", "BETA_RANGE", "InvertedSoftmax", "DynamicInvertedSoftmax", "LOG_BETAS", "check_beta", "log_mean_exp_bias"]

#: Inverse temperatures tried by tuning: a log grid around the paper's default 20.
LOG_BETAS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


@METHODS.register
class InvertedSoftmax(AdditiveCorrection):
    """QB-Norm inverted softmax (IS), Bogolin et al. 2022, eq. 1.

        score(q, r) = exp(beta s(q, r)) / sum_b exp(beta s(b, r))     (b over the query bank)

    log score = beta * (s(q, r) - bias(r)) - log n with the centred bias

        bias(r) = (1/beta) log( (1/n) sum_b exp(beta s(b, r)) )        (n: query-bank size)

    a log-mean-exp: it differs from the log-sum-exp form by log(n)/beta, the same for every r,
    so the ranking is IS's, while the bias stays of the size of a similarity for every beta
    (the log-sum-exp form is ~log(n)/beta, 10^5 at beta = 1e-4, where float32 keeps no digits of
    the part that ranks). IS ranks as s - bias (weight 1); its score is the probability above.
    beta is limited to [1e-6, 1e6], where this stays exact in float32 ranking (beyond, IS is
    plain top-1 matching or plain mean-similarity correction). The paper's default is beta = 20.
    ``gallery_bank`` is ignored.
    """

    name = "is"
    order = 40
    query_state_attrs = ("log_bank_size_",)
    summary = "QB-Norm inverted softmax (Bogolin et al. 2022): exp(beta s) / sum over the query bank"
    default_grid = {"beta": LOG_BETAS}

    def __init__(self, beta: float = 20.0, *, normalize: bool = True) -> None:
        self.beta = beta
        super().__init__(normalize=normalize)

    def _validate_params(self) -> None:
        super()._validate_params()
        check_beta(self.beta, "beta")

    def statistics_request(self) -> StatisticsRequest:
        return StatisticsRequest(query_betas=frozenset({float(self.beta)}))

    def _bias_columns(self, statistics) -> np.ndarray:
        self.log_normalizer_ = statistics.query_lse[float(self.beta)]
        self.log_bank_size_ = np.log(statistics.n_query_bank)
        return log_mean_exp_bias(self.log_normalizer_, statistics.n_query_bank, self.beta)

    def method_scores(self, batch, ranking):
        with np.errstate(over="ignore"):  # a probability beyond float32 shows as inf; ranking uses log scores
            return np.exp(self.beta * ranking.astype(np.float64) - self.log_bank_size_).astype(np.float32)


#: The inverse temperatures the inverted-softmax methods accept (see InvertedSoftmax).
BETA_RANGE = (1e-6, 1e6)


def check_beta(value, name: str, *, allow_zero: bool = False) -> float:
    """An inverse temperature within :data:`BETA_RANGE` (or 0 where a factor can be switched off)."""
    beta = check_nonnegative_float(value, name, positive=not allow_zero)
    low, high = BETA_RANGE
    if beta != 0 and not low <= beta <= high:
        raise InvalidInput(
            f"{name} must be between {low:g} and {high:g}; got {beta:g} (beyond that range the inverted softmax "
            "cannot be ranked reliably in float32: it is then plain top-1 matching or a plain mean-similarity correction)"
        )
    return beta


def log_mean_exp_bias(lse: np.ndarray, n: int | np.ndarray, beta: float) -> np.ndarray:
    """(1/beta) log((1/n) sum exp(beta s)) from the log-sum-exp ``lse``, in float64."""
    return (np.asarray(lse, dtype=np.float64) - np.log(n)) / float(beta)


class ActivationGated(Correction):
    """Mixin of the dynamic variants (DIS, DualDIS): a factor applies to a query only when its
    raw top-1 gallery item is in an activation set, the union over a bank's items of their
    ``k_activation`` nearest gallery items (QB-Norm, Bogolin et al. 2022, section 3.4)."""

    k_activation: int

    def _validate_params(self) -> None:
        super()._validate_params()
        check_positive_int(self.k_activation, "k_activation")

    @property
    def query_request(self) -> QueryRequest:
        return QueryRequest(top1=True)

    def check_sizes(self, n_gallery, n_query_bank, n_gallery_bank) -> None:
        check_k(self.k_activation, n_gallery, "k_activation", "the gallery")

    def gate_masks(self) -> np.ndarray:
        """The fitted activation sets as a bool (n_gallery, n_sets) table: a query's gates (its
        weights, :meth:`weights`) are the row of its raw top-1 gallery item."""
        raise NotImplementedError  # pragma: no cover - each variant names its sets

    def weights(self, batch) -> np.ndarray:
        """Per query, whether its raw top-1 is in each activation set (:meth:`gate_masks`):
        (n_queries, n_sets) float32, 1 open, 0 closed."""
        stats = self.query_statistics(batch)
        assert stats is not None and stats.top1 is not None  # query_request asks for the top-1
        return self.gate_masks()[stats.top1].astype(np.float32)


@METHODS.register
class DynamicInvertedSoftmax(ActivationGated, InvertedSoftmax):
    """QB-Norm dynamic inverted softmax (DIS), Bogolin et al. 2022, eq. 2.

    The activation set A is the union, over query-bank items b, of the ``k_activation`` gallery
    items nearest to b (the likely hubs). A query gets the inverted softmax only when its raw
    top-1 gallery item is in A, and the raw similarity otherwise:

        score(q, r) = IS(q, r)  if argmax_r' s(q, r') in A,  else  s(q, r)

    In bias form the weight is the gate: 1 or 0 per query, from the query's raw top-1 (see
    :attr:`query_request`). ``gallery_bank`` is ignored.
    """

    name = "dis"
    order = 50
    summary = "QB-Norm dynamic inverted softmax: IS only for queries whose raw top-1 is a likely hub"
    default_grid = {"beta": LOG_BETAS, "k_activation": (1, 5)}

    def __init__(self, beta: float = 20.0, k_activation: int = 1, *, normalize: bool = True) -> None:
        self.k_activation = k_activation
        super().__init__(beta=beta, normalize=normalize)

    def statistics_request(self) -> StatisticsRequest:
        return super().statistics_request().merge(StatisticsRequest(query_activation_k=self.k_activation))

    def _fit_gates(self, statistics) -> None:
        self.activation_mask_ = statistics.activation_mask("query", self.k_activation)

    def gate_masks(self) -> np.ndarray:
        return self.activation_mask_[:, None]

    def method_scores(self, batch, ranking):
        gated = self.weights(batch) > 0
        return np.where(gated, super().method_scores(batch, ranking), ranking)
