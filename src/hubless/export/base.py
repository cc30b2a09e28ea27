"""The store contract: :class:`VectorStore`, its registry by URI scheme, and the URI rules every store shares.

A store holds, per gallery item, the augmented vector [r, bias(r)] (searched by inner product,
never cosine: normalising [r, bias] would break the correction), the plain r and the item's
metadata, plus the hubless ``info`` (format version, spec, query state, model, dims, metadata
columns, the ANN index and its measured recall curve). Queries are [q, -W(q)], so
``row . query = r.q - W(q) bias(r)``, the additive correction's ranking score (DESIGN.md;
NNN/QB-Norm/DBNorm papers).

A backend is one module defining a subclass of :class:`VectorStore` decorated with
:func:`register`: its URI schemes, its typed export options (a dataclass), its ANN types and
the search knob each uses, and a handful of primitives (write a table and switch to it, read
and write the info, query, read rows, apply changes, drop, clean leftovers). Everything else
(validation before any write, the correction's queries and scores, sync, recall calibration)
is done here once, the same for every store, and ``tests/export/test_store_contract.py`` runs the
same suite on every registered store. The rows a store holds and the sync's diff are in
:mod:`hubless.export.store_rows`, the checks of export and search options in
:mod:`hubless.export.store_options`.

One knob name per concept, across stores and as in :meth:`hubless.Index.search`:
``nprobe`` (IVF partitions probed per query: LanceDB's ``nprobes``, Milvus's ``nprobe``) and
``ef_search`` (HNSW candidates kept per query: pgvector's ``hnsw.ef_search``, Qdrant's
``hnsw_ef``, Milvus's ``ef``, Chroma's result depth).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from hubless._registry import Registry
from hubless.errors import AlreadyExists, Busy, InvalidInput, InvalidType
from hubless.export.info import StoreInfo
from hubless.export.store_hits import StoreHits, store_hits
from hubless.export.store_options import NoOptions, check_options, make_options, options_dict
from hubless.export.store_rows import Rows, diff_rows, index_rows, typed_rows

__all__ = [
    "FORMAT_VERSION",
    "KNOBS",
    "StoreURI",
    "StoreUnavailable",
    "VectorStore",
    "hide_credentials",
    "is_store_uri",
    "open_store",
    "parse_uri",
    "register",
    "registered",
    "without_password",
]

FORMAT_VERSION = 1
#: The search knobs: one name per concept, whatever the store calls it.
KNOBS = {
    "nprobe": "IVF partitions probed per query",
    "ef_search": "HNSW candidates kept per query (the beam)",
}
#: Table / collection names: the same rule for every store (PostgreSQL's identifier length).
NAME_RULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
NAME_HELP = "letters, digits and underscores, starting with a letter or underscore, at most 63 characters"
#: Items the knob is calibrated on: a sample of the index's query bank (never test queries).
CALIBRATION_QUERIES = 200


class StoreUnavailable(Busy, ConnectionError):
    """A store's server did not answer, or an embedded store is open in another process."""


class StaleRead(Exception):
    """The table a search pinned was replaced and removed by exports meanwhile (retried)."""


#: Extra rows asked of a store beyond top_k, so that items tied with the k-th (duplicate
#: embeddings) are all seen and the lower ids win, as in hubless.
TIE_MARGIN = 8


@dataclass(frozen=True)
class StoreURI:
    """A store: its scheme, location (a directory, a database URI, a server URL) and table."""

    scheme: str
    location: str
    table: str
    text: str = dataclasses.field(default="", compare=False, repr=False)  # the URI as given

    def __str__(self) -> str:
        return self.text or f"{self.scheme}://{self.location}/{self.table}"


# ---------------------------------------------------------------------------------- registry
#: URI scheme -> store class. Every module of :mod:`hubless.export` is imported on the first
#: look-up, so each store registers itself (a new store is one file in this package); backends
#: import their database client lazily.
STORES: Registry[type[VectorStore]] = Registry("store URI scheme", "hubless.export", names_of=lambda cls: tuple(cls.schemes))

