"""Store URIs and the table metadata every store keeps (format version, spec, model, dims)."""

from __future__ import annotations

from dataclasses import dataclass

FORMAT_VERSION = 1
SCHEMES = ("lancedb",)


@dataclass(frozen=True)
class StoreURI:
    """``lancedb://path/table``: scheme, location (directory) and table name."""

    scheme: str
    location: str
    table: str


def parse_uri(uri: str) -> StoreURI:
    """Split a store URI; one clear ValueError for anything else."""
    scheme, sep, rest = str(uri).partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(f"not a store URI: {uri!r} (expected one of {', '.join(s + '://path/table' for s in SCHEMES)})")
    location, slash, table = rest.rstrip("/").rpartition("/")
    if not slash or not table or not location:
        raise ValueError(f"store URI {uri!r} needs a location and a table name: {scheme}://path/table")
    return StoreURI(scheme, location, table)


def is_store_uri(text: str) -> bool:
    return any(str(text).startswith(s + "://") for s in SCHEMES)
