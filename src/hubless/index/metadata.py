"""Typed item metadata of an index: one pyarrow schema, kept.

Item metadata is a table with one typed column per key, in the index's physical row order, made
of parts (the base, then one part per write) that are only ever appended:

* the schema is given at build (``metadata_schema=``) or inferred from the first records, and
  then kept: every later value of a key must have that key's type (an int for an int64 column;
  an int is accepted for a float column, since JSON does not tell 3 from 3.0; ``None`` is a
  null of any type). Another type is an :class:`~hubless.errors.InvalidInput` naming the key,
  the type expected and the type given, raised before anything is written;
* a new key adds a nullable column (earlier items read null there); a key seen only with nulls
  so far takes the type of its first non-null value;
* types round-trip through saving (int64 stays int64; float64, bool, null, string, lists of
  strings and other nested types as pyarrow infers them).

Filters over the metadata (``where=``) are in :mod:`hubless.index.filters`.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np

from hubless.errors import InvalidInput, InvalidType
from hubless.index.arrow import describe, pyarrow
from hubless.index.filters import where_mask

__all__ = ["MAX_PARTS", "Metadata", "as_columns", "check_keys", "table_bytes", "table_from_bytes"]

#: Parts (the base's, then one per write) a metadata keeps before folding the written ones into one.
MAX_PARTS = 32


def as_columns(metadata, n: int) -> dict[str, list]:
    """Metadata given as a list of ``n`` dicts (or ``None`` for an item without any), a dict of
    ``n``-long columns, or a pyarrow Table, as key -> list of ``n`` values."""
    pa = pyarrow()
    if isinstance(metadata, pa.Table):
        metadata = metadata.to_pydict()
    kinds = "a list of records (dicts), a dict of columns or a pyarrow Table"
    if isinstance(metadata, Mapping):
        wrong = next((k for k, v in metadata.items() if isinstance(v, (str, bytes, Mapping)) or not isinstance(v, Iterable)), None)
        if wrong is not None:
            raise InvalidType(f"metadata column {wrong!r} is a {type(metadata[wrong]).__name__}; metadata must be {kinds}")
        columns = {k: list(v) for k, v in metadata.items()}
        bad = {k: len(v) for k, v in columns.items() if len(v) != n}
        if bad:
            raise InvalidInput(f"metadata columns must have one value per item ({n}); got lengths {sorted(set(bad.values()))}")
    else:
        if isinstance(metadata, (str, bytes)) or not isinstance(metadata, Iterable):
            raise InvalidType(f"metadata is a {type(metadata).__name__}; it must be {kinds}")
        records = list(metadata)
        if len(records) != n:
            raise InvalidInput(f"metadata must be {n} records (one per item) or a dict of columns; got {len(records)} records")
        columns = {}
        for i, record in enumerate(records):
            if record is None:
                continue
            if not isinstance(record, Mapping):
                raise InvalidType(f"metadata record {i} is a {type(record).__name__}; each record must be a dict (or None)")
            for key, value in record.items():
                columns.setdefault(key, [None] * n)[i] = value
    for key in columns:
        if not isinstance(key, str) or not key:
            raise InvalidType(f"metadata keys must be non-empty strings; got {key!r}")
    _check_keys(columns)
    return columns


#: Metadata keys an item may not have: ``id`` is the item's own id (``ids=``), the first column of
#: ``Index.metadata_table()``.
RESERVED_KEYS = ("id",)


def check_keys(metadata, schema=None) -> None:
    """Refuse a reserved key in ``metadata`` (records, columns or a Table) or ``schema`` before
    any work (e.g. a fit) is done; :meth:`Metadata.appended` checks them again."""
    pa = pyarrow()
    if schema is not None and isinstance(schema, pa.Schema):
        _check_keys(schema.names)
    if isinstance(metadata, pa.Table):
        _check_keys(metadata.column_names)
    elif isinstance(metadata, Mapping):
        _check_keys(metadata)
    elif isinstance(metadata, (list, tuple)):  # records (an iterator is left for the real read)
        _check_keys({key for record in metadata if isinstance(record, Mapping) for key in record if key in RESERVED_KEYS})


def _check_keys(names) -> None:
    for key in names:
        if key in RESERVED_KEYS:
            raise InvalidInput(
                f"metadata key {key!r} is reserved: an item's id is given with ids= (--ids) and is the 'id' column of "
                "metadata_table(); rename the key (e.g. 'source_id')"
            )


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _typed(key: str, values: list, expected):
    """``values`` as a pyarrow array for the column type ``expected`` (None or null: the column
    takes the inferred type). Returns ``(array, type)``; a value of another type than the
    column's is an InvalidType naming the key, the type expected and the type given."""
    pa = pyarrow()
    known = expected is not None and not pa.types.is_null(expected)
    try:
        array = pa.array(values)
    except UnicodeEncodeError as exc:
        bad = next(i for i, v in enumerate(values) if isinstance(v, str) and not _encodes(v))
        raise InvalidInput(f"metadata {key!r} of item {bad} is not valid Unicode ({exc.reason})") from None
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
        if known:
            _refuse_first_offender(key, values, expected)
        kinds = sorted({type(v).__name__ for v in values if v is not None})
        raise InvalidType(f"metadata key {key!r} mixes values of types {', '.join(kinds)}; one key holds one type") from None
    given = array.type
    if not known:
        return array, given
    if given == expected:
        return array, expected
    if pa.types.is_null(given):
        return pa.nulls(len(values), expected), expected
    refined = _refined(expected, given) if _open(expected) else None
    if refined is not None:  # e.g. list<null> (only empty lists so far) meets list<string>: the column takes it
        return (array if array.type == refined else array.cast(refined)), refined
    if _compatible(expected, given):
        try:
            cast = array.cast(expected)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
        else:
            _refuse_overflow(key, array, cast, expected)
            return cast, expected
    _refuse_first_offender(key, values, expected)
    raise InvalidType(f"metadata key {key!r} holds {describe(expected)} values; got {describe(given)}")  # pragma: no cover