#: Class decorator: make a store class the store of its URI ``schemes``.
register = STORES.register


def registered() -> dict[str, type[VectorStore]]:
    """scheme -> store class, every registered store."""
    return dict(STORES)


def parse_uri(uri: str) -> StoreURI:
    """Split a store URI (checked: a known scheme, a location, a valid table name)."""
    return dataclasses.replace(_store_class(uri).parse(str(uri)), text=str(uri))


def _store_class(uri: str) -> type[VectorStore]:
    if not isinstance(uri, (str, Path)):
        raise InvalidType(f"a store URI must be a string; got {type(uri).__name__}")
    scheme, sep, _ = str(uri).partition("://")
    stores = STORES
    if not sep or scheme not in stores:
        forms = ", ".join(dict.fromkeys(c.uri_form(s) for s, c in stores.items()))
        raise InvalidInput(f"not a store URI: {str(uri)!r} (expected one of {forms})")
    return stores[scheme]


def open_store(uri: str) -> VectorStore:
    """The store a URI names (nothing is written or connected yet)."""
    return _store_class(uri)(parse_uri(uri))


def is_store_uri(text: str) -> bool:
    scheme, sep, _ = str(text).partition("://")
    return bool(sep) and scheme in registered()


#: The user-info part of a URL (``//user:password@``).
_USERINFO = re.compile(r"//[^/@\s'\"]*@")
#: The password of a URI's user info (``scheme://user:password@``, right after the scheme:
#: group 1 is ``scheme://user``), never a part of a local path.
_USERINFO_PASSWORD = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#@:\s]*):[^/?#@\s]*@")
#: A password given as a URI parameter (``?password=...``).
_PASSWORD_PARAM = re.compile(r"([?&]password=)[^&\s'\"]*", re.IGNORECASE)


def hide_credentials(text: str) -> str:
    """``text`` (a message, a URI) as anyone may see it: every URL's user info
    (``//user:password@``) removed and every ``password=`` parameter's value replaced by "...".
    What a served store and its errors show (:mod:`hubless.search.store_index`)."""
    return _PASSWORD_PARAM.sub(r"\1...", _USERINFO.sub("//", str(text)))


def without_password(uri: str) -> str:
    """``uri`` as it may be written down (a sidecar) or shown to its owner: ``//user:password@``
    becomes ``//user@`` and a ``password=`` parameter is dropped; the rest (user, host, options)
    is kept. Opened again, the client library finds the password where it looks when a URI has
    none (libpq: the ``PGPASSWORD`` variable, then ``~/.pgpass``). A path without a scheme (a
    FAISS file) is kept as it is."""
    if "://" not in str(uri):
        return str(uri)
    base, sep, query = _USERINFO_PASSWORD.sub(r"\1@", str(uri)).partition("?")
    kept = [p for p in query.split("&") if p and p.partition("=")[0].lower() != "password"]
    return base + (sep + "&".join(kept) if kept else "")


def check_name(name: str, uri: str) -> str:
    if not NAME_RULE.fullmatch(name):
        raise InvalidInput(f"table name {name!r} in {uri}: use {NAME_HELP}")
    return name


def split_location(uri: str, scheme: str, form: str) -> tuple[str, str]:
    """``scheme://location/table`` -> (location, table), both checked."""
    rest = uri.partition("://")[2]
    location, slash, table = rest.rstrip("/").rpartition("/")
    if not slash or not table or not location:
        raise InvalidInput(f"store URI {uri!r} needs a location and a table name: {form}")
    return location, check_name(table, uri)


def directory_lock(location: str, table: str):
    """The writer lock of a store kept in a local directory: ``.<table>.lock`` inside
    ``location`` (resolved; there while held), the same ``fcntl`` lock as a saved index's
    (:func:`hubless.index.lock.write_lock`: waits ``HUBLESS_LOCK_TIMEOUT`` s, released on exit,
    also on kill -9), taken once the name has been checked."""
    from hubless.index.lock import write_lock

    return write_lock(location, create=True, name=f".{table}.lock")


