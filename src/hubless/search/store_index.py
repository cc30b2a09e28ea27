"""A store written by ``hubless export`` served by :class:`~hubless.search.Searcher` as an index
is: :class:`StoreIndex`, read only.

A store URI (any scheme registered in :mod:`hubless.export.base`: ``lancedb://``,
``postgresql://``, ``qdrant://``, ``qdrant+http://``, ``milvus://``, ``chroma://``) given where an
index is expected is opened as a :class:`StoreIndex` (:func:`as_store`). It is a thin layer over
:mod:`hubless.export.api`: its search is :func:`hubless.export.search` (the store's corrected
search, ``row . [q, -W(q)] = r.q - W(q) bias(r)`` ranked by the store's own engine and answered
with the method's scores, as :meth:`hubless.Index.search`; DESIGN.md, NNN/QB-Norm/DBNorm papers),
``compare`` is the store's plain search (``corrected=False``: the ranking by ``r.q``, the weight-0
query), the hits' metadata is the store's payload, and the description is
:func:`hubless.export.describe` (:class:`~hubless.export.info.StoreInfo`), read at open and again
at most once a second (:data:`REFRESH_SECONDS`) when the service reads the index.

A store URI may hold credentials (``postgresql://user:password@host/db/table``): it is kept here
and never shown. What is shown (:attr:`StoreIndex.public_name`, :meth:`StoreIndex.info`, every
error message of a store call) names the scheme and the table or collection only.

Refused, naming why: writes (a store is written by ``hubless export`` / ``--sync`` from its index:
:class:`~hubless.errors.Conflict`, HTTP 409), versions, metadata filters, reranking, ``rescore``
and item queries (the store is not read item by item here) (:class:`~hubless.errors.InvalidInput`,
HTTP 422).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from hubless.errors import Conflict, HublessError, InvalidInput
from hubless.hits import Hits

__all__ = ["REFRESH_SECONDS", "StoreIndex", "as_store", "search_store"]

#: A served store's description is read again at most this often (seconds).
REFRESH_SECONDS = 1.0


class StoreIndex:
    """A store written by :func:`hubless.export.export`, seen as a served, read-only index: what
    :class:`Searcher` and the service read of an index (size, method, weight, dimension, model,
    description), its search :func:`hubless.export.search`. Open one on a store URI."""

    read_only = True
    #: item ids are not looked up one by one in a store here: no "item" queries, no GET /items
    item_queries = False
    factory = None
    metadata_schema = None  # records come with the hits (the store's payload), not by id
    query_bank = None
    gallery_bank = None
    keep_versions = 0

    def __init__(self, uri: str, *, show_location: bool = False) -> None:
        from hubless.export.base import parse_uri, without_password

        if not isinstance(uri, str):
            raise InvalidInput(f"a store is named by its URI as a string; got {type(uri).__name__}")
        parsed = parse_uri(uri)  # a known scheme and a valid table name
        self._uri = uri  # may hold credentials: never shown
        self._uri_shown = without_password(uri)
        #: errors name the store's location (credentials removed): for the person who typed the URI
        #: (the CLI), not for clients of a server (the service shows the scheme and table only)
        self.show_location = bool(show_location)
        given = {uri, str(parsed.location)}  # as given, and as messages write them (without a password)
        self._secrets = tuple(s for s in given | {without_password(s) for s in given} if len(s) > 3)
        self.scheme, self.table = parsed.scheme, parsed.table
        self._lock = threading.Lock()
        self._state = self._read()

    @classmethod
    def open(cls, uri: str, *, show_location: bool = False) -> StoreIndex:
        """The store ``uri`` names, its description read (:class:`~hubless.errors.NotFound` when
        there is no table, :class:`~hubless.errors.InvalidInput` for one hubless did not write)."""
        return cls(uri, show_location=show_location)

    def __repr__(self) -> str:
        return f"StoreIndex({self.public_name!r})"

    @property
    def public_name(self) -> str:
        """The store as it may be shown: its scheme and table, never its location or credentials."""
        return f"{self.scheme}://.../{self.table}"

    @property
    def shown_uri(self) -> str:
        """The URI as given with any credentials (``user:password@``) removed: what a command
        line tool may print (a local path helps; a password never shows)."""
        from hubless.export.base import hide_credentials

        return hide_credentials(self._uri)

    @property
    def read_only_reason(self) -> str:
        return (
            f"{self.public_name} is a store written by hubless export, served read only: change the index it was "
            "exported from, then run hubless export --sync (hubless.export.sync) or export it again"
        )

    # ------------------------------------------------------------------ the description
    def _read(self) -> tuple[Any, Any, float]:
        import hubless.export
        from hubless.corrections import make_additive

        with self.shown():
            info = hubless.export.describe(self._uri)
            return info, make_additive(info.spec), time.monotonic()

    def snapshot(self) -> StoreIndex:
        return self

    def refresh(self) -> None:
        """Read the description again when the last read is older than :data:`REFRESH_SECONDS`
        (a store re-exported or synced elsewhere); a store that cannot be read now keeps the
        description it had (its search says what is wrong)."""
        if time.monotonic() - self._state[2] < REFRESH_SECONDS or not self._lock.acquire(blocking=False):
            return
        try:
            self._state = self._read()
        except HublessError:
            self._state = (*self._state[:2], time.monotonic())
        finally:
            self._lock.release()

    def describe(self):
        """The store's :class:`~hubless.export.info.StoreInfo` (as last read)."""
        return self._state[0]

    @property
    def ntotal(self) -> int:
        return self._state[0].n_items

    @property
    def method(self) -> str:
        return self._state[0].spec

    @property
    def model(self) -> str | None:
        return self._state[0].model

    @property
    def format_version(self) -> int:
        return self._state[0].format_version

    @property
    def weight_param(self) -> str | None:
        return self._state[1].weight_param

    @property
    def weight(self) -> float | None:
        name = self.weight_param
        return None if name is None else float(getattr(self._state[1], name))

    @property
    def has_metadata(self) -> bool:
        return bool(self._state[0].metadata_columns)

    def info(self) -> dict:
        """The index-like description: ``kind`` "store", its ``store`` scheme and ``table`` (never
        its location), method, dimension, size, metadata columns and ANN index."""
        info, corr, _ = self._state
        ann = info.ann or {}
        return {
            "kind": "store",
            "store": self.scheme,
            "table": self.table,
            "method": info.spec,
            "dim": info.dim,
            "normalize": bool(corr.normalize),
            "n_items": info.n_items,
            "metadata_columns": sorted(info.metadata_columns),
            "ann": ann.get("type"),
            "knob": ann.get("knob"),
            "knob_default": ann.get("default"),
        }

    # ------------------------------------------------------------------ searching
    def search(self, queries, top_k: int, **options) -> Hits:
        """:func:`hubless.export.search`, corrected: :class:`~hubless.Hits` with the store's
        payload of each hit in ``metadata``."""
        import hubless.export

        with self.shown():
            return hubless.export.search(self._uri, queries, top_k, **options)

    def search_uncorrected(self, queries, top_k: int, **knobs) -> Hits:
        """The store's plain search (``corrected=False``: ranked by r.q, the weight-0 query)."""
        return self.search(queries, top_k, corrected=False, **knobs)

    def __contains__(self, item_id) -> bool:
        raise InvalidInput(
            f"{self.public_name} is a store: its items are not read one by one here (no item queries, no item lookups); "
            "search it with embeddings, texts or images: each hit carries the store's metadata"
        )

    def get(self, ids):
        return self.__contains__(ids)

    def _refuse(self, *args, **kwargs):
        raise Conflict(self.read_only_reason)

    add = upsert = remove = delete = update_metadata = add_query_bank = add_bank = restore = _refuse

    @contextlib.contextmanager
    def shown(self) -> Iterator[None]:
        """Errors of the store calls inside, with the store's URI (and any ``user:password@``)
        replaced by :attr:`public_name`: nothing shown holds the location or credentials."""
        try:
            yield
        except HublessError as exc:
            exc.args = tuple(self.hide(a) if isinstance(a, str) else a for a in exc.args)
            raise exc from None

    def hide(self, text: str) -> str:
        """``text`` without the store's credentials, and (unless :attr:`show_location`) without
        its location: the URI becomes :attr:`public_name`, the location "..."."""
        if not self.show_location:
            for secret in sorted(self._secrets, key=len, reverse=True):
                text = text.replace(secret, self.public_name if secret in (self._uri, self._uri_shown) else "...")
        from hubless.export.base import hide_credentials

        return hide_credentials(text)