def _refuse_overflow(key: str, given, cast, expected) -> None:
    """A finite float that the narrower float column made infinite (Arrow's cast does not check:
    1e300 into float32) is an InvalidInput naming the key, the value and the type's range."""
    pa = pyarrow()
    if not (pa.types.is_floating(expected) and pa.types.is_floating(given.type)):
        return
    before = np.asarray(given.to_numpy(zero_copy_only=False), dtype=np.float64)
    after = np.asarray(cast.to_numpy(zero_copy_only=False), dtype=np.float64)
    bad = np.flatnonzero(np.isfinite(before) & ~np.isfinite(after))
    if bad.size:
        largest = float(np.finfo(expected.to_pandas_dtype()).max)
        raise InvalidInput(
            f"metadata key {key!r} holds {describe(expected)} values, at most {largest:.7g} in size; got {float(before[bad[0]])!r} in record {int(bad[0])}"
        )


def _open(t) -> bool:
    """Whether a column type still has a null part: a list column seen only with empty lists
    (``list<null>``), whose element type comes from its first non-empty value."""
    pa = pyarrow()
    if pa.types.is_null(t):
        return True
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and _open(t.value_type)


def _refined(expected, given):
    """The type holding both ``expected`` and ``given`` values, where one fills the other's null
    parts (``list<null>`` and ``list<string>``: ``list<string>``); None when they differ."""
    pa = pyarrow()
    if pa.types.is_null(expected):
        return given
    if pa.types.is_null(given) or given == expected:
        return expected
    for kind, make in ((pa.types.is_list, pa.list_), (pa.types.is_large_list, pa.large_list)):
        if kind(expected) and kind(given):
            inner = _refined(expected.value_type, given.value_type)
            return None if inner is None else make(inner)
    return None


