"""The reducers' formulas, written once against a tiny array namespace (numpy or torch).

The numpy engine (:mod:`hubless.engine.stream`) and the device-resident torch engine
(:mod:`hubless.engine.torch_reducers`) reduce similarity blocks with the same formulas: this
module holds them, and each engine passes its namespace (:data:`NUMPY`, or the torch one built
by :func:`hubless.engine.torch_arrays.torch_namespace`). The numpy namespace is plain numpy
(this module never imports torch).

Log-sum-exp (IS, DIS, DualIS, DualDIS; Bogolin et al. 2022, QB-Norm, eq. 2): for each row and
beta, ``log sum_j exp(beta * s_j)``, streamed around a shift m (a running row maximum of s):

* the terms per beta (:func:`lse_terms`): beta >= :data:`EXP_MIN_BETA` sums
  ``exp(beta (s - m))`` (as ``exp2(beta log2(e) (s - m))`` where that is the faster kernel),
  each term in float32 and each block row's sum accumulated in float64 (the "exp form");
  a smaller beta sums ``expm1(beta (s - m))`` in float64 (the "expm1 form": its digits survive a
  tiny beta). ``s - m`` is formed before scaling by beta (a large beta does not magnify the
  rounding of ``beta * s``); exponents are clamped at :data:`LOWEST_EXPONENT` (or its base-2
  twin) for beta > :data:`CLAMP_FROM_BETA` (they would only add slow subnormal terms);
* :func:`lse_add`: one block's sums around the shift;
* :func:`lse_recentre`: the sums so far moved onto a larger shift;
* :func:`lse_finish`: ``beta m + log S`` (exp form) or ``beta m + log(c + D)`` (expm1 form,
  c the number of columns); beta = 0 gives ``log c``.
"""

from __future__ import annotations

import types
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "CLAMP_FROM_BETA",
    "EXP_MIN_BETA",
    "LOWEST_EXPONENT",
    "LOWEST_EXPONENT_2",
    "NUMPY",
    "LseTerm",
    "lse_add",
    "lse_finish",
    "lse_recentre",
    "lse_terms",
]

#: Below this inverse temperature the log-sum-exp sums expm1; from it on, exp (as exp2 where that
#: is vectorised). Measured (``tests/engine/test_one_pass.py``): the exp form's bias error, about
#: 1e-7 / beta, is then below the float32 rounding of the similarities themselves.
EXP_MIN_BETA = 2.0
#: Exponents are clamped at these values: exp / exp2 / expm1 take a slow path (about 30 ns an element,
#: 80 times a normal one) below float32's smallest normal (2^-126, e^-87.3), and a term of 2^-115
#: (or e^-80) next to the largest (1) changes no digit of the sum.
LOWEST_EXPONENT_2 = -115.0
LOWEST_EXPONENT = -80.0
#: Betas above this get the clamp (one more pass): with unit vectors s - m >= -2, so
#: smaller betas never reach it (with raw vectors they may: slower then, never less exact).
CLAMP_FROM_BETA = -LOWEST_EXPONENT / 2
_LOG2_E = 1.0 / np.log(2.0)


class LseTerm(NamedTuple):
    """How one nonzero beta is summed (see the module docstring)."""

    column: int  # its column in the outputs
    beta: float
    exp_form: bool  # exp (or exp2) terms; False: expm1 terms
    base2: bool  # exp2(beta log2(e) (s - m)) instead of exp(beta (s - m))
    factor: float  # what s - m is multiplied by (float32 in the products)
    clamp: float | None  # the lowest exponent kept, or None (no clamp needed)


def lse_terms(betas: list[float], base2: bool, exp_min_beta: float = EXP_MIN_BETA) -> list[LseTerm]:
    """The terms of the nonzero ``betas`` (beta = 0 needs no sum: log of the count);
    ``exp_min_beta``: where the exp form starts (a test may move it)."""
    terms = []
    for t, beta in enumerate(betas):
        if beta != 0.0:
            exp_form = beta >= exp_min_beta
            in_base2 = exp_form and base2
            factor = float(np.float32(beta * _LOG2_E if in_base2 else beta))
            clamp = (LOWEST_EXPONENT_2 if in_base2 else LOWEST_EXPONENT) if beta > CLAMP_FROM_BETA else None
            terms.append(LseTerm(t, beta, exp_form, in_base2, factor, clamp))
    return terms


def lse_add(xp: Any, diff, term: LseTerm, x):
    """Each row's sum of ``term``'s terms over a block, given ``diff`` = s - m (float32) and a
    float32 scratch ``x`` of the same shape: float32 sums (exp form) or float64 (expm1 form)."""
    xp.multiply(diff, term.factor, out=x)
    if term.clamp is not None:
        xp.maximum(x, term.clamp, out=x)
    (xp.exp2 if term.base2 else xp.exp)(x, out=x) if term.exp_form else xp.expm1(x, out=x)
    return xp.row_sum(x) if term.exp_form else xp.row_sum64(x)


def lse_recentre(xp: Any, sums, added, term: LseTerm, old, new, count: int):
    """The sums so far (around the shift ``old``, over ``count`` columns) moved onto the shift
    ``new`` >= ``old``, plus ``added`` (a block's sums around ``new``); float64 rows."""
    shift = (old - new) * term.beta  # <= 0
    if term.exp_form:
        return sums * xp.exp(shift) + added
    if not count:
        return sums + added
    return count * xp.expm1(shift) + sums * xp.exp(shift) + added


def lse_finish(xp: Any, term: LseTerm | None, peak, sums, count: int):
    """The log-sum-exp of each row from its shift ``peak`` and its sums (float64); ``term``
    None: beta = 0 (the log of the count, a float)."""
    if term is None:
        return float(np.log(count))
    if term.exp_form:
        return term.beta * peak + xp.log(sums)
    return term.beta * peak + xp.log(count + sums)


def _row_sum(x):
    return x.sum(axis=1)


def _row_sum64(x):
    return x.sum(axis=1, dtype=np.float64)


#: The numpy namespace of the formulas.
NUMPY = types.SimpleNamespace(
    multiply=np.multiply,
    maximum=np.maximum,
    exp=np.exp,
    exp2=np.exp2,
    expm1=np.expm1,
    log=np.log,
    row_sum=_row_sum,
    row_sum64=_row_sum64,
)
