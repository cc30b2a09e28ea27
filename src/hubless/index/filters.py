"""Filters over item metadata (:meth:`hubless.index.metadata.Metadata.mask`): the ``where``
language, evaluated column by column with Arrow, and the scalar indexes (a large chunk's values
sorted) that answer its comparisons by binary search.

``where={"split": "test", "year": {"gte": 2020}}`` is a conjunction over keys; a key's condition
is a value (equality), ``None`` (is null) or a dict of operators ``eq``, ``ne``, ``in``,
``not_in``, ``gt``, ``gte``, ``lt``, ``lte`` (all must hold).
On a list column a condition holds when it holds for some element (``{"tags": "cat"}``: the
item has the tag). A null never matches (not even ``ne``). Unknown keys or operators, values
of another type than the column's and numbers its type cannot hold are refused, naming them;
numbers compare exactly (:func:`exact_condition`), ``in`` / ``not_in`` as ``eq`` / ``ne`` value by
value, with or without a scalar index.

Filters combine (the query language of MongoDB, as Qdrant's ``should`` / ``must_not`` and
LanceDB's SQL ``OR`` / ``NOT``): ``{"$or": [f, g]}`` (some filter of the list matches),
``{"$and": [f, g]}`` (all do), ``{"$not": f}`` (the complement: also the items where ``f``'s
keys are null), beside other keys of the same object (a conjunction), nested up to
:data:`MAX_DEPTH` levels. A dotted key reads a field of a struct column (``{"info.source":
"web"}``), through lists of structs too (``{"objects.label": "cat"}``: some object's label is
"cat"); a column whose own name holds a dot is read by that name first.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from hubless.errors import InvalidInput, InvalidType
from hubless.index.arrow import describe, pyarrow

__all__ = [
    "LOGICAL",
    "MAX_DEPTH",
    "OPERATORS",
    "SCALAR_INDEX_CACHE",
    "SCALAR_INDEX_MIN_ROWS",
    "ScalarIndex",
    "exact_condition",
    "scalar_index",
    "where_mask",
]

#: The operators a ``where`` condition may use.
OPERATORS = ("eq", "ne", "in", "not_in", "gt", "gte", "lt", "lte")
#: The keys that combine filters: ``{"$or": [f, g]}``, ``{"$and": [f, g]}``, ``{"$not": f}``.
LOGICAL = ("$and", "$or", "$not")
#: How deep ``$and`` / ``$or`` / ``$not`` may nest (a bound for filters sent over HTTP).
MAX_DEPTH = 16


def _conditions(key: str, condition) -> list[tuple[str, Any]]:
    if condition is None:
        return [("is_null", None)]
    if isinstance(condition, Mapping):
        if not condition:
            raise InvalidInput(f"where {key!r}: an empty condition; use one of the operators {', '.join(OPERATORS)}")
        unknown = [op for op in condition if op not in OPERATORS]
        if unknown:
            raise InvalidInput(f"where {key!r}: unknown operator {unknown[0]!r}; use {', '.join(OPERATORS)}")
        for op in ("in", "not_in"):
            if op in condition and (isinstance(condition[op], (str, bytes)) or not isinstance(condition[op], Sequence)):
                raise InvalidInput(f"where {key!r}: {op!r} takes a list of values")
        return list(condition.items())
    if isinstance(condition, (list, tuple)):
        raise InvalidInput(f'where {key!r}: a list is ambiguous; write {{"in": [...]}} for any of these values')
    return [("eq", condition)]


def _evaluate(column, key: str, op: str, value, n: int) -> np.ndarray:
    """Rows of ``column`` (chunked) meeting one condition; nulls never do."""
    pa = pyarrow()
    import pyarrow.compute as pc

    if op == "is_null":
        return pc.is_null(column).to_numpy(zero_copy_only=False)
    if op in ("ne", "not_in"):
        positive = _evaluate(column, key, "eq" if op == "ne" else "in", value, n)
        return ~positive & ~pc.is_null(column).to_numpy(zero_copy_only=False)
    kind = column.type
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        flat = pc.list_flatten(column)
        parents = pc.list_parent_indices(column).to_numpy(zero_copy_only=False)
        hits = _compare(flat, kind.value_type, key, op, value)
        out = np.zeros(n, dtype=bool)
        out[parents[hits]] = True
        return out
    if op in _INDEXED_OPS:
        found = _indexed(column, key, op, value, n)
        if found is not None:
            return found
    return _compare(column, kind, key, op, value)


def _compare(values, kind, key: str, op: str, value) -> np.ndarray:
    pa = pyarrow()
    import pyarrow.compute as pc

    op, value = exact_condition(key, kind, op, value)
    n = len(values)
    if op == "never":
        return np.zeros(n, dtype=bool)
    if pa.types.is_floating(kind):  # compared in float64, where every float16/32 value is exact
        values, kind = pc.cast(values, pa.float64()), pa.float64()
    if op == "in":
        if pa.types.is_floating(kind):  # is_in hashes -0.0 apart from 0.0 (equal by every comparison): +0.0 for both
            values, value = pc.add(values, pa.scalar(0.0, type=kind)), [v + 0.0 for v in value]
        result = pc.is_in(values, value_set=pa.array(value, type=kind))
    else:
        function = {"eq": pc.equal, "gt": pc.greater, "gte": pc.greater_equal, "lt": pc.less, "lte": pc.less_equal}[op]
        result = function(values, pa.scalar(value, type=kind))
    return pc.fill_null(result, False).to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _check_value(key: str, kind, value, op: str) -> None:
    pa = pyarrow()
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    ok = (
        (pa.types.is_integer(kind) and number and (op != "in" or isinstance(value, (int, np.integer)) or float(value).is_integer()))
        or (pa.types.is_floating(kind) and number)
        or (pa.types.is_boolean(kind) and isinstance(value, (bool, np.bool_)) and op in ("eq", "in"))
        or ((pa.types.is_string(kind) or pa.types.is_large_string(kind)) and isinstance(value, str))
    )
    if not ok:
        raise InvalidType(f"where {key!r}: the key holds {describe(kind)} values; {op} got {value!r} ({type(value).__name__})")


def exact_condition(key: str, kind, op: str, value) -> tuple[str, Any]:
    """``op value`` (``in``: a list of values) checked against the column type ``kind`` and
    written in the column's own terms, so that Arrow's compute and the scalar indexes decide
    exactly the same rows: ``("never", None)`` when no value can meet it.

    One rule, that of ``eq``: a value is compared with the column's values as numbers, exactly.

    * integer columns: a value outside the type's range (an integer >= 2^63 on int64, 2^31 on
      int32, a negative one on unsigned, an infinity, NaN) is an :class:`InvalidInput` naming
      the range; a fraction becomes the integer bound that means the same (``gt 1999.5`` is
      ``gte 2000``; ``eq 1999.5`` never holds);
    * float columns: compared in float64, where every float16 / float32 value is exact, so
      ``{"in": [0.1]}`` on float32 matches what ``{"eq": 0.1}`` matches (none of float32's
      values is 0.1), with or without a scalar index; NaN never matches (no comparison holds
      for it: ``ne`` / ``not_in`` NaN hold for every non-null value); an integer beyond
      float64's range is an InvalidInput, and one between two floats is the bound that means
      the same.
    """
    pa = pyarrow()
    values = list(value) if op == "in" else [value]
    for v in values:
        _check_value(key, kind, v, op)
    exact = []
    for v in values:
        one = _exact_number(key, kind, op if op != "in" else "eq", v) if not isinstance(v, (str, bool, np.bool_)) else (op, v)
        if op == "in":
            if one[0] != "never":
                exact.append(one[1])
        else:
            return one
    if op == "in" and pa.types.is_boolean(kind):
        exact = [bool(v) for v in exact]
    return "in", exact


def _shown(value) -> str:
    """``value`` for a message: its repr, a long one cut (an integer of 400 digits)."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _exact_number(key: str, kind, op: str, value) -> tuple[str, Any]:
    """One number ``value`` against a numeric column (see :func:`exact_condition`)."""
    pa = pyarrow()
    if pa.types.is_integer(kind):
        info = np.iinfo(kind.to_pandas_dtype())
        if isinstance(value, (float, np.floating)) and not np.isfinite(value):
            raise InvalidInput(f"where {key!r}: the key holds {describe(kind)} values; {op} got {_shown(value)}, which no {kind} value is")
        if not info.min <= value <= info.max:  # exact: Python compares int and float exactly
            raise InvalidInput(f"where {key!r}: {_shown(value)} is outside the {kind} values the key holds ({info.min} to {info.max})")
        if isinstance(value, (int, np.integer)):
            return op, int(value)
        if float(value).is_integer():
            return op, int(value)
        if op == "eq":
            return "never", None
        if op in ("gt", "gte"):
            return "gte", int(np.ceil(value))
        return "lte", int(np.floor(value))
    if pa.types.is_floating(kind):
        if isinstance(value, (int, np.integer)):
            try:
                near = float(value)
            except OverflowError:
                raise InvalidInput(
                    f"where {key!r}: {_shown(value)} is beyond the range of the {describe(kind)} values the key holds"
                ) from None
            if int(near) != int(value):  # between two floats: the bound that means the same
                if op == "eq":
                    return "never", None
                above = near if near > value else float(np.nextafter(near, np.inf))
                below = near if near < value else float(np.nextafter(near, -np.inf))
                return {"gt": ("gte", above), "gte": ("gte", above), "lt": ("lte", below), "lte": ("lte", below)}[op]
            value = near
        value = float(value)
        if np.isnan(value):
            return "never", None
        return op, value
    return op, value


