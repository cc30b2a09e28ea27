"""Item metadata for a store: checked before any write, typed the same way in every store.

A store keeps, per item, a record of scalar values. Accepted value types (per key, one type for
every item; ``None`` anywhere): ``int`` (64-bit), ``float`` (finite), ``bool``, ``str`` and a
list of ``str``. A key holding ints and floats is a float column (as pyarrow infers it), so
``1`` comes back as ``1.0``. Nested values (dicts, lists of numbers), bytes, NaN/inf, text with
a NUL or a lone surrogate, and keys that are not plain names are refused, naming the key and
the first item, before anything is written; the same rules hold for every store, so a value
reads back identically whichever store holds it. Reserved keys: ``id`` (search rows carry the
item id under it), the stores' vector columns, Chroma's ``chroma:document`` and anything
starting with ``__hubless`` (hubless's own payload keys). Keys hold no ``.`` (a path in
LanceDB and Qdrant), no backtick (LanceDB cannot address such a column), no control
character and no leading ``$`` or ``#`` (Chroma's operators).
"""

from __future__ import annotations

import math
import numbers
import re

import numpy as np

from hubless.errors import InvalidInput

__all__ = ["COLUMN_TYPES", "RESERVED", "RESERVED_PREFIX", "normalize_metadata", "restore_value"]

#: Column types a store records for its metadata keys.
COLUMN_TYPES = ("int", "float", "bool", "string", "list<string>", "null")
#: Keys no metadata may use: the item id in search rows, and the stores' own columns.
RESERVED = frozenset({"id", "vector", "plain", "corrected", "chroma:document"})
#: Keys starting with this are hubless's own (e.g. the exact floats of a Qdrant payload).
RESERVED_PREFIX = "__hubless"
KEY_RULE = re.compile(r"[^\x00-\x1f.$#`][^\x00-\x1f.`]{0,254}")
INT64 = (-(2**63), 2**63 - 1)


def _kind(value, key: str, item: int) -> str:
    """The column type of one value (checking it)."""
    if value is None:
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, numbers.Integral):
        if not INT64[0] <= int(value) <= INT64[1]:
            raise InvalidInput(f"metadata {key!r} of item {item} is an integer out of the 64-bit range ({value}): store it as text")
        return "int"
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise InvalidInput(f"metadata {key!r} of item {item} is {value}: stores keep finite numbers only; use null (None) instead")
        return "float"
    if isinstance(value, str):
        _check_text(value, key, item)
        return "string"
    if isinstance(value, (list, tuple)):
        for v in value:
            if not isinstance(v, str):
                raise InvalidInput(
                    f"metadata {key!r} of item {item} is a list holding {type(v).__name__} {v!r}: lists may hold text only "
                    "(store nested values as a JSON string)"
                )
            _check_text(v, key, item)
        return "list<string>"
    raise InvalidInput(
        f"metadata {key!r} of item {item} is {type(value).__name__} {_short(value)}: stores keep int, float, bool, text, "
        "a list of text or None (store nested values as a JSON string)"
    )


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_text(text: str, key: str, item: int) -> None:
    if "\x00" in text:
        raise InvalidInput(f"metadata {key!r} of item {item} holds a NUL character: remove it (PostgreSQL and JSON stores cannot keep it)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(
            f"metadata {key!r} of item {item} is not valid Unicode text ({_short(text)}): fix or drop it and export again"
        ) from None


def _check_key(key, item: int) -> None:
    if not isinstance(key, str):
        raise InvalidInput(f"metadata key {key!r} of item {item} is a {type(key).__name__}: keys must be text")
    if key in RESERVED or key.startswith(RESERVED_PREFIX):
        raise InvalidInput(
            f"metadata key {key!r} (item {item}) is reserved by the stores ({', '.join(sorted(RESERVED))}, {RESERVED_PREFIX}...): rename it"
        )
    if not KEY_RULE.fullmatch(key):
        raise InvalidInput(
            f"metadata key {key!r} (item {item}): use 1-255 characters without '.', '`', control characters or a leading '$' or '#'"
        )


def normalize_metadata(records, n: int) -> tuple[list[dict] | None, dict[str, str]]:
    """(records with plain Python values, {key: column type}) for ``n`` items, or
    (None, {}) without metadata. Raises InvalidInput naming the key and item on anything a
    store could not keep identically (see the module docstring)."""
    if records is None:
        return None, {}
    records = list(records)
    if len(records) != n:
        raise InvalidInput(f"metadata has {len(records)} records for {n} items")
    columns: dict[str, str] = {}
    first: dict[str, int] = {}
    for i, record in enumerate(records):
        if record is None:
            continue
        if not isinstance(record, dict):
            raise InvalidInput(f"metadata of item {i} is a {type(record).__name__}: records must be dicts")
        for key, value in record.items():
            _check_key(key, i)
            kind = _kind(value, key, i)
            have = columns.get(key)
            if have is None or have == "null":
                columns[key] = kind
                first.setdefault(key, i)
            elif kind != "null" and kind != have:
                if {kind, have} == {"int", "float"}:
                    columns[key] = "float"
                else:
                    raise InvalidInput(
                        f"metadata {key!r} holds {have} (item {first[key]}) and {kind} (item {i}): one type per key "
                        "(ints and floats mix as float)"
                    )
    out = [{k: _plain(v, columns[k]) for k, v in (r or {}).items()} for r in records]
    return out, dict(sorted(columns.items()))


def _plain(value, kind: str):
    if value is None:
        return None
    if kind == "float":
        return float(value)
    if kind == "int":
        return int(value)
    if kind == "bool":
        return bool(value)
    if kind == "list<string>":
        return [str(v) for v in value]
    return str(value)


def restore_value(value, kind: str):
    """A value read back from a store, as the column type says (JSON stores may return 1 for
    1.0; Chroma omits None; a float column stays float)."""
    if value is None or kind == "null":
        return None
    return _plain(value, kind)
