"""The uncorrected baseline: rank by s(q, r) alone."""

from __future__ import annotations

import numpy as np

from hubless.corrections.additive import AdditiveCorrection
from hubless.corrections.spec import METHODS

__all__ = ["Baseline"]


@METHODS.register
class Baseline(AdditiveCorrection):
    """No correction: score(q, r) = s(q, r) (bias 0, weight 0). Needs no bank; banks are ignored."""

    name = "baseline"
    order = 0
    summary = "no correction: rank by s(q, r)"
    needs_query_bank = False

    def __init__(self, *, normalize: bool = True) -> None:
        super().__init__(normalize=normalize)

    def weight(self) -> float:
        return 0.0

    def _bias_columns(self, statistics) -> np.ndarray:
        return np.zeros(self.n_gallery_, dtype=np.float32)
