"""The bias term ``W(q) . bias_columns(r)`` of an additive ranking on a torch device, rounded as
the numpy ranking rounds it (each product ``w_q * b_r`` once, in float32), so the device ranks
bitwise as numpy does. Used by the ranking pass (:mod:`hubless.engine.torch_ranking`) and the
device's search (:mod:`hubless.engine.torch_passes`)."""

from __future__ import annotations

import numpy as np

from hubless.engine.torch_arrays import torch_module

__all__ = ["one_row", "products"]


def one_row(weights: np.ndarray, w, bias):
    """``w_0 * bias_r`` (a device row) when every query has the one weight ``w_0`` and there is
    one bias column (NNN, CSLS, DN, IS, DualIS without per-query weights), else None: the
    ranking then subtracts one row from each block, the products rounded as in the per-query
    form (each ``w_0 * b_r`` once, in float32), so the scores are bitwise the same."""
    if weights.shape[1] != 1 or not np.all(weights == weights[0, 0]):
        return None
    return bias[:, 0] * w[0, 0]


def products(w, bias, out=None):
    """``W(q) . bias_columns(r)`` (into ``out`` when given, no fresh block): each product
    ``w_q * b_r`` rounded before a ranking subtracts it from the similarities, as the numpy
    ranking does (bitwise the same scores). The ranking pass and the device's search (per-query
    weights) form it here."""
    torch = torch_module()
    if bias.shape[1] == 1:
        return torch.mul(w[:, :1], bias[:, 0], out=out)
    return torch.matmul(w, bias.T, out=out)
