"""The shared interface of every correction, in the scikit-learn style.

A correction is fitted on reference banks (never on test queries) and then scores or searches
queries against the gallery it was fitted with. Its public face is five methods:

    corr = hubless.NNN(alpha=0.75, k=16).fit(gallery, query_bank)    # fit
    hits = corr.search(queries, top_k=10)                 # a hubless.Hits: scores, ids = hits
    hits = corr.search(queries, top_k=10, weight=0.5)     # another weight, no refit
    scores = corr.score(queries)                          # (n_queries, n_gallery), dense
    columns = corr.bias()                                 # bias(r): serve [r, bias(r)] anywhere
    corr.save("nnn.npz"); hubless.load_correction("nnn.npz")

(with scikit-learn's ``get_params`` / ``set_params`` and :attr:`Correction.spec`). What changes
a fitted correction in place is a function of its own module: items and banks added or removed
in :mod:`hubless.corrections.incremental`, fitting on score matrices in
:mod:`hubless.corrections.score_fit`.

Everything that ranks goes through one hook, :meth:`Correction.rank`: the *ranking scores* of
a batch of queries over some gallery items, from their raw similarities. For additive
corrections (all but GC) that is ``s(q, r) - sum_c W_c(q) * bias_c(r)``, the inner product of
the augmented vectors ``[q, -W(q)] . [r, bias(r)]``, so any inner-product index can serve it.
:meth:`Correction.method_scores` maps ranking scores to each method's own scores (e.g. the
inverted-softmax probability) by a map that is increasing for every query, so it never changes
an order. ``score``, ``search``, the evaluation, tuning, the fairness audit and
:class:`hubless.Index` are all built on these two methods (the hook, with ``queries``,
``statistics_request`` and the other hooks "Add a correction" in CONTRIBUTING.md lists, is
public to whoever writes or serves a correction).

This module holds the base class :class:`Correction` (parameters, fitting, ranking, search,
saving); additive corrections are in :mod:`hubless.corrections.additive`, the checks of what
``fit`` is given in :mod:`hubless.corrections.fit_inputs`, reading a saved correction in
:mod:`hubless.corrections.saved`.
"""

from __future__ import annotations

import inspect
import json
import numbers
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np

from hubless._deprecation import warn_deprecated
from hubless._validation import as_embeddings, check_nonnegative_float, check_top_k, pad_top_k
from hubless.corrections.fit_inputs import check_statistics, validate_fit_inputs
from hubless.corrections.queries import QueryBatch, QueryRequest, QueryStatistics
from hubless.engine import BankStatistics, Dense, StatisticsRequest, compute_statistics, exact_search, stream_reduce, use_device
from hubless.engine.device import DeviceName, checked_on_device, torch_device
from hubless.engine.duplicates import Duplicates, find_duplicates
from hubless.engine.statistics import tie_copies
from hubless.errors import AlreadyExists, InvalidInput, InvalidType, NotFitted
from hubless.hits import Hits

#: class -> its constructor's parameter names (:meth:`Correction.param_names`)
_PARAM_NAMES: dict[type, tuple[str, ...]] = {}
_C = TypeVar("_C", bound="Correction")

__all__ = ["Correction", "SAVED_FORMAT_VERSION", "SCORE_BLOCK_ELEMENTS", "is_own_copy"]

#: The format of the file :meth:`Correction.save` writes: an ``.npz`` with the JSON head
#: (:data:`SAVED_HEAD`: format version, generator, spec), ``gallery`` and the kept bank statistics
#: (``statistics/<name>``, :meth:`~hubless.engine.BankStatistics.to_arrays`).
SAVED_FORMAT_VERSION = 1
SAVED_HEAD = "hubless"
STATISTICS_PREFIX = "statistics/"

#: The most scores one block of :meth:`Correction.score` computes at once (bounds the
#: temporaries, not the output).
SCORE_BLOCK_ELEMENTS = 2**24


def is_own_copy(checked: np.ndarray, given) -> bool:
    """Whether ``checked`` (what the input checks made of the argument ``given``) is hubless's
    own array: a conversion or copy, never the caller's array or a view of its memory."""
    return not (isinstance(given, np.ndarray) and np.may_share_memory(checked, given))


