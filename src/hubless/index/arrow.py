"""pyarrow for item metadata: imported when first needed (a clear error naming the extra that
installs it), and its types named as messages about metadata show them."""

from __future__ import annotations

from hubless.errors import optional_import

__all__ = ["describe", "pyarrow"]


def pyarrow():
    """pyarrow, or a clear error naming the extra that installs it."""
    return optional_import("pyarrow", "item metadata", "index")


def describe(t) -> str:
    """A pyarrow type as messages name it: "int64 (int)", "list<string> (list of str)", ..."""
    pa = pyarrow()
    names = {pa.int64(): "int64 (int)", pa.float64(): "float64 (float)", pa.string(): "string (str)", pa.bool_(): "bool", pa.null(): "null"}
    if t in names:
        return names[t]
    if pa.types.is_list(t) and t.value_type in names:
        return f"list<{t.value_type}> (list of {names[t.value_type].split(' (')[-1].rstrip(')')})"
    return str(t)
