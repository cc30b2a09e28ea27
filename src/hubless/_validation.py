"""Input checks shared by every public entry point.

Every array that enters hubless goes through :func:`as_embeddings`, so bad input fails early
with a message that names the argument and says what to do, and nothing downstream has to
re-check dtypes, shapes or finiteness.
"""

from __future__ import annotations

import contextvars
import numbers
import warnings
import weakref
from collections.abc import Callable

import numpy as np

from hubless.errors import InvalidInput, InvalidType

__all__ = [
    "UnnormalizedEmbeddingsWarning",
    "as_embeddings",
    "check_float_dtype",
    "check_positive_int",
    "check_k",
    "check_top_k",
    "pad_top_k",
    "MISSING",
    "MAX_PADDED_TOP_K",
    "check_nonnegative_float",
]

#: The id of a slot a search could not fill (fewer items than top_k, a filter, an ANN index's
#: probed lists running dry); its score is -inf. Such slots come last.
MISSING = -1
#: A top_k beyond the items a search can return is answered with unfilled slots up to this
#: many (see :func:`check_top_k`); above it and above the item count it is refused.
MAX_PADDED_TOP_K = 16384

#: Relative tolerance on ||x|| = 1 under which vectors count as already normalised.
NORM_TOLERANCE = 1e-3
#: Largest row norm accepted with normalize=False: dot products of two such rows stay far below
#: float32's maximum (3.4e38), whatever the dimension.
MAX_RAW_NORM = 1e15
#: With ``normalize=True``, rows whose norm is within this of 1 (float32 rounding of a unit
#: vector) are left unchanged; every other row is divided by its norm.
UNIT_PRECISION = 1e-6

#: Where set, computes the float64 row norms of a float32 array in place of :func:`as_embeddings`'s
#: host pass (the one pass over every entry: finiteness, scale, normalisation all follow from the
#: norms). The torch engine sets it while a fit runs on a device
#: (:func:`hubless.engine.device.checked_on_device`): the norms are computed on the device from the
#: upload the fit makes anyway, and only n floats come back (one sync per array).
ROW_NORMS: contextvars.ContextVar[Callable[[np.ndarray], np.ndarray] | None] = contextvars.ContextVar("hubless_row_norms", default=None)
#: Set with :data:`ROW_NORMS`: told ``(measured, result, norms, off)`` after the rows ``off`` of
#: the array whose norms were measured were divided by their norms into ``result`` (a copy, or
#: the measured array itself when nobody else holds it), so the device's upload of the measured
#: rows becomes the upload of ``result`` (:func:`hubless.engine.torch_arrays.normalised`).
NORMALISED: contextvars.ContextVar[Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None] | None] = contextvars.ContextVar(
    "hubless_normalised", default=None
)

_warned_names: set[str] = set()
#: Arrays already warned about (by identity): an array validated once and passed on (e.g. by the
#: CLI to ``fit``) is not warned about again under another name.
_warned_arrays: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


class UnnormalizedEmbeddingsWarning(UserWarning):
    """Embeddings are not unit-length while ``normalize=False`` (scores are then plain dot products)."""


def _reset_warnings() -> None:
    """Forget which arrays were already warned about (for tests)."""
    _warned_names.clear()
    _warned_arrays.clear()