class Correction:
    """Base class. Subclasses set the class attributes below and implement the hooks.

    Parameters common to all corrections:

    normalize : bool, default True
        L2-normalise gallery, banks and queries, so that s(q, r) is the cosine similarity the
        papers use. With False, embeddings are used as given (a warning is emitted once per
        argument when they are not unit-length).
    """

    #: Registry name used in method specs such as ``"nnn:alpha=0.5,k=16"``.
    name: ClassVar[str] = ""
    #: Position in listings (``hubless methods``, the demo): lower first.
    order: ClassVar[int] = 100
    #: One line for help texts: what the method is and where it comes from.
    summary: ClassVar[str] = ""
    #: The papers' hyper-parameter grid, used by :func:`hubless.tune` (empty: nothing to tune).
    default_grid: ClassVar[dict[str, tuple]] = {}
    #: Constructor parameter that is the weight w and may be overridden per call.
    weight_param: ClassVar[str | None] = None
    #: Whether ranking is ``s - W . bias`` (servable from an inner-product index).
    additive: ClassVar[bool] = False
    #: Whether ``fit`` needs a query bank (only the baseline does not).
    needs_query_bank: ClassVar[bool] = True
    #: How ``gallery_bank`` is used by ``fit``: "required", "optional" or "ignored".
    gallery_bank_use: ClassVar[str] = "ignored"
    #: Parameters that bound resources rather than change results; left out of ``spec`` at default.
    resource_params: ClassVar[tuple[str, ...]] = ()
    #: Why this correction cannot be fitted on score matrices (``score_fit.fit_scores``), naming the
    #: input it needs instead; None when score matrices suffice.
    needs_embeddings: ClassVar[str | None] = None

    def __init__(self, *, normalize: bool = True) -> None:
        self.normalize = normalize
        self._validate_params()

    # ------------------------------------------------------------------ parameters
    @classmethod
    def param_names(cls) -> list[str]:
        """Constructor parameters, in signature order (read once per class: ``inspect.signature``
        cost more than the rest of a live index's 1-row write's bookkeeping, and ``set_params``
        asks on every call)."""
        names = _PARAM_NAMES.get(cls)
        if names is None:
            sig = inspect.signature(cls.__init__)
            names = _PARAM_NAMES[cls] = tuple(p for p in sig.parameters if p != "self")
        return list(names)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """Constructor parameters and their values (scikit-learn's estimator API; ``deep`` is
        accepted for compatibility: no parameter is itself an estimator)."""
        return {name: getattr(self, name) for name in self.param_names()}

    def set_params(self: _C, **params: Any) -> _C:
        """Change parameters (validated); a fitted correction must be refitted unless only the
        search-time weight changed."""
        allowed = self.param_names()
        for key in params:
            if key not in allowed:
                raise InvalidInput(f"{type(self).__name__} has no parameter {key!r}; valid: {', '.join(allowed)}")
        old = self.get_params()
        for key, value in params.items():
            setattr(self, key, value)
        try:
            self._validate_params()
        except Exception:
            for key, value in old.items():
                setattr(self, key, value)
            raise
        return self

    def _validate_params(self) -> None:
        """Hook: check every parameter (subclasses call ``super()._validate_params()``)."""
        if not isinstance(self.normalize, (bool, np.bool_)):
            raise InvalidType(f"normalize must be True or False; got {self.normalize!r}")
        if self.weight_param is not None:
            self.check_weight(getattr(self, self.weight_param))

    @classmethod
    def check_weight(cls, value, name: str | None = None) -> np.ndarray:
        """The one rule for the weight w, in the constructor and per call: finite and >= 0
        (w = 0 is the baseline; a negative weight would reward hubs). Returns float64.
        ``name``: the argument named in an error (default: the method's parameter)."""
        name = name or cls.weight_param or "weight"
        array = np.asarray(value)
        if array.dtype.kind not in "iuf" or array.dtype == np.bool_:
            raise InvalidType(f"{name} must be a real number (or one per query); got {value!r}")
        array = array.astype(np.float64)
        if array.ndim == 0:
            check_nonnegative_float(float(array), name)
        elif not (np.isfinite(array).all() and (array >= 0).all()):
            raise InvalidInput(f"{name} must be finite and >= 0 for every query")
        return array

    @property
    def spec(self) -> str:
        """The method spec that rebuilds this correction, e.g. ``"nnn:alpha=0.75,k=16"``."""
        defaults = {name: p.default for name, p in inspect.signature(type(self).__init__).parameters.items()}
        hidden = ("normalize", *self.resource_params)
        params = {k: v for k, v in self.get_params().items() if not (k in hidden and v == defaults[k])}
        body = ",".join(f"{k}={_format_value(v, defaults[k])}" for k, v in params.items())
        return f"{self.name}:{body}" if body else self.name

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # ------------------------------------------------------------------ fitting
    def statistics_request(self) -> StatisticsRequest:
        """What this correction needs from the banks (hook)."""
        return StatisticsRequest()

    def check_sizes(self, n_gallery: int, n_query_bank: int | None, n_gallery_bank: int | None) -> None:
        """Refuse parameters that exceed the bank or gallery sizes (hook; ValueError)."""

    def fit(
        self: _C,
        gallery,
        query_bank=None,
        gallery_bank=None,
        *,
        statistics: BankStatistics | None = None,
        progress: bool | None = None,
        device: DeviceName = None,
    ) -> _C:
        """Fit on the gallery and reference banks; returns ``self``.

        gallery : (n_gallery, d) the items to be retrieved.
        query_bank : (n_bank, d) reference queries (same modality as future queries), disjoint
            from the test queries. Not needed by :class:`Baseline`.
        gallery_bank : (n_gallery_bank, d) reference items of the gallery's modality. Required
            by DualIS/DualDIS, used by DN for its gallery mean, ignored by the others.
        statistics : precomputed :class:`~hubless.engine.BankStatistics` of these same arrays
            (see :func:`hubless.fit_many`), to skip the streamed pass. Given without any bank,
            the correction is fitted from the statistics alone (no bank is read), e.g. the ones a
            saved index keeps or merged from distributed tiles.
        progress : show a progress bar (None: only on a terminal for long runs).
        device : where the similarity blocks run: "cuda", "cpu" (torch), "numpy" (default:
            ``HUBLESS_DEVICE`` or numpy; see :mod:`hubless.engine.device`).

        Score matrices instead of embeddings: :func:`hubless.corrections.score_fit.fit_scores`;
        items and banks added or removed later: :mod:`hubless.corrections.incremental`.
        """
        self._validate_params()
        if statistics is not None and query_bank is None and gallery_bank is None:
            return self._fit_from_statistics(gallery, statistics)
        given = gallery
        with use_device(device), checked_on_device(when=statistics is None):  # on a device: input checks there too
            gallery, query_bank, gallery_bank = validate_fit_inputs([self], gallery, query_bank, gallery_bank)
            request = self.statistics_request()
            duplicates = find_duplicates(gallery)
            if statistics is None:
                statistics = compute_statistics(
                    gallery, query_bank, gallery_bank, request, progress=progress, gallery_duplicates=duplicates
                )
            else:
                check_statistics(statistics, gallery, query_bank, gallery_bank, request)
        self._fit_arrays(gallery, statistics, duplicates, own=is_own_copy(gallery, given))
        return self

    def _fit_from_statistics(self: _C, gallery, statistics: BankStatistics) -> _C:
        """Fit from the bank statistics of ``gallery`` alone (no bank is read)."""
        given = gallery
        gallery = as_embeddings(gallery, "gallery", normalize=self.normalize)
        if statistics.n_gallery != gallery.shape[0]:
            raise InvalidInput(f"statistics describe {statistics.n_gallery} gallery items; the gallery has {gallery.shape[0]}")
        self.check_sizes(gallery.shape[0], statistics.n_query_bank if self.needs_query_bank else None, statistics.n_gallery_bank)
        missing = statistics.missing(self.statistics_request())
        if missing:
            raise InvalidInput("statistics lack " + "; ".join(missing))
        self._fit_arrays(gallery, statistics, own=is_own_copy(gallery, given))
        return self

    def _check_embeddings_fit(self) -> None:
        if self.is_fitted and self.dim_ == 0:  # fitted on score matrices (corrections.score_fit)
            raise InvalidInput(
                f"{type(self).__name__} was fitted on score matrices: it corrects rows of query x gallery scores "
                "(hubless.corrections.score_fit.correct_rows, hubless.correct_scores), not embeddings; fit it on embeddings "
                "to search or update it"
            )

    def _fit_arrays(
        self, gallery: np.ndarray, statistics: BankStatistics, duplicates: Duplicates | None = None, *, own: bool = False
    ) -> None:
        """Fit from ``statistics`` of ``gallery``; ``duplicates``: its exact duplicate rows when
        known (found here otherwise). Every copy gets its first copy's statistics
        (:func:`~hubless.engine.statistics.tie_copies`), so copies get identical biases. ``own``:
        the gallery is this correction's own array (a copy the input checks made, the grown or
        shrunk gallery of an update), made read-only, so a device keeps its copy between searches
        (:func:`hubless.engine.torch_arrays.put`). The caller's own array is never changed."""
        if own and gallery.flags.writeable:
            gallery.flags.writeable = False
        self.gallery_ = gallery
        self.n_gallery_, self.dim_ = gallery.shape
        #: the gallery's exact duplicate rows: each copy scores as its first copy (:mod:`hubless.engine.duplicates`)
        self.gallery_duplicates_ = find_duplicates(gallery) if duplicates is None else duplicates
        statistics = tie_copies(statistics, self.gallery_duplicates_)
        self._fit_statistics(statistics)
        #: the bank statistics this correction uses (views of the ones given), kept for updates
        self.statistics_ = statistics.restricted(self.statistics_request())

    def _fit_statistics(self, statistics: BankStatistics) -> None:  # pragma: no cover - hook
        """Hook: set the fitted attributes from the bank statistics."""
        raise NotImplementedError

    # ------------------------------------------------------------------ ranking
    @property
    def is_fitted(self) -> bool:
        return hasattr(self, "gallery_")

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise NotFitted(f"{type(self).__name__} is not fitted yet; call fit(gallery, query_bank) first")

    @property
    def query_request(self) -> QueryRequest:
        """What this correction needs about each query's raw neighbours (hook; see
        :class:`~hubless.corrections.queries.QueryRequest`)."""
        return QueryRequest()

    @property
    def ranking_request(self) -> QueryRequest:
        """The part of :attr:`query_request` that :meth:`rank` needs (hook; the rest only serves
        :meth:`method_scores`, e.g. CSLS's r_q, and is computed when scores are asked for)."""
        return self.query_request

    def queries(self, queries, *, statistics: QueryStatistics | None = None, **weight) -> QueryBatch:
        """Validate ``queries`` (and this call's weight override, ``weight=0.5``, a scalar or
        one value per query) into a batch for :meth:`rank` and :meth:`method_scores`.
        ``statistics``: raw-neighbour statistics computed elsewhere (e.g. by an index)."""
        self._check_fitted()
        self._check_embeddings_fit()
        q = as_embeddings(queries, "queries", normalize=self.normalize, dim=self.dim_)
        return QueryBatch(q, self._weight_override(weight, q.shape[0]), statistics)

    def _weight_override(self, weight: dict, n_queries: int) -> np.ndarray | None:
        """This call's weight: ``weight=`` (every method's one name for it at search time); the
        method's own parameter name (``alpha=`` for NNN, ``lam=`` for DN) is still accepted, with
        a DeprecationWarning, until 0.2.0; not both."""
        if not weight:
            return None
        allowed = "weight=" if self.weight_param else "no weight override (it has no query-time weight)"
        if self.weight_param is None or len(weight) != 1 or not set(weight) <= {"weight", self.weight_param}:
            raise InvalidType(f"{type(self).__name__} got {', '.join(sorted(weight))}=; it accepts {allowed}")
        name = next(iter(weight))
        if name != "weight":
            warn_deprecated(
                f"{name}= at search time", "weight=", why=f"{name} stays the name of {type(self).__name__}'s constructor parameter"
            )
        value = self.check_weight(weight[name], name)
        if value.ndim > 1 or (value.ndim == 1 and value.shape[0] != n_queries):
            raise InvalidInput(f"{name} must be a scalar or have one value per query ({n_queries})")
        return value

    def query_statistics(self, batch: QueryBatch, *, progress: bool | None = None) -> QueryStatistics | None:
        """The raw-neighbour statistics of ``batch``, filled in by exact search over the gallery
        when the batch does not carry them already (None when nothing is needed)."""
        request = self.query_request
        if not request.depth:
            return None
        if batch.statistics is None or not batch.statistics.satisfies(request):
            depth = min(request.depth, self.n_gallery_)
            scores, ids = exact_search(batch.vectors, self.gallery_, depth, progress=progress, duplicates=self.gallery_duplicates_)
            batch.statistics = QueryStatistics.from_neighbours(request, scores, ids)
        return batch.statistics

    def rank(self, batch: QueryBatch, sims: np.ndarray, *, columns=None, out: np.ndarray | None = None) -> np.ndarray:
        """Ranking scores of ``batch`` from the raw similarities ``sims`` (float32): what every
        search orders by (best first, ties to the lower gallery id).

        ``columns`` says which gallery items ``sims`` covers: None (the whole gallery, in order),
        a slice (a contiguous block of items), or an (n_queries, k) int array (per query, the
        items of each entry, e.g. an index's candidates). ``out`` may be ``sims`` to rank in
        place; without it ``sims`` is left unchanged (but may be returned as is when the
        correction changes nothing).
        """
        self._check_fitted()
        needed = self.ranking_request
        if needed.depth and (batch.statistics is None or not batch.statistics.satisfies(needed)):
            if columns is None:
                batch.statistics = QueryStatistics.from_similarities(self.query_request, sims)
            else:
                self.query_statistics(batch)
        return self._rank(batch, sims, columns, out)

    def _rank(self, batch: QueryBatch, sims: np.ndarray, columns, out) -> np.ndarray:  # pragma: no cover - hook
        raise NotImplementedError

    def method_scores(self, batch: QueryBatch, ranking: np.ndarray) -> np.ndarray:
        """Map ranking scores (n_queries, any columns) to the method's own scores, float32.

        Increasing for every query, so it never changes an order. Identity by default.
        """
        return ranking

    def score(self, queries, **weight) -> np.ndarray:
        """The method's own corrected scores, (n_queries, n_gallery) float32.

        The output is dense: for large galleries use :meth:`search`, which never builds it.
        """
        batch = self.queries(queries, **weight)
        self.query_statistics(batch)
        out = np.empty((len(batch), self.n_gallery_), dtype=np.float32)
        # The ranking by the same streamed blocks as search(), so both see bitwise equal values
        # and order every query identically (ties to the lower index), duplicate rows included.
        stream_reduce(batch.vectors, self.gallery_, [Dense(out)], transform=self._block_transform(batch))
        self.gallery_duplicates_.fill_columns(out)  # each copy its first copy's score, as search() gives it
        rows = max(1, SCORE_BLOCK_ELEMENTS // self.n_gallery_)
        for start in range(0, len(batch), rows):
            out[start : start + rows] = self.method_scores(batch.rows(start, start + rows), out[start : start + rows])
        return out

    def additive_ranking(self, batch: QueryBatch) -> tuple[np.ndarray, np.ndarray] | None:
        """``(W, bias_columns_)`` when this batch's ranking is exactly ``s - W . bias_columns_``
        (the torch engine then ranks on the device), else None."""
        return None

    def _block_transform(self, batch: QueryBatch):
        """The engine transform that turns a block of raw similarities into ranking scores."""

        def transform(sims, r0, r1, c0, c1):
            self._rank(batch.rows(r0, r1), sims, slice(c0, c1), sims)

        return transform

    def search(self, queries, top_k: int = 10, *, progress: bool | None = None, device: DeviceName = None, **weight) -> Hits:
        """The ``top_k`` best gallery items of each query, best first: a :class:`~hubless.Hits`
        (it unpacks as ``scores, ids``).

        Both arrays are (n_queries, top_k); scores are the method's own (float32), ids int64
        (gallery row positions); ties are broken by the lower gallery index, and an exact copy
        of a gallery row scores as its first copy (so copies come in index order on any machine).
        A ``top_k`` beyond the gallery keeps the width: the slots past the gallery come last, not
        ``found``, with id -1 and score -inf (the one top-k rule,
        :func:`hubless._validation.check_top_k`). Methods with a weight parameter take ``weight=``
        here to override the fitted value without refitting, as a scalar or one value per query
        (``NNN.search(q, weight=0.5)``; the old ``alpha=`` / ``lam=`` warn until 0.2.0).
        ``device``: as in :meth:`fit`.
        """
        with use_device(device), checked_on_device():  # on a device: the query check there, its upload searched
            batch = self.queries(queries, **weight)
            top_k = check_top_k(top_k, self.n_gallery_)
            self.query_statistics(batch, progress=progress)
            additive = self.additive_ranking(batch) if torch_device() is not None else None  # ranked on the device
            ranking, ids = exact_search(
                batch.vectors,
                self.gallery_,
                min(top_k, self.n_gallery_),
                transform=self._block_transform(batch),
                additive=additive,
                progress=progress,
                duplicates=self.gallery_duplicates_,
            )
        return Hits.padded(*pad_top_k(self.method_scores(batch, ranking), ids, top_k))

    def bias(self) -> np.ndarray:
        """The per-candidate bias of the fitted gallery: (n_gallery, n_columns) float32, read
        only, one column per gated factor (one for all methods but DualDIS), so that the ranking
        is ``s(q, r) - W(q) . bias(r)``: any inner-product index over ``[r, bias(r)]`` queried
        with ``[q, -W(q)]`` (:meth:`~hubless.corrections.additive.AdditiveCorrection.query_weights`)
        ranks as :meth:`search`. GC ranks by probes, not by a bias: :class:`InvalidType`."""
        self._check_fitted()
        raise InvalidType(f"{type(self).__name__} ranks by probes, not by a per-candidate bias: use search() or score()")

    def save(self, path, *, overwrite: bool = False) -> Path:
        """Write this fitted correction to one file (``.npz``, written atomically): its spec, its
        gallery and the bank statistics it keeps, so :func:`hubless.load_correction` gives it back
        ranking bitwise as it does (no bank is read again). An existing file is replaced only
        with ``overwrite`` and only when hubless wrote it (:class:`~hubless.errors.AlreadyExists`)."""
        import zipfile

        from hubless._atomic import ARRAY_MARK, array_written_by_hubless, atomic_open

        self._check_fitted()
        path = Path(path)
        if path.exists() and not (overwrite and path.is_file() and array_written_by_hubless(path)):
            why = "pass overwrite=True to replace it" if not overwrite else "it is not a file hubless wrote: not replaced"
            raise AlreadyExists(f"{path} exists; {why}")
        head = {"format_version": SAVED_FORMAT_VERSION, "generator": "hubless", "spec": self.spec}
        arrays: dict[str, Any] = {SAVED_HEAD: np.array(json.dumps(head)), "gallery": self.gallery_}
        arrays.update((f"{STATISTICS_PREFIX}{k}", v) for k, v in self.statistics_.to_arrays().items())
        with atomic_open(path, "w+b") as fh:
            np.savez(fh, **arrays)
            with zipfile.ZipFile(fh, "a") as archive:
                archive.comment = ARRAY_MARK
        return path


def _format_value(value, default) -> str:
    """A parameter as written in a spec: real-valued parameters (float default) always as floats,
    so ``IS(beta=20)`` and ``IS(beta=20.0)`` both read ``is:beta=20.0``."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if isinstance(value, numbers.Real) and (isinstance(default, float) or not isinstance(value, numbers.Integral)):
        return repr(float(value))
    return str(value)