# ---------------------------------------------------------------------------------- filter trees
class Columns(Protocol):
    """What a filter reads of the metadata it runs on (:class:`hubless.index.metadata.Metadata`):
    the schema, the rows as one Arrow table, and their number."""

    @property
    def schema(self) -> Any: ...
    @property
    def table(self) -> Any: ...
    @property
    def n_rows(self) -> int: ...


def where_mask(meta: Columns, where: Mapping, depth: int) -> np.ndarray:
    """Rows matching one filter object: the conjunction of its keys, where a key is a column
    (``"split"``), a dotted path into struct columns (``"info.source"``, through lists of
    structs too: ``"objects.label"``) or one of :data:`LOGICAL`."""
    if depth > MAX_DEPTH:
        raise InvalidInput(f"where: $and / $or / $not nest deeper than {MAX_DEPTH} levels")
    out: np.ndarray | None = None

    def both(mask: np.ndarray) -> None:
        nonlocal out
        if out is None:
            out = mask if mask.flags.writeable else mask.copy()  # this call's own: no pass to combine it
        else:
            out &= mask

    for key, condition in where.items():
        if not isinstance(key, str):
            raise InvalidInput(f"where: keys must be strings; got {key!r}")
        if key in LOGICAL and key not in meta.schema.names:
            both(_logical(meta, key, condition, depth))
            continue
        if key.startswith("$") and key not in meta.schema.names:
            raise InvalidInput(f"where: unknown logical operator {key!r}; use {', '.join(LOGICAL)}")
        if key in meta.schema.names:
            column = meta.table.column(key)
            if pyarrow().types.is_struct(column.type) and isinstance(condition, Mapping) and condition:
                fields = [f.name for f in column.type]
                if any(op not in OPERATORS for op in condition):
                    raise InvalidInput(f"where {key!r}: a struct column is filtered by its fields, e.g. {key + '.' + fields[0]!r}")
            for op, value in _conditions(key, condition):
                both(_evaluate(column, key, op, value, meta.n_rows))
            continue
        values, parents, defined = _path(meta, key)
        for op, value in _conditions(key, condition):
            both(_evaluate_path(values, parents, defined, key, op, value, meta.n_rows))
    return np.ones(meta.n_rows, dtype=bool) if out is None else out


