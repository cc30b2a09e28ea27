"""Store URIs and the table metadata every store keeps (format version, spec, model, dims)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from hubless.errors import InvalidInput

FORMAT_VERSION = 1
#: scheme -> the form of its URI.
SCHEMES = {
    "lancedb": "lancedb://path/table",
    "postgresql": "postgresql://user:password@host:port/database/table",
    "postgres": "postgres://user:password@host:port/database/table",
    "qdrant": "qdrant://path/collection",
    "qdrant+http": "qdrant+http://host:port/collection",
    "qdrant+https": "qdrant+https://host:port/collection",
}


@dataclass(frozen=True)
class StoreURI:
    """A store: its scheme, location (a directory, or a PostgreSQL connection URI) and table."""

    scheme: str
    location: str
    table: str


def parse_uri(uri: str) -> StoreURI:
    """Split a store URI; one clear ValueError for anything else."""
    scheme, sep, rest = str(uri).partition("://")
    if not sep or scheme not in SCHEMES:
        raise InvalidInput(f"not a store URI: {uri!r} (expected one of {', '.join(SCHEMES.values())})")
    if scheme in ("postgresql", "postgres"):  # the table is the last path segment; the rest is libpq's URI
        parts = urlsplit(str(uri))
        database, slash, table = parts.path.rstrip("/").rpartition("/")
        if not slash or not table or not database:
            raise InvalidInput(f"store URI {uri!r} needs a database and a table: {SCHEMES[scheme]}")
        return StoreURI(scheme, urlunsplit((parts.scheme, parts.netloc, database, parts.query, "")), table)
    location, slash, table = rest.rstrip("/").rpartition("/")
    if not slash or not table or not location:
        raise InvalidInput(f"store URI {uri!r} needs a location and a table name: {SCHEMES[scheme]}")
    if scheme.startswith("qdrant+"):  # the server's URL
        location = f"{scheme[len('qdrant+') :]}://{location}"
    return StoreURI(scheme, location, table)


def is_store_uri(text: str) -> bool:
    return any(str(text).startswith(s + "://") for s in SCHEMES)


def directory_lock(location: str, table: str):
    """The writer lock of a store kept in a local directory (LanceDB, Qdrant in-process):
    ``.<table>.lock`` in ``location``, the same ``fcntl`` lock as a saved index's
    (:func:`hubless.index.lock.write_lock`; waits ``HUBLESS_LOCK_TIMEOUT`` s, released on exit)."""
    from hubless.index.lock import write_lock

    return write_lock(Path(location) / table)