def _compatible(expected, given) -> bool:
    """Whether ``given`` values may be stored in an ``expected`` column without changing meaning."""
    pa = pyarrow()

    def text(t):
        return pa.types.is_string(t) or pa.types.is_large_string(t)

    return (
        given == expected
        or pa.types.is_null(given)
        or (pa.types.is_floating(expected) and (pa.types.is_integer(given) or pa.types.is_floating(given)))  # JSON: 3 == 3.0
        or (pa.types.is_integer(expected) and pa.types.is_integer(given))
        or (text(expected) and text(given))
        or (pa.types.is_list(expected) and pa.types.is_list(given) and pa.types.is_null(given.value_type))  # empty lists
        or _nested_fits(expected, given)
    )


def _nested_fits(expected, given) -> bool:
    """Lists and structs whose parts fit (a struct with a null field, ``{"src": None}``, is
    inferred as ``struct<src: null>``; it fits ``struct<src: string>``): the same field names,
    each field's values fitting its column's type."""
    pa = pyarrow()
    if pa.types.is_list(expected) and pa.types.is_list(given):
        return _compatible(expected.value_type, given.value_type)
    if pa.types.is_struct(expected) and pa.types.is_struct(given):
        names = [f.name for f in expected]
        return names == [f.name for f in given] and all(_compatible(expected.field(n).type, given.field(n).type) for n in names)
    return False


def _refuse_first_offender(key: str, values: list, expected) -> None:
    """Raise for the first value whose own type does not fit the ``expected`` column."""
    pa = pyarrow()
    for i, value in enumerate(values):
        if value is None:
            continue
        try:
            given = pa.array([value]).type
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError):
            given = None
        if given is None or not _compatible(expected, given):
            shown = type(value).__name__ if given is None else describe(given)
            raise InvalidType(f"metadata key {key!r} holds {describe(expected)} values; got {shown} ({value!r}) in record {i}")