def _logical(meta: Columns, key: str, condition, depth: int) -> np.ndarray:
    def sub(item, where_: str) -> np.ndarray:
        if not isinstance(item, Mapping) or not item:
            raise InvalidInput(f"where {where_}: each filter must be a non-empty dict of conditions; got {item!r}")
        return where_mask(meta, item, depth + 1)

    if key == "$not":
        return ~sub(condition, "$not")
    if isinstance(condition, (str, bytes, Mapping)) or not isinstance(condition, Sequence) or not condition:
        raise InvalidInput(f'where {key}: takes a non-empty list of filters, e.g. {{"{key}": [{{"split": "test"}}, {{"year": 2020}}]}}')
    masks = [sub(item, f"{key}[{i}]") for i, item in enumerate(condition)]
    return np.logical_or.reduce(masks) if key == "$or" else np.logical_and.reduce(masks)


def _path(meta: Columns, key: str):
    """A dotted key's values, flattened: ``(values, parents, defined)``: the values (one pyarrow
    array), the row each value belongs to (None: the values are the rows) and which rows have
    the path (not null; for a path through a list, the list is not null)."""
    pa = pyarrow()
    import pyarrow.compute as pc

    head, *fields = key.split(".")
    if not fields or head not in meta.schema.names or not all(fields):
        known = ", ".join(meta.schema.names) or "none"
        raise InvalidInput(f"where: no metadata key {key!r} in this index (keys: {known}; a dotted key reads a field of a struct column)")
    array = meta.table.column(head)
    array = array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    parents: np.ndarray | None = None
    defined: np.ndarray | None = None
    walked = head

    def flatten(array, parents, defined):
        if defined is None:  # the first list on the path: a row has the path when its list is not null
            defined = array.is_valid().to_numpy(zero_copy_only=False)
        at = pc.list_parent_indices(array).to_numpy(zero_copy_only=False).astype(np.int64)
        return pc.list_flatten(array), (at if parents is None else parents[at]), defined

    for name in fields:
        if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
            array, parents, defined = flatten(array, parents, defined)
        if not pa.types.is_struct(array.type) or array.type.get_field_index(name) < 0:
            shown = describe(array.type)
            raise InvalidInput(f"where: no metadata key {key!r}: {walked!r} holds {shown} values, without a field {name!r}")
        array = pc.struct_field(array, name)
        walked += f".{name}"
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        array, parents, defined = flatten(array, parents, defined)
    elif defined is None:
        defined = array.is_valid().to_numpy(zero_copy_only=False)
    assert defined is not None
    return array, parents, defined