def check_float_dtype(dtype, name: str) -> None:
    """Refuse a dtype that is not floating point (integer, boolean, complex, strings, objects)."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise InvalidType(
            f"{name} must be a floating-point array (float16, float32 or float64); "
            f"got dtype {dtype}. Convert it with .astype(numpy.float32) if that is intended."
        )


def _row(i: int, first_row: int, shard: tuple[str, int] | None) -> str:
    """How a message names row ``i`` of a checked block: its row in the whole set, and in its shard."""
    return f"row {first_row + i}" + ("" if shard is None else f", row {shard[1] + i} of shard {shard[0]}")


def as_embeddings(
    x,
    name: str,
    *,
    normalize: bool,
    dim: int | None = None,
    dim_of: str = "the gallery",
    first_row: int = 0,
    shard: tuple[str, int] | None = None,
    owned: bool = False,
) -> np.ndarray:
    """Return ``x`` as a C-contiguous float32 (n, d) array, validated and optionally L2-normalised.

    float16 and float64 are converted to float32; integer, boolean, complex and object arrays are
    refused. NaN/Inf, empty arrays, wrong ndim and a dimension different from ``dim`` raise
    ``ValueError`` naming ``name``. With ``normalize=True`` rows are scaled to unit length (zero
    rows are refused); with ``normalize=False`` non-unit rows trigger one
    :class:`UnnormalizedEmbeddingsWarning` per argument name and process.
    No copy is made when ``x`` is already float32, contiguous and (if asked) unit-length.

    The same checks run on each piece of a sharded source read by a distributed task
    (:meth:`hubless.distributed.EmbeddingSource.read`): ``first_row`` is the piece's first row in
    the whole set and ``shard`` its (file, row in that file), so a message names a bad row as a
    single-machine check would, and its shard. ``owned``: ``x`` is a float32 array nobody else
    holds (just read from disk), normalised in place instead of copied.
    """
    if isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            arr = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise InvalidType(f"{name} could not be converted to an array: {exc}") from exc
    check_float_dtype(arr.dtype, name)
    if arr.ndim != 2:
        hint = " For a single vector use x[None, :]." if arr.ndim == 1 else ""
        raise InvalidInput(f"{name} must be 2-D with shape (n_items, dim); got shape {arr.shape}.{hint}")
    if arr.shape[0] == 0:
        raise InvalidInput(f"{name} is empty (shape {arr.shape}); at least one row is needed.")
    if arr.shape[1] == 0:
        raise InvalidInput(f"{name} has zero-length vectors (shape {arr.shape}).")
    if dim is not None and arr.shape[1] != dim:
        raise InvalidInput(
            f"{name} has dimension {arr.shape[1]} but {dim_of} has dimension {dim}; all embeddings must come from the same model."
        )
    given = arr
    with np.errstate(over="ignore"):  # a float64 beyond float32's range becomes inf: refused below as Inf
        arr = np.ascontiguousarray(given, dtype=np.float32)
    # One pass: a row's float64 norm is finite exactly when all its entries are.
    row_norms = ROW_NORMS.get()
    norms = np.sqrt(np.einsum("ij,ij->i", arr, arr, dtype=np.float64)) if row_norms is None else row_norms(arr)
    if not np.isfinite(norms).all():
        bad_rows = np.flatnonzero(~np.isfinite(norms))
        first = _row(int(bad_rows[0]), first_row, shard)
        raise InvalidInput(f"{name} contains NaN or Inf in {bad_rows.size} row(s) (first: {first}); fix or drop those rows.")
    if not normalize and norms.max() > MAX_RAW_NORM:
        big = np.flatnonzero(norms > MAX_RAW_NORM)
        raise InvalidInput(
            f"{name} has {big.size} row(s) of norm above {MAX_RAW_NORM:.0e} (first: {_row(int(big[0]), first_row, shard)}, "
            f"norm {norms[big[0]]:.3g}): "
            "their dot products overflow float32; normalise the embeddings (drop --no-normalize / normalize=False)"
        )
    unit = np.abs(norms - 1.0) <= NORM_TOLERANCE
    if normalize:
        # Row by row, so a row's result never depends on the other rows in its batch; rows
        # already unit-length to float32 precision are left as they are.
        off = np.abs(norms - 1.0) > UNIT_PRECISION
        if off.any():
            zero = np.flatnonzero(norms == 0)
            if zero.size:
                raise InvalidInput(
                    f"{name} has {zero.size} all-zero row(s) (first: {_row(int(zero[0]), first_row, shard)}) that cannot "
                    "be L2-normalised; drop them or pass normalize=False."
                )
            measured = arr
            if np.may_share_memory(arr, given) and not owned:  # never write into the caller's memory
                arr = arr.copy()
            np.divide(arr, norms[:, None], out=arr, where=off[:, None])  # in float64, rounded to float32; no temporaries
            told = NORMALISED.get() if row_norms is not None else None
            if told is not None:  # a device's upload of the measured rows: now those of arr
                told(measured, arr, norms, off)
    elif not unit.all() and name not in _warned_names and _warned_arrays.get(id(given)) is not given:
        _warned_names.add(name)
        _warned_arrays[id(arr)] = arr
        warnings.warn(
            f"{name} is not L2-normalised (norms from {norms.min():.3g} to {norms.max():.3g}) and "
            "normalize=False: scores are raw dot products, not the cosine similarities the "
            "corrections were designed for.",
            UnnormalizedEmbeddingsWarning,
            stacklevel=3,
        )
    return arr


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as int if it is an integer >= 1, else raise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidType(f"{name} must be a positive integer; got {value!r}.")
    if value < 1:
        raise InvalidInput(f"{name} must be >= 1; got {value}.")
    return int(value)


def check_seed(value, name: str = "seed") -> int:
    """Return ``value`` as int if it is a whole number >= 0 (what numpy's generators take as a
    seed), else raise a clear error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidType(f"{name} must be a whole number >= 0; got {value!r}.")
    if value < 0:
        raise InvalidInput(f"{name} must be >= 0; got {value}.")
    return int(value)