# ---------------------------------------------------------------------------------- the contract
class VectorStore(abc.ABC):
    """One store (one table or collection) that hubless exports to and searches.

    Public operations, the same for every store: :meth:`export`, :meth:`sync`, :meth:`search`,
    :meth:`describe`, :meth:`drop`. A backend sets the class attributes and implements the
    primitives below; it must pass ``tests/export/test_store_contract.py``.
    """

    #: URI schemes this store serves (the first is the canonical one).
    schemes: ClassVar[tuple[str, ...]] = ()
    #: Human name ("LanceDB").
    label: ClassVar[str] = ""
    #: The pip extra that installs its client.
    extra: ClassVar[str] = ""
    #: ANN type -> the knob that sets its search breadth ("nprobe" or "ef_search").
    ann_types: ClassVar[dict[str, str]] = {}
    #: knob -> (default, largest useful value) of this store.
    knob_range: ClassVar[dict[str, tuple[int, int]]] = {}
    #: Search options of this store beyond the knob (name -> help).
    search_options: ClassVar[dict[str, str]] = {}
    #: Export options (a frozen dataclass; unknown names are refused naming the valid ones).
    Options: ClassVar[type] = NoOptions
    #: How many processes may open the store at once, when the engine limits it (stated in errors).
    process_limit: ClassVar[str | None] = None

    def __init__(self, uri: StoreURI) -> None:
        self.uri = uri
        self.location, self.table = uri.location, uri.table

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.uri)!r})"

    @classmethod
    def uri_form(cls, scheme: str | None = None) -> str:
        return f"{scheme or cls.schemes[0]}://path/table"

    @classmethod
    def parse(cls, uri: str) -> StoreURI:
        """``scheme://location/table``; a backend with another form overrides this."""
        scheme = uri.partition("://")[0]
        location, table = split_location(uri, scheme, cls.uri_form(scheme))
        return StoreURI(scheme, location, table)

    # ------------------------------------------------------------------ primitives (per store)
    @abc.abstractmethod
    def writer_lock(self):
        """A context manager: one export or sync of this table at a time (across processes)."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """Whether the table exists (written by hubless or not)."""

    @abc.abstractmethod
    def write_table(self, rows: Rows, info: dict, options, *, batch: int, ann: str | None) -> None:
        """Write every row into a new table (with ``ann``'s index when given), then make it the
        one ``self.table`` names in one atomic step: readers see the old or the new table,
        never a mix, and a failure or kill before the switch leaves the old one intact."""

    @abc.abstractmethod
    def clean_leftovers(self) -> None:
        """Remove what a killed or failed export left (temp tables, unswitched versions) and
        versions older than the previous one; called under the writer lock before an export."""

    @abc.abstractmethod
    def read_info(self) -> dict:
        """The hubless info of the current table (NotFound when there is none; InvalidInput
        when the table was not written by hubless)."""

    @abc.abstractmethod
    def write_info(self, info: dict) -> None:
        """Replace the info of the current table."""

    @abc.abstractmethod
    def query(self, vectors: np.ndarray, k: int, *, column: str, exact: bool, knobs: dict) -> tuple[np.ndarray, np.ndarray, list]:
        """Top-k by inner product of ``vectors`` against ``column`` ("vector" = [r, bias(r)],
        "plain" = r): (scores, ids, rows of {"id", metadata...}); empty slots are id -1, score
        -inf; ties go to the lower id. ``knobs``: the store's native search settings."""

    @abc.abstractmethod
    def read_rows(self) -> tuple[np.ndarray, np.ndarray, list | None]:
        """(ids, [r, bias] rows, metadata rows) of every stored item, sorted by id."""

    @abc.abstractmethod
    def apply_changes(self, rows: Rows, removed: np.ndarray, info: dict) -> None:
        """Upsert ``rows`` (by id), delete ids ``removed`` and set ``info``."""

    @abc.abstractmethod
    def drop_table(self) -> bool:
        """Remove the table and everything hubless wrote for it; False when there was none."""

    def reading(self):
        """A context manager under which :meth:`read_info` and :meth:`query` see one and the same
        table, even if an export switches to a new one meanwhile (a store pins its current
        table, version or collection here). A pinned table that an export removed meanwhile is
        reported as :class:`StaleRead`, and the search is run again."""
        return contextlib.nullcontext()

    def changing(self):
        """A context manager around a sync's reads and changes (under the writer lock): a store
        pins its current table here (so the info, the rows read and the changes are one table's
        even if another writer switches tables meanwhile), and a store whose engine another
        process may hold open changes a copy here and switches to it."""
        return contextlib.nullcontext()

    def release(self) -> None:
        """Close what this process keeps open for the store (an embedded engine that serves one
        process at a time: Qdrant in-process, Milvus Lite), so another process can open it."""
        return None

    def native_knobs(self, knob: str, value: int, k: int, options: dict) -> dict:
        """The store's own search settings for the concept ``knob`` = ``value`` (plus its
        ``search_options``). Default: passed through under the concept's name."""
        return {knob: value, **options}

    def knob_limit(self, knob: str, info: dict) -> int:
        """The largest useful value of ``knob`` on this table (e.g. its number of partitions)."""
        return self.knob_range[knob][1]

    def layout(self, d: int, bias: int, ann: str | None, options) -> dict:
        """How [r, bias] is laid out in this store (padding etc.), kept in the info."""
        return {}

    # ------------------------------------------------------------------ the operations
    def export(
        self, index, *, overwrite: bool = False, batch: int = 8192, ann: str | None = None, target_recall=None, **options
    ) -> VectorStore:
        """Write ``index`` (every item: [r, bias(r)], r, metadata) as this table; ``ann``
        builds the store's ANN index, whose search knob is then measured on a sample of the
        index's query bank (recall@10 against the exact corrected top 10, never test queries)
        and the smallest value reaching ``target_recall`` becomes the default (the whole
        curve is kept in the info). Everything is checked before anything is written."""
        from hubless._validation import check_positive_int
        from hubless.corrections.serving import check_servable_as_rows
        from hubless.export.calibrate import check_target
        from hubless.export.metadata import normalize_metadata

        corr = index.correction
        check_servable_as_rows(corr)
        batch = check_positive_int(batch, "batch")
        ann = self._check_ann(ann)
        target = check_target(target_recall)
        if target is not None and ann is None:
            raise InvalidInput("target_recall needs an ANN index (ann=...): an exact store always has recall 1")
        if ann is not None and getattr(index, "query_bank", None) is None and target is not None:
            raise InvalidInput("target_recall is measured on the index's query bank, which this index does not keep (keep_banks=False)")
        opts = make_options(self.Options, options, self.label, ann)
        meta, columns = normalize_metadata(index.metadata, index.ntotal)
        rows = index_rows(index, meta)
        info = self._info(index, columns, ann, opts)
        with self.writer_lock():
            if self.exists() and not overwrite:
                raise AlreadyExists(f"{self.uri} exists: pass overwrite=True (--overwrite) to replace it")
            self.clean_leftovers()
            self.write_table(rows, info, opts, batch=batch, ann=ann)
            if ann is not None and getattr(index, "query_bank", None) is not None:
                from hubless.export.calibrate import measure_curve

                info["ann"].update(measure_curve(self, index, info, target))
                self.write_info(info)
        return self

    def sync(self, index) -> dict:
        """Bring this table up to date with ``index`` (after add/remove, grown banks): rows whose
        [r, bias(r)] or metadata changed or that are new are written, rows of removed items are
        deleted, nothing else is touched; the result equals a fresh export. A table of another
        correction or dimension is refused. Returns ``{"written", "removed", "unchanged"}``."""
        from hubless.corrections.serving import check_servable_as_rows
        from hubless.export.metadata import normalize_metadata

        corr = index.correction
        check_servable_as_rows(corr)
        meta, columns = normalize_metadata(index.metadata, index.ntotal)
        with self.writer_lock(), self.changing():  # the info, the rows read and the changes: one table
            info = self.read_info()
            new_info = self._info(index, columns, (info.get("ann") or {}).get("type"), None)
            if (info.get("spec"), info.get("dim"), info.get("bias_columns")) != (corr.spec, new_info["dim"], new_info["bias_columns"]):
                raise InvalidInput(
                    f"{self.uri} holds {info.get('spec')} ({info.get('dim')}-d); the index is {corr.spec} ({new_info['dim']}-d): "
                    "export it again with overwrite=True (--overwrite) instead of syncing"
                )
            new_info["ann"], new_info["layout"] = info.get("ann"), info.get("layout", {})
            rows = index_rows(index, meta)
            stored_ids, stored, stored_meta = self.read_rows()
            changed, removed = diff_rows(rows, stored_ids, stored, stored_meta, info.get("metadata_columns"), columns)
            self.apply_changes(rows.slice(0, 0) if not changed.size else rows.take(changed), removed, new_info)
        return {"written": int(changed.size), "removed": int(removed.size), "unchanged": int(len(rows) - changed.size)}

    def describe(self) -> StoreInfo:
        """The hubless info kept with the table: format version, spec, model, metric, dims,
        number of items, query state, metadata columns, ANN index with its measured curve
        (:class:`hubless.export.info.StoreInfo`: typed, and read as the dict it was)."""
        return StoreInfo(self.read_info())

    def drop(self) -> bool:
        """Remove the table (and every version, temp table and pointer hubless wrote for it)."""
        with self.writer_lock():
            return self.drop_table()

    def search(self, queries, top_k: int = 10, *, corrected: bool = True, exact: bool = False, target_recall=None, **options) -> StoreHits:
        """Top-k as :class:`~hubless.Hits` (the method's scores as ``Index.search``; each hit's
        payload in ``metadata``, by id; see :mod:`hubless.export.store_hits` for the old triple).

        ``options``: the correction's weight (``weight=``, a scalar or one per query), the search
        knob (``nprobe`` or ``ef_search``, whichever the store's ANN index uses) and the store's
        own search options; anything else is refused naming the valid ones. ``target_recall``
        picks the knob from the curve measured at export. ``exact`` scans every row instead of
        using the ANN index. A ``top_k`` beyond the store's items keeps the width: the slots past
        them come last, not found (id -1, score -inf: the one top-k rule, ``check_top_k``).
        """
        for name, flag in (("corrected", corrected), ("exact", exact)):
            if not isinstance(flag, (bool, np.bool_)):
                raise InvalidType(f"{name} must be True or False; got {flag!r}")
        for attempt in range(3):
            try:
                with self.reading():
                    return self._search(queries, top_k, corrected, exact, target_recall, dict(options))
            except StaleRead:
                if attempt == 2:
                    raise InvalidInput(f"{self.uri} was replaced by exports three times during one search; retry") from None
        raise AssertionError("unreachable")

    def _search(self, queries, top_k, corrected: bool, exact: bool, target_recall, options: dict):
        from hubless._validation import as_embeddings, check_positive_int, check_top_k, pad_top_k
        from hubless.corrections import make_additive
        from hubless.corrections.serving import check_servable_as_rows, weighted_query_rows
        from hubless.export.calibrate import check_target, knob_for_target

        check_positive_int(top_k, "top_k")  # a bad type is refused before the store is read
        info = self.read_info()
        if info.get("metric") != "dot":
            raise InvalidInput(f"store {self.uri} uses metric {info.get('metric')!r}: hubless needs dot (cosine would normalise [r, bias])")
        corr = make_additive(info["spec"]).for_queries(info.get("query_state", {}), int(info["dim"]), int(info["bias_columns"]))
        check_servable_as_rows(corr)
        n_items = int(info.get("n_items", 0))
        top_k = check_top_k(top_k, n_items, f"store {self.uri}")  # the one top-k rule: beyond the items, padded
        q = np.asarray(queries) if not isinstance(queries, np.ndarray) else queries
        if q.ndim == 2 and q.shape[1] != int(info["dim"]):
            raise InvalidInput(f"queries have dimension {q.shape[1]} but store {self.uri} holds {info['dim']}-d items")
        q = as_embeddings(q, "queries", normalize=corr.normalize, dim=int(info["dim"]))
        weight = {k: options.pop(k) for k in list(options) if k in (corr.weight_param, "weight")}
        ann = info.get("ann") or {}
        knob = ann.get("knob")
        allowed = {**({knob: KNOBS[knob]} if knob else {}), **(self.search_options if ann.get("type") else {})}
        if corr.weight_param:
            allowed[corr.weight_param] = allowed["weight"] = "the correction's weight for this search"
        check_options(f"{self.label} store {self.uri} ({info['spec']}, {ann.get('type') or 'exact'})", options, allowed, "search")
        target = check_target(target_recall)
        if target is not None and (exact or not knob):
            raise InvalidInput("target_recall applies to a search through an ANN index (not exact=True, not an exact store)")
        if target is not None and knob in options:
            raise InvalidInput(f"give target_recall or {knob}, not both")
        k = min(top_k, n_items) if n_items else top_k
        fetch = min(k + TIE_MARGIN, n_items) if n_items else k
        knobs = {}
        if knob and not exact:
            value = options.pop(knob, None)
            if target is not None:
                value = knob_for_target(ann, target)
            value = ann.get("default", self.knob_range[knob][0]) if value is None else check_positive_int(value, knob)
            knobs = self.native_knobs(knob, min(int(value), self.knob_limit(knob, info)), fetch, options)
        batch = corr.queries(q, **weight)
        if not corrected:
            scores, ids, rows = self.query(batch.vectors, fetch, column="plain", exact=exact, knobs=knobs)
        else:
            layout = info.get("layout", {})
            ranking, ids, rows = self.query(
                weighted_query_rows(corr, batch, int((layout or {}).get("pad", 0))), fetch, column="vector", exact=exact, knobs=knobs
            )
            found = ids >= 0
            scores = corr.method_scores(batch, np.where(found, ranking, 0).astype(np.float32))
            scores = np.where(found, scores, -np.inf).astype(np.float32)
        scores, ids, rows = scores[:, :k], ids[:, :k], [hits[:k] for hits in rows]
        rows = typed_rows(rows, info.get("metadata_columns"))
        scores, ids = pad_top_k(scores, ids, top_k)  # fewer items than asked: the rest is id -1, score -inf
        return store_hits(scores, ids, rows, metadata=bool(info.get("metadata_columns")))

    # ------------------------------------------------------------------ helpers
    def _check_ann(self, ann) -> str | None:
        if ann is None:
            return None
        if not isinstance(ann, str) or ann.upper() not in self.ann_types:
            valid = " or ".join(self.ann_types) or "none (this store searches exactly)"
            raise InvalidInput(f"unsupported {self.label} index {ann!r}; choose {valid}")
        return ann.upper()

    def _info(self, index, columns: dict, ann: str | None, options) -> dict:
        corr = index.correction
        info = {
            "format_version": FORMAT_VERSION,
            "spec": corr.spec,
            "model": index.model,
            "metric": "dot",
            "dim": int(corr.dim_),
            "bias_columns": int(corr.bias_columns_.shape[1]),
            "n_items": int(index.ntotal),
            "query_state": corr.query_state(),  # what W(q) and the method's scores read (DN's means, IS's bank size)
            "metadata_columns": columns,
            "layout": self.layout(int(corr.dim_), int(corr.bias_columns_.shape[1]), ann, options),
            "ann": None,
        }
        if ann is not None:
            knob = self.ann_types[ann]
            info["ann"] = {"type": ann, "knob": knob, "default": self.knob_range[knob][0], "options": options_dict(options)}
        return info