def _evaluate_path(values, parents, defined: np.ndarray, key: str, op: str, value, n: int) -> np.ndarray:
    """Rows meeting one condition on a dotted path's values (see :func:`_path`): a row matches
    when one of its values does; ``ne`` / ``not_in``: it has the path and none of its values
    is the one(s) named; nulls never match."""
    if op == "is_null":
        return ~defined
    if op in ("ne", "not_in"):
        return defined & ~_evaluate_path(values, parents, defined, key, "eq" if op == "ne" else "in", value, n)
    hits = _compare(values, values.type, key, op, value)
    if parents is None:
        return hits
    out = np.zeros(n, dtype=bool)
    out[parents[hits]] = True
    return out


# ---------------------------------------------------------------------------------- scalar indexes
#: Chunks of a column with at least this many rows get a scalar index (sorted values and their
#: rows), built at their second filter and kept while they are in use; smaller chunks (a write's
#: rows) are compared value by value. ``None`` turns scalar indexes off.
SCALAR_INDEX_MIN_ROWS: int | None = 16384
#: Scalar indexes kept (least recently used first out).
SCALAR_INDEX_CACHE = 32
_INDEXED_OPS = frozenset({"eq", "in", "gt", "gte", "lt", "lte"})


class ScalarIndex:
    """One column chunk's values, sorted, and the row of each: a filter's rows found by binary
    search, O(log n + matches) instead of one comparison per row (the sorted-column index of
    LanceDB's BTREE and Milvus's STL_SORT). Nulls (and NaN: no comparison holds for it) are left
    out, so they never match. Numbers and booleans are sorted as they are; strings by their code
    points (Arrow's order), as the ranks of their sorted distinct values."""

    def __init__(self, chunk) -> None:
        pa = pyarrow()
        import pyarrow.compute as pc

        self.type = chunk.type
        self.strings: np.ndarray | None = None
        if pa.types.is_string(chunk.type) or pa.types.is_large_string(chunk.type):
            encoded = chunk.dictionary_encode()
            order = np.asarray(pc.array_sort_indices(encoded.dictionary))
            self.strings = np.asarray(encoded.dictionary.take(pa.array(order)).to_pylist(), dtype=object)
            rank = np.empty(order.size, dtype=np.int64)
            rank[order] = np.arange(order.size)
            codes = encoded.indices
            valid = np.flatnonzero(codes.is_valid().to_numpy(zero_copy_only=False))
            keys = rank[codes.fill_null(0).to_numpy(zero_copy_only=False)[valid]]
        else:
            values = chunk.fill_null(False if pa.types.is_boolean(chunk.type) else 0).to_numpy(zero_copy_only=False)
            ok = chunk.is_valid().to_numpy(zero_copy_only=False)
            if pa.types.is_floating(chunk.type):
                ok &= ~np.isnan(values)
            valid = np.flatnonzero(ok)
            keys = values[valid]
            if keys.dtype == np.bool_:
                keys = keys.astype(np.int8)
            elif keys.dtype.kind == "f":
                keys = keys.astype(np.float64)  # compared in double precision, as Arrow compares a float column
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.rows = valid[order].astype(np.int64)

    def rows_for(self, op: str, value) -> np.ndarray | None:
        """The rows (of the chunk) whose value meets ``op value`` (``in``: a list; the values
        written in the column's own terms by :func:`exact_condition`), or None when this index
        cannot say (a string against numbers)."""
        if op == "in":
            parts = []
            for v in value:
                found = self.rows_for("eq", v)
                if found is None:
                    return None
                parts.append(found)
            return np.concatenate(parts) if parts else np.zeros(0, np.int64)
        bounds = self._bounds(op, value)
        if bounds is None:
            return None
        lo, hi = bounds
        return self.rows[lo:hi]

    def _bounds(self, op: str, value) -> tuple[int, int] | None:
        keys, n = self.keys, self.keys.size
        if self.strings is not None:
            if not isinstance(value, str):
                return None
            left = int(np.searchsorted(self.strings, value, "left"))
            right = int(np.searchsorted(self.strings, value, "right"))
            # ranks of the distinct values < value are [0, left), == value [left, right)
            ranks = {"eq": (left, right), "gt": (right, None), "gte": (left, None), "lt": (0, left), "lte": (0, right)}[op]
            lo = int(np.searchsorted(keys, ranks[0], "left"))
            hi = n if ranks[1] is None else int(np.searchsorted(keys, ranks[1], "left"))
            return lo, hi
        if isinstance(value, (bool, np.bool_)):
            value = int(value)
        # the value is the column's own (exact_condition): an integer in the type's range, or a float64
        value = keys.dtype.type(value) if keys.dtype.kind in "iu" else np.float64(value)
        left = int(np.searchsorted(keys, value, "left"))
        right = int(np.searchsorted(keys, value, "right"))
        return {"eq": (left, right), "gt": (right, n), "gte": (left, n), "lt": (0, left), "lte": (0, right)}[op]