def check_nonnegative_float(value, name: str, *, positive: bool = False) -> float:
    """Return ``value`` as float if it is a finite real >= 0 (> 0 with ``positive``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidType(f"{name} must be a real number; got {value!r}.")
    value = float(value)
    if not np.isfinite(value) or value < 0 or (positive and value == 0):
        need = "> 0" if positive else ">= 0"
        raise InvalidInput(f"{name} must be finite and {need}; got {value}.")
    return value


def check_k(k: int, n: int, name: str, what: str) -> int:
    """Check a neighbour count against the number of items it is taken from."""
    k = check_positive_int(k, name)
    if k > n:
        raise InvalidInput(f"{name}={k} exceeds the size of {what} ({n}); choose {name} <= {n}.")
    return k


def check_top_k(top_k, n_items: int, what: str = "the gallery") -> int:
    """The one top-k rule, read by every search (``Correction.search``, ``Index.search`` and
    ``search_uncorrected``, ``correct_scores``, the stores, an attached collection, the
    ``Searcher`` and so the CLI and the service): ``top_k`` is a positive integer
    (:class:`~hubless.errors.InvalidType` / :class:`~hubless.errors.InvalidInput` otherwise).

    A ``top_k`` larger than the ``n_items`` a search can return is not an error and never a
    narrower answer: the arrays stay ``top_k`` wide, the unfilled slots last with id
    :data:`MISSING` (-1) and score -inf (:func:`pad_top_k`); the CLI and the service leave them
    out. Only a ``top_k`` above both ``n_items`` and :data:`MAX_PADDED_TOP_K` is refused (it
    would allocate queries x top_k slots for nothing); up to ``n_items`` is always accepted.
    """
    top_k = check_positive_int(top_k, "top_k")
    if top_k > max(int(n_items), MAX_PADDED_TOP_K):
        raise InvalidInput(
            f"top_k={top_k} is far beyond the {n_items} items of {what}; choose top_k <= {max(int(n_items), MAX_PADDED_TOP_K)} "
            "(slots beyond the items come back with id -1 and score -inf)"
        )
    return top_k


def pad_top_k(scores: np.ndarray, ids: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """``(scores, ids)`` (numpy arrays) of width at most ``top_k`` widened to ``top_k`` by the
    rule of :func:`check_top_k`: the added slots (last) have score -inf and id :data:`MISSING`;
    the dtypes are kept."""
    missing = top_k - ids.shape[1]
    if missing <= 0:
        return scores, ids
    n = ids.shape[0]
    scores = np.concatenate([scores, np.full((n, missing), -np.inf, scores.dtype)], axis=1)
    ids = np.concatenate([ids, np.full((n, missing), MISSING, ids.dtype)], axis=1)
    return scores, ids


def check_target_recall(value) -> float:
    """A recall target: a number in (0, 1] (a share of the exact top k); InvalidType /
    InvalidInput otherwise. The index tuner and the stores' calibration both read it so."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidType(f"target_recall must be a number in (0, 1]; got {value!r}")
    if not 0.0 < float(value) <= 1.0:
        raise InvalidInput(f"target_recall must be in (0, 1] (a share of the exact top k); got {value!r}")
    return float(value)


def exactly_one(given) -> str:
    """The one name of ``given`` (name -> value, in the order to list them) whose value is not
    None / empty; InvalidInput naming them all otherwise ("give exactly one of ...") — the one
    rule for query kinds in the library, the CLI and the service."""
    chosen = [
        name for name, value in given.items() if value is not None and value is not False and not (isinstance(value, str) and not value)
    ]
    if len(chosen) != 1:
        names = list(given)
        listed = ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
        raise InvalidInput(f"give exactly one of {listed} (got {', '.join(chosen) or 'none'})")
    return chosen[0]