def as_store(value, *, show_location: bool = False) -> StoreIndex | None:
    """``value`` as a served store when it is one (a store URI string or a StoreIndex), else None
    (``show_location``: see :class:`StoreIndex`)."""
    from hubless.export.base import is_store_uri

    if isinstance(value, StoreIndex):
        return value
    if isinstance(value, str) and is_store_uri(value):
        return StoreIndex.open(value, show_location=show_location)
    return None


def search_store(fields: dict, current: StoreIndex, vectors, top_k: int, options: dict, *, compare: bool, rerank: bool) -> Hits:
    """:meth:`Searcher.search` on a store: :func:`hubless.export.search` (corrected, with the
    weight and the store's knob ``nprobe`` / ``ef_search`` when given), the store's plain search
    for ``compare``, the store's payloads as metadata; ``fields``: the result's ``index``,
    ``method`` and ``queries``."""
    for given, what in ((rerank, "reranking"), ("where" in options, "filtering by metadata (where)"), ("rescore" in options, "rescore")):
        if given:
            raise InvalidInput(f"{fields['index']!r} is a store: {what} is not offered on it (the store ranks with its own engine)")
    found = current.search(vectors, top_k, **options)
    hits = Hits(found.scores, found.ids, found.found)
    metadata = dict(found.metadata or {})
    if compare:
        knobs = {k: v for k, v in options.items() if k != "weight"}
        plain = current.search_uncorrected(vectors, top_k, **knobs)
        hits = hits.with_fields(uncorrected=Hits(plain.scores, plain.ids, plain.found))
        metadata.update(plain.metadata or {})
    return hits.with_fields(metadata=metadata if current.has_metadata else None, **fields)