_scalar_cache: dict = {}  # key -> (chunk kept alive, ScalarIndex or None: seen once)
_scalar_lock = threading.Lock()


def _chunk_key(chunk) -> tuple:
    return (str(chunk.type), chunk.offset, len(chunk), *(0 if b is None else b.address for b in chunk.buffers()))


def scalar_index(chunk) -> ScalarIndex | None:
    """The chunk's scalar index, made at the second time it is filtered (a chunk filtered once,
    e.g. the rows of a cast, costs no index); None for a small chunk or a type without one."""
    pa = pyarrow()
    kind = chunk.type
    if SCALAR_INDEX_MIN_ROWS is None or len(chunk) < SCALAR_INDEX_MIN_ROWS or chunk.null_count == len(chunk):
        return None
    if not (
        pa.types.is_integer(kind)
        or pa.types.is_floating(kind)
        or pa.types.is_boolean(kind)
        or pa.types.is_string(kind)
        or pa.types.is_large_string(kind)
    ):
        return None
    key = _chunk_key(chunk)
    with _scalar_lock:
        hit = _scalar_cache.pop(key, None)
        if hit is not None:
            _scalar_cache[key] = hit  # most recently used last
            if hit[1] is not None:
                return hit[1]
        else:
            _scalar_cache[key] = (chunk, None)
            while len(_scalar_cache) > SCALAR_INDEX_CACHE:
                _scalar_cache.pop(next(iter(_scalar_cache)))
            return None
    built = ScalarIndex(chunk)
    with _scalar_lock:
        if key in _scalar_cache:
            _scalar_cache[key] = (chunk, built)
    return built


def _indexed(column, key: str, op: str, value, n: int) -> np.ndarray | None:
    """``op value`` over a chunked scalar column through the scalar indexes of its large chunks
    (the others compared value by value); None when no chunk has an index (the caller compares)."""
    pa = pyarrow()
    kind = column.type
    op, value = exact_condition(key, kind, op, value)
    if op == "never":
        return np.zeros(n, dtype=bool)
    chunks = column.chunks
    indexes = [scalar_index(c) for c in chunks]
    if all(ix is None for ix in indexes):
        return None
    out = np.zeros(n, dtype=bool)
    offset, run_start = 0, 0
    run: list = []  # consecutive chunks without an index, compared in one call

    def flush() -> None:
        if run and any(c.null_count < len(c) for c in run):
            size = int(sum(len(c) for c in run))
            out[run_start : run_start + size] = _compare(pa.chunked_array(run, type=kind), kind, key, op, value)
        run.clear()

    for chunk, index in zip(chunks, indexes):
        rows = None if index is None else index.rows_for(op, value)
        if rows is not None:
            flush()
            out[offset + rows] = True
        else:
            if not run:
                run_start = offset
            run.append(chunk)
        offset += len(chunk)
    flush()
    return out