class Metadata:
    """Item metadata over a live index's physical rows: a schema and parts (see the module
    docstring). Immutable: :meth:`appended` returns a new one."""

    def __init__(self, schema, parts: Sequence[tuple[int, Any]]) -> None:
        self.schema = schema
        self.parts = tuple(parts)  # (n_rows, pyarrow Table or None: no value in this part)
        self.n_rows = sum(n for n, _ in self.parts)

    @classmethod
    def empty(cls, n: int, schema=None) -> Metadata:
        pa = pyarrow()
        if schema is not None:
            _check_keys(schema.names)
        return cls(pa.schema([]) if schema is None else schema, [(n, None)] if n else [])

    @classmethod
    def from_records(cls, metadata, n: int, schema=None) -> Metadata:
        """Metadata of ``n`` items (records or columns, see :func:`as_columns`), typed by
        ``schema`` where it names a key and inferred otherwise."""
        pa = pyarrow()
        if schema is not None and not isinstance(schema, pa.Schema):
            raise InvalidType(f"metadata_schema must be a pyarrow.Schema; got {type(schema).__name__}")
        if schema is not None:
            _check_keys(schema.names)
        return cls.empty(0, schema).appended(metadata, n)

    def appended(self, metadata, n: int) -> Metadata:
        """This metadata followed by ``n`` items' (None: no values); the schema grows by the new
        keys. Raises (changing nothing) on a value of another type than its key's column."""
        pa = pyarrow()
        if metadata is None:
            return Metadata(self.schema, [*self.parts, (n, None)])
        columns = as_columns(metadata, n)
        schema, arrays = self.schema, {}
        for key, values in columns.items():
            index = schema.get_field_index(key)
            expected = None if index < 0 else schema.field(index).type
            arrays[key], kind = _typed(key, values, expected)
            if index < 0:
                schema = schema.append(pa.field(key, kind, nullable=True))
            elif kind != expected:  # a column of nulls so far takes its first type
                schema = schema.set(index, pa.field(key, kind, nullable=True))
        table = pa.table(arrays) if arrays else None
        return Metadata(schema, [*self.parts, (n, table)]).folded()

    def folded(self) -> Metadata:
        """This metadata with at most :data:`MAX_PARTS` parts: past that, the parts after the
        first (the base's) are folded into one table (O(rows written since the base), once per
        :data:`MAX_PARTS` writes), so a write never costs O(writes so far)."""
        if len(self.parts) <= MAX_PARTS:
            return self
        rest = self.parts[1:]
        rows = sum(n for n, _ in rest)
        return Metadata(self.schema, [self.parts[0], (rows, _joined(self.schema, rest, rows).combine_chunks())])

    def concatenated(self, other: Metadata) -> Metadata:
        """This metadata followed by ``other``'s parts (``other``'s schema, which must extend
        this one's: read from a later write)."""
        return Metadata(other.schema, [*self.parts, *other.parts])

    # ------------------------------------------------------------------ reading
    @cached_property
    def table(self):
        """All rows as one table with every schema column (nulls where a part has no value)."""
        return _joined(self.schema, self.parts, self.n_rows)

    def rows_from(self, start: int):
        """Rows ``start:`` as one table with every schema column, made of the parts holding
        them only (a write's new rows: O(batch), not O(rows))."""
        cut, position = [], 0
        for n, table in self.parts:
            if position + n > start:
                skip = max(0, start - position)
                cut.append((n - skip, table if table is None or not skip else table.slice(skip)))
            position += n
        return _joined(self.schema, cut, self.n_rows - start)

    def take(self, positions) -> list[dict]:
        """The records (dicts with every key; None where unset) of rows ``positions``."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.schema.names:
            return [{} for _ in range(positions.size)]
        return self.table.take(positions).to_pylist()

    def select(self, positions) -> Metadata:
        """Rows ``positions`` (in that order) as one part: the metadata of a compacted index."""
        positions = np.asarray(positions, dtype=np.int64)
        table = self.table.take(positions) if self.schema.names else None
        return Metadata(self.schema, [(positions.size, table)])

    # ------------------------------------------------------------------ filters
    def mask(self, where: Mapping) -> np.ndarray:
        """Boolean (n_rows,) mask of the rows matching ``where`` (see :mod:`hubless.index.filters`)."""
        if not isinstance(where, Mapping) or not where:
            raise InvalidInput('where must be a non-empty dict of metadata conditions, e.g. {"split": "test", "year": {"gte": 2020}}')
        return where_mask(self, where, 0)

    # ------------------------------------------------------------------ files
    def schema_text(self) -> str:
        """The schema, serialised (Arrow IPC, base64) for a manifest."""
        return base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii")

    @staticmethod
    def schema_from_text(text: str):
        pa = pyarrow()
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text.encode("ascii"), validate=True)))


def _joined(schema, parts, n_rows: int):
    """``parts`` ((rows, table or None), in order) as one table with every column of ``schema``
    (nulls where a part has no value; values cast to the column's type)."""
    pa = pyarrow()
    columns = []
    for field in schema:
        chunks = []
        for n, table in parts:
            if not n:
                continue
            if table is None or field.name not in table.column_names:
                chunks.append(pa.nulls(n, field.type))
                continue
            column = table.column(field.name)
            chunks.extend(c.cast(field.type) if c.type != field.type else c for c in column.chunks)
        columns.append(pa.chunked_array(chunks, type=field.type))
    if not columns:
        return pa.table({}).append_column("_", pa.nulls(n_rows)).drop_columns(["_"])
    return pa.Table.from_arrays(columns, schema=schema)


def table_bytes(table) -> bytes:
    """A table as Arrow IPC stream bytes (a write's part; Arrow reads it back without parsing)."""
    pa = pyarrow()
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def table_from_bytes(raw: bytes):
    pa = pyarrow()
    return pa.ipc.open_stream(pa.py_buffer(raw)).read_all()
