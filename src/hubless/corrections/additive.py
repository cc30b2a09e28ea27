"""Additive corrections: the base class of every method that ranks by ``s(q, r) - W(q) . bias(r)``
(all but GC), and :class:`QuerySide`, the query half of such a method for a gallery served
elsewhere (a vector store, augmented parts).

Ranking is the inner product of the augmented vectors ``[q, -W(q)] . [r, bias(r)]``, so any
inner-product index can serve these corrections; each bias is row-local, so rows can be
computed part by part (:meth:`AdditiveCorrection.row_bias`).
"""

from __future__ import annotations

import copy
from typing import ClassVar

import numpy as np

from hubless._validation import as_embeddings
from hubless.corrections.base import Correction
from hubless.corrections.queries import QueryBatch, QueryStatistics
from hubless.engine import BankStatistics
from hubless.errors import InvalidInput

__all__ = ["AdditiveCorrection", "QuerySide"]


class AdditiveCorrection(Correction):
    """A correction that ranks by ``s(q, r) - sum_c W_c(q) * bias_c(r)``.

    Fitted attributes: ``bias_columns_`` (n_gallery, n_columns) float32, one column per gated
    factor (one for all methods but DualDIS); ``bias_`` (n_gallery,) is their sum, the bias
    applied when every gate is open. :meth:`weights` gives the per-query W, so an index over
    ``[r, bias_columns_(r)]`` queried with ``[q, -W(q)]`` ranks exactly as :meth:`rank`.
    """

    additive = True

    @property
    def exactly_additive(self) -> bool:
        """Whether :meth:`rank` is exactly ``s - W . bias_columns_`` for every query. False for a
        correction whose score only partly has bias form (published DualDIS): an index then
        re-scores its candidates exactly with :meth:`rank`."""
        return True

    def bias(self) -> np.ndarray:
        """The bias columns ``bias_columns_`` of the fitted gallery, (n_gallery, n_columns)
        float32, read only (see :meth:`Correction.bias <hubless.corrections.base.Correction.bias>`)."""
        self._check_fitted()
        view = self.bias_columns_.view()
        view.flags.writeable = False
        return view

    @property
    def bias_(self) -> np.ndarray:
        self._check_fitted()
        cols = self.bias_columns_
        return cols[:, 0] if cols.shape[1] == 1 else cols.sum(axis=1, dtype=np.float32)

    def weight(self) -> float:
        """The weight w applied to the bias when no override is given (hook)."""
        return 1.0

    def weights(self, batch: QueryBatch) -> np.ndarray:
        """W (n_queries, n_columns) float32, so that ranking = s - W . bias_columns_; gated
        methods read the batch's raw top-1 (computed by exact search when it is missing)."""
        w = self.weight() if batch.weight is None else batch.weight
        w = np.asarray(w, dtype=np.float32).reshape(-1, 1)
        return np.broadcast_to(w, (len(batch), self.bias_columns_.shape[1]))

    def weights_from_neighbours(self, batch: QueryBatch, neighbours: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        """W of ``batch`` (float32, contiguous) with its queries' raw-neighbour statistics taken
        from ``neighbours``, the (scores, ids) of their raw top-depth over the gallery (a block
        the caller already ranks: no search of its own; None when the correction needs none).
        The batch keeps the statistics."""
        if neighbours is not None:
            batch.statistics = QueryStatistics.from_neighbours(self.query_request, *neighbours)
        return np.ascontiguousarray(self.weights(batch), dtype=np.float32)

    def additive_ranking(self, batch: QueryBatch) -> tuple[np.ndarray, np.ndarray] | None:
        if not self.exactly_additive:
            return None
        return np.ascontiguousarray(self.weights(batch), dtype=np.float32), self.bias_columns_

    def query_weights(self, queries, *, statistics: QueryStatistics | None = None, **weight) -> np.ndarray:
        """W for ``queries`` (see :meth:`weights`): the extra query coordinates ``-W`` to serve
        this correction from any inner-product index holding ``[r, bias_columns_(r)]``."""
        return np.ascontiguousarray(self.weights(self.queries(queries, statistics=statistics, **weight)))

    def _rank(self, batch, sims, columns, out):
        w = self.weights(batch)
        if not w.any():
            if out is None or out is sims:
                return sims
            out[...] = sims
            return out
        if isinstance(columns, np.ndarray):
            shift = np.einsum("qc,qkc->qk", w, self.bias_columns_[columns])
        else:
            bias = self.bias_columns_ if columns is None else self.bias_columns_[columns]
            if bias.shape[1] == 1:  # one bias column: w_q * b_r by broadcasting (the same products as w @ bias.T)
                values = np.unique(w[:, 0])
                if values.size == 1:  # one weight for every query: subtract one row, no (n, m) temporary
                    return np.subtract(sims, values[0] * bias[:, 0], out=out)
                if values.size == 2 and values[0] == 0:  # gated (DIS): subtract where the gate is open
                    out = np.array(sims, copy=True) if out is None else out
                    if out is not sims:
                        out[...] = sims
                    return np.subtract(out, values[1] * bias[:, 0], out=out, where=w[:, :1] != 0)
                shift = w[:, :1] * bias[:, 0]
            else:
                shift = w @ bias.T
        return np.subtract(sims, shift, out=out)

    #: Fitted attributes, besides the gallery and its biases, that W(q) and the method's scores
    #: read: what a vector store keeps to answer queries as the index does (see :meth:`query_state`).
    query_state_attrs: ClassVar[tuple[str, ...]] = ()

    def query_state(self) -> dict[str, list]:
        """The fitted values W(q) and :meth:`method_scores` need beyond the bias columns, as JSON
        lists (a vector store keeps them with the exported [r, bias(r)] rows)."""
        self._check_fitted()
        return {name: np.asarray(getattr(self, name), dtype=np.float64).tolist() for name in self.query_state_attrs}

    def for_queries(self, state: dict, dim: int, n_columns: int) -> QuerySide:
        """The query side of this method (W(q), method scores) set up from a stored
        :meth:`query_state`, for a gallery served elsewhere (a vector store, augmented parts):
        a :class:`QuerySide`, not a fitted correction (it holds no gallery and cannot search;
        this correction stays unfitted)."""
        self._validate_params()
        missing = set(self.query_state_attrs) - set(state)
        if missing:
            raise InvalidInput(f"{self.spec}: the stored query state lacks {', '.join(sorted(missing))}; export the index again")
        for name in self.query_state_attrs:
            setattr(self, name, np.asarray(state[name], dtype=np.float64))
        self.dim_ = dim
        self.bias_columns_ = np.zeros((0, n_columns), np.float32)  # only its width is read
        return QuerySide(self)

    def _fit_statistics(self, statistics: BankStatistics) -> None:
        self._fit_gates(statistics)
        columns = self._checked_columns(self._bias_columns(statistics), self.n_gallery_)
        # exact copies get their first copy's bias, whatever a product of the rows (DN's mu_B . r) rounded
        self.bias_columns_ = self.gallery_duplicates_.spread(columns)

    def _checked_columns(self, cols, n_rows: int) -> np.ndarray:
        cols = np.asarray(cols, dtype=np.float32)
        if not np.isfinite(cols).all():  # never serve (or index with) a NaN/inf bias
            bad = int((~np.isfinite(cols)).reshape(n_rows, -1).any(axis=1).sum())
            raise InvalidInput(f"{self.spec}: {bad} gallery item(s) got a non-finite bias; the parameters or inputs are out of range")
        # this correction's own read-only array: a device keeps its copy between searches
        # (hubless.engine.torch_arrays.put), and nothing can change it behind that copy
        own = np.array(cols.reshape(n_rows, -1), dtype=np.float32, order="C")
        own.flags.writeable = False
        return own

    def _bias_columns(self, statistics: BankStatistics) -> np.ndarray:  # pragma: no cover - hook
        """Hook: the bias column(s) of the gallery from the bank statistics. Row-local: each
        row's bias reads only that row's statistics (and the gallery row itself) and the banks'
        global values (sizes, means), so rows can be computed part by part (:meth:`row_bias`)."""
        raise NotImplementedError

    def _fit_gates(self, statistics: BankStatistics) -> None:
        """Hook: per-item gates read from the activation sets (DIS, DualDIS); none by default."""

    def row_bias(self, rows: np.ndarray, statistics: BankStatistics) -> np.ndarray:
        """The bias columns (n_rows, n_columns) float32 of gallery ``rows`` (validated float32)
        from their own bank statistics: the per-row arrays of these rows with the banks' global
        values (sizes, means), as :func:`hubless.engine.updates.gallery_rows` or
        :func:`hubless.engine.compute_statistics` on the rows give them. Every bias is row-local
        (see :meth:`_bias_columns`), so this equals those rows of a fit over any gallery holding
        them; this correction is not changed. A live index computes new items' biases this way."""
        part = copy.copy(self)
        part.gallery_ = rows
        part.n_gallery_, part.dim_ = rows.shape
        return part._checked_columns(part._bias_columns(statistics), rows.shape[0])

    def for_rows(self, bias_columns: np.ndarray, statistics: BankStatistics) -> AdditiveCorrection:
        """Set this (unfitted) correction up to rank ``len(bias_columns)`` gallery rows whose
        bias columns were computed elsewhere, part by part (:meth:`row_bias`): the query state
        (bank sizes and means) and the gates (activation sets over these rows) are read from
        ``statistics``, whose per-row arrays may be empty. The rows themselves are not kept
        (``gallery_`` is empty): the caller passes similarities to :meth:`rank` and fills each
        batch's raw-neighbour statistics itself. Returns ``self``."""
        self._validate_params()
        dim = int(np.shape(statistics.query_bank_mean)[0])
        self.gallery_ = np.zeros((0, dim), np.float32)
        self.n_gallery_, self.dim_ = 0, dim
        self._bias_columns(statistics)  # sets the query state; its output (for no rows) is not used
        self.n_gallery_ = int(bias_columns.shape[0])
        self._fit_gates(statistics)
        self.bias_columns_ = bias_columns
        return self


class QuerySide:
    """The query side of an additive correction whose gallery ``[r, bias(r)]`` is served
    elsewhere (a vector store, parts written on Ray): this call's batch (:meth:`queries`), W(q)
    (:meth:`weights`, :meth:`query_weights`) and the method's scores (:meth:`method_scores`),
    from the fitted values a store keeps. Made by :meth:`AdditiveCorrection.for_queries`. It is
    not a correction: it has no gallery, cannot search and is not "fitted"."""

    def __init__(self, correction: AdditiveCorrection) -> None:
        self._correction = correction

    spec = property(lambda self: self._correction.spec)
    weight_param = property(lambda self: self._correction.weight_param)
    dim_ = property(lambda self: self._correction.dim_)
    normalize = property(lambda self: self._correction.normalize)
    exactly_additive = property(lambda self: self._correction.exactly_additive)
    query_request = property(lambda self: self._correction.query_request)

    def queries(self, queries, **weight) -> QueryBatch:
        """Validated queries and this call's weight (``weight=`` or the method's own name)."""
        corr = self._correction
        q = as_embeddings(queries, "queries", normalize=corr.normalize, dim=corr.dim_)
        return QueryBatch(q, corr._weight_override(weight, q.shape[0]))

    def weights(self, batch: QueryBatch) -> np.ndarray:
        return self._correction.weights(batch)

    def query_weights(self, queries, **weight) -> np.ndarray:
        return np.ascontiguousarray(self.weights(self.queries(queries, **weight)))

    def method_scores(self, batch: QueryBatch, ranking: np.ndarray) -> np.ndarray:
        return self._correction.method_scores(batch, ranking)

    def __repr__(self) -> str:
        return f"QuerySide({self.spec!r}, dim={self.dim_})"
