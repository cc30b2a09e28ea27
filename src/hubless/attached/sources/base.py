"""What every plain collection a correction is attached to gives hubless (a FAISS index file or
a vector database collection that the user wrote: their ids, their vectors, their payloads),
and how one is opened by its address.

A :class:`Source` gives hubless four things, each in bounded batches and by the collection's own
ids: :meth:`Source.scan` ((ids, vectors) of every item), :meth:`Source.scan_ids` (ids only),
:meth:`Source.fetch` (the vectors of given ids) and :meth:`Source.search` (the store's own plain
top-k by inner product, through its ANN index when it has one). Nothing is written to the
collection, except a bias payload when the user asks for it (:meth:`Source.write_payload`,
``hubless attach --write-payload``). Every read is counted in :attr:`Source.bytes_read` (8 bytes
per id, 4 per float), so an update can show that it read only what changed.

Sources (:func:`open_source`; each kind in its own module of this package, registered by its
URI schemes in :data:`SOURCES`):

* ``path/to/index.faiss`` (or ``faiss://path/to/index.faiss``): a FAISS index file (:mod:`hubless.attached.sources.faiss`);
* ``lancedb://dir/table``: a LanceDB table (:mod:`hubless.attached.sources.lancedb`);
* ``qdrant://dir/collection`` (a shard of Qdrant's in-process engine) and
  ``qdrant+http://host:port/collection`` / ``qdrant+https`` (a Qdrant server's collection)
  (:mod:`hubless.attached.sources.qdrant`);
* ``postgresql://user@host:port/db/table``: a pgvector column (:mod:`hubless.attached.sources.pgvector`);
* ``chroma://path/collection``: an embedded Chroma collection with integer ids (:mod:`hubless.attached.sources.chroma`);
* ``milvus://path/file.db/collection``: a Milvus Lite collection (:mod:`hubless.attached.sources.milvus`).

Every source's count is checked before each search (a changed collection is refused); the
count is free for FAISS, LanceDB, Qdrant and Chroma, a ``count(*)`` for pgvector and Milvus.
A source that has a cheap mark of its content's version says so (:meth:`Source.version`: a FAISS
file's inode, size and modification time; a LanceDB table's version; a pgvector table's count and
the sum of its rows' ``xmin``), so that an open collection notices a write before it answers.

Ids: every id is an int64 (negative ones included); an id a collection holds that is not (a
Qdrant id above 2**63 - 1, a Chroma id that is not a whole number in the int64 range, a float
id column) is refused when it is read (:func:`as_ids`), before anything is written.

A collection whose distance is not an inner product (Euclidean) is refused: its ranking is not
the similarity the correction corrects.
"""

from __future__ import annotations

import abc
import hashlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hubless._registry import Registry
from hubless.errors import InvalidInput, NotFound
from hubless.hits import Hits

__all__ = [
    "BATCH",
    "BandFilter",
    "SAMPLE",
    "SOURCES",
    "Source",
    "as_ids",
    "open_source",
    "pad_hits",
    "relocate",
    "sample_hash",
    "sql_band",
    "field_names",
]

#: Items read per batch by default.
BATCH = 8192
#: Ids whose vectors make a collection's sample hash.
SAMPLE = 32
#: A payload field hubless writes: a plain identifier, valid in every store (a SQL column too).
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,59}")


@dataclass(frozen=True)
class BandFilter:
    """What a store needs to search one band: the items with some bias column ``c`` below
    ``edges[c]``. ``fields``: the payload fields (one per column) hubless wrote the biases to
    (None where none was written); ``members``: a function giving the band's ids, sorted (from
    the sidecar), for a store that filters by id (a FAISS file); ``key``: a hashable identity of
    the band, under which a store may keep the filter it built."""

    edges: tuple[float, ...]
    fields: tuple[str, ...] | None
    members: Callable[[], np.ndarray] = field(compare=False)
    key: tuple = ()


class Source(abc.ABC):
    """A plain collection (see the module docstring)."""

    #: Short name of the kind of collection ("faiss", "lancedb", "qdrant").
    kind: ClassVar[str] = ""
    #: The search knobs this collection takes (name -> help).
    knobs: ClassVar[dict[str, str]] = {}
    #: The URI schemes this kind of collection is opened by (none: a FAISS file, by its path).
    schemes: ClassVar[tuple[str, ...]] = ()
    #: The address form shown in messages ("lancedb://path/table").
    uri_form: ClassVar[str] = ""
    #: Whether the store ranks by cosine (then its vectors need not be unit length).
    cosine: bool = False
    #: Whether :meth:`write_payload` can write a field into the items' payload (or a column)
    #: without re-inserting their vectors.
    payload_writes: ClassVar[bool] = False
    #: What a user should know once hubless wrote a payload field into the collection (printed
    #: by ``hubless attach --write-payload``; None: nothing).
    payload_note: ClassVar[str | None] = None
    #: Whether the collection is read whole into memory when it changes (a FAISS file): then a
    #: changed version mark is checked by comparing every vector, at no extra read.
    reads_whole: bool = False
    #: Whether :meth:`search_band` searches a bias band (:mod:`hubless.attached.bands`) through
    #: the store's filter, and whether by the payload field hubless wrote (else by the band's ids).
    band_search: ClassVar[bool] = False
    band_by_payload: ClassVar[bool] = True
    #: Whether :meth:`search_corrected` ranks by the corrected score in the store's own query
    #: (:mod:`hubless.attached.store_ranking`).
    ranks_corrected: ClassVar[bool] = False

    def __init__(self, uri: str) -> None:
        from hubless.export.base import without_password

        #: The address as given, less any password (``user:password@``, ``?password=``): what
        #: messages show and a sidecar records (the password is read where the store's client
        #: looks when an address has none; libpq: PGPASSWORD, ~/.pgpass).
        self.uri = without_password(str(uri))
        self.bytes_read = 0
        #: The local file or folder the collection lives in (the location part of its address;
        #: None for a server's collection or an index in memory): recorded by an attach so that
        #: the sidecar finds it again from another working folder (:func:`relocate`).
        self.local: Path | None = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The vectors' dimension."""

    @abc.abstractmethod
    def count(self) -> int:
        """How many items the collection holds now."""

    @abc.abstractmethod
    def scan(self, batch: int = BATCH) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(ids int64, vectors float32) of every item, ``batch`` at a time (in the store's order)."""

    @abc.abstractmethod
    def scan_ids(self, batch: int = BATCH) -> Iterator[np.ndarray]:
        """The ids of every item, ``batch`` at a time (no vector is read)."""

    @abc.abstractmethod
    def _fetch(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ids found, their vectors) for ``ids`` (any order; unknown ids left out)."""

    @abc.abstractmethod
    def _search(self, queries: np.ndarray, k: int, knobs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The store's plain top-``k`` by similarity: (scores float32, ids int64, found bool),
        (n, k) each; ``found`` marks the filled slots (any int64 is an id)."""

    def version(self) -> Any:
        """A cheap mark of the collection's content that changes with every write (JSON-ready:
        a number or a list of numbers), or None when the store keeps none (then only the count and
        sampled vectors can show a change: see docs/attach.md). Hook; None by default."""
        return None

    def searches_exactly(self, knobs: dict) -> bool:
        """Whether the store's plain search with ``knobs`` is exhaustive: its top-k' is the exact
        plain top-k' (a flat index, a table without a vector index, an exact-search option), so
        that an attached answer certified over it is the exact corrected answer. Hook; False
        (an ANN search) by default."""
        return False

    @property
    def beam_knob(self) -> str | None:
        """The knob that widens the store's ANN search, its *beam*: ``"ef_search"`` (a list
        length, scaled with k') or ``"nprobe"`` (partitions probed, not scaled); None: the store
        has none, or searches exactly. :mod:`hubless.attached.beam` measures the store's recall
        along :meth:`beam_ladder` at attach and records the default beam in the sidecar."""
        return None

    def beam_ladder(self, k: int) -> list[int]:
        """The values of :attr:`beam_knob` attach measures the store's recall at, for k' = ``k``,
        narrowest first (hook; none by default)."""
        return []

    def fetch(self, ids, batch: int = BATCH) -> np.ndarray:
        """The vectors of ``ids`` in that order, ``batch`` ids per request; an id the collection
        does not hold is :class:`~hubless.errors.NotFound`."""
        ids = np.asarray(ids, np.int64).ravel()
        out = np.empty((ids.size, self.dim), np.float32)
        for lo in range(0, ids.size, batch):
            want = ids[lo : lo + batch]
            got, vectors = self._fetch(want)
            order = np.argsort(got, kind="stable")
            pos = np.searchsorted(got[order], want)
            pos = np.minimum(pos, max(got.size - 1, 0))
            found = got.size > 0 and (got[order][pos] == want)
            if not np.all(found):
                missing = want[~np.asarray(found, bool)] if got.size else want
                raise NotFound(f"{self.uri} holds no item with id {int(missing[0])}")
            out[lo : lo + want.size] = vectors[order][pos]
        return out

    def fetch_present(self, ids, batch: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
        """(the ids of ``ids`` the collection holds, their vectors), in the order of ``ids``; the
        ids it does not hold are left out (no error)."""
        ids = np.asarray(ids, np.int64).ravel()
        kept, parts = [], []
        for lo in range(0, ids.size, batch):
            want = ids[lo : lo + batch]
            got, vectors = self._fetch(want)
            order = np.argsort(got, kind="stable")
            at = np.minimum(np.searchsorted(got[order], want), max(got.size - 1, 0))
            hit = (got[order][at] == want) if got.size else np.zeros(want.shape, bool)
            kept.append(want[hit])
            parts.append(np.asarray(vectors, np.float32).reshape(got.size, self.dim)[order][at[hit]])
        if not kept:
            return np.zeros(0, np.int64), np.zeros((0, self.dim), np.float32)
        return np.concatenate(kept), np.concatenate(parts)

    def check_knobs(self, knobs: dict) -> dict:
        """``knobs`` without None values; one this store does not take is refused, naming the valid ones."""
        unknown = sorted(set(knobs) - set(self.knobs))
        if unknown:
            valid = ", ".join(f"{name} ({text})" for name, text in self.knobs.items()) or "none"
            raise InvalidInput(f"unknown search option(s) {', '.join(unknown)} for {self.kind} collection {self.uri}; valid: {valid}")
        return {k_: v for k_, v in knobs.items() if v is not None}

    def search(self, queries: np.ndarray, k: int, **knobs) -> Hits:
        """The store's plain top-``k`` as :class:`~hubless.Hits` (unpacks to (scores, ids)), best
        first, ties to the lower id; unfilled slots last, ``found`` False (padding id -1, score
        -inf). ``knobs``: :attr:`knobs` (others are refused, naming them)."""
        knobs = self.check_knobs(knobs)
        scores, ids, found = self._search(np.ascontiguousarray(queries, np.float32), int(k), knobs)
        return _ordered(scores, ids, found)

    def searches_bands(self, fields) -> bool:
        """Whether :meth:`search_band` works here: a store's filter over the payload ``fields``
        hubless wrote (None: none written), or a FAISS file's selector of ids."""
        return self.band_search and (fields is not None or not self.band_by_payload)

    def search_band(self, queries: np.ndarray, k: int, band: BandFilter, **knobs) -> Hits:
        """The store's plain top-``k`` within ``band`` (the items with some bias column below
        its edge, :class:`BandFilter`), through the store's own filter,
        as :meth:`search` answers."""
        knobs = self.check_knobs(knobs)
        scores, ids, found = self._search_band(np.ascontiguousarray(queries, np.float32), int(k), band, knobs)
        return _ordered(scores, ids, found)

    def _search_band(self, queries: np.ndarray, k: int, band: BandFilter, knobs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The store's plain top-``k`` within ``band`` (hook of the stores that set :attr:`band_search`)."""
        raise NotImplementedError

    def search_corrected(self, queries: np.ndarray, k: int, kp: int, weights: np.ndarray, fields, **knobs) -> tuple[Hits, np.ndarray]:
        """The store's own top-``k`` by the corrected score ``s - weights[q] . fields``, among its
        plain top-``kp`` through its index, in one request (:mod:`hubless.attached.store_ranking`):
        (:class:`~hubless.Hits` of the k hits with their *plain* scores, the kp-th plain score of
        each query's candidates: +inf where the store held fewer than kp)."""
        knobs = self.check_knobs(knobs)
        q = np.ascontiguousarray(queries, np.float32)
        scores, ids, found, last = self._search_corrected(q, int(k), int(kp), np.asarray(weights, np.float64), tuple(fields), knobs)
        return Hits.from_found(scores, ids, found), np.asarray(last, np.float64)

    def _search_corrected(self, queries, k: int, kp: int, weights: np.ndarray, fields: tuple[str, ...], knobs: dict):
        """(scores, ids, found, last): hook of the stores that set :attr:`ranks_corrected`."""
        raise NotImplementedError

    def payloads(self, ids) -> list[dict]:
        """The stored metadata of ``ids`` (the store's payload or other columns, never the
        vector), one dict per id in that order (empty for an id without any; a FAISS index has
        none)."""
        ids = np.asarray(ids, np.int64).ravel()
        if ids.size == 0:
            return []
        found = self._payloads(np.unique(ids))
        return [dict(found.get(int(i), {})) for i in ids.tolist()]

    def _payloads(self, ids: np.ndarray) -> dict[int, dict]:
        """id -> metadata of the (unique) ``ids`` (hook; none by default)."""
        return {}

    def _count(self, n_ids: int, n_floats: int = 0) -> None:
        self.bytes_read += 8 * int(n_ids) + 4 * int(n_floats)

    def payload_fields(self, name: str, columns: int) -> list[str]:
        """The payload fields a bias of ``columns`` columns is written to: ``name`` for one column
        (every method but the gated DIS/DualDIS ones), ``name_0``, ``name_1``, ... for several;
        checked: plain identifiers, not the collection's id or vector field, and a store that can
        write them (:class:`~hubless.errors.InvalidInput` naming why, before anything is read)."""
        if not isinstance(name, str) or not _FIELD.fullmatch(name):
            raise InvalidInput(f"payload field {name!r}: use letters, digits and underscores (at most 60), starting with a letter or _")
        fields = [name] if columns == 1 else [f"{name}_{c}" for c in range(columns)]
        if not self.payload_writes:
            raise InvalidInput(
                f"{self.kind} collection {self.uri} keeps no payload field hubless can write without re-inserting its vectors "
                "(a FAISS index file holds only vectors and ids): its biases stay in the sidecar's bias.npy, keyed by your ids; "
                "--write-payload / write_payload= applies to LanceDB, Qdrant, pgvector, Chroma and Milvus collections"
            )
        taken = {getattr(self, "id_field", "id"), getattr(self, "vector_field", None) or "vector"}
        clash = sorted(set(fields) & taken)
        if clash:
            raise InvalidInput(f"payload field {clash[0]!r} is the collection's own id or vector field: choose another name")
        return fields

    def write_payload(self, ids, values, fields: list[str], batch: int = BATCH) -> int:
        """Write ``values[:, c]`` (float32) into the payload field ``fields[c]`` of each item of
        ``ids``, ``batch`` items per request, through the store's own payload update (Qdrant
        ``set_payload``, LanceDB ``merge_insert`` on the id, pgvector ``ALTER TABLE`` + ``UPDATE``,
        Chroma ``update`` of metadatas, Milvus partial ``upsert``): no vector is re-inserted and
        the item's other payload is kept. Returns the items written. ``fields`` from
        :meth:`payload_fields`."""
        ids = np.asarray(ids, np.int64).ravel()
        values = np.asarray(values, np.float32).reshape(ids.size, len(fields))
        if not self.payload_writes:
            raise InvalidInput(f"{self.kind} collection {self.uri} keeps no payload hubless can write")
        self._add_payload_fields(fields)
        for lo in range(0, ids.size, batch):
            self._write_payload(ids[lo : lo + batch], values[lo : lo + batch], fields)
        return int(ids.size)

    def _add_payload_fields(self, fields: list[str]) -> None:  # noqa: B027 - optional hook
        """Make room for ``fields`` where the store has a schema (nothing by default)."""

    def _write_payload(self, ids: np.ndarray, values: np.ndarray, fields: list[str]) -> None:
        """Write one batch (hook of the stores that set :attr:`payload_writes`)."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what this source holds open (nothing by default)."""


def _ordered(scores: np.ndarray, ids: np.ndarray, found: np.ndarray) -> Hits:
    """Each row best first, ties to the lower id, unfilled slots (``found`` False) last."""
    found = np.asarray(found, bool)
    scores = np.where(found, scores, -np.inf).astype(np.float32)
    order = np.lexsort((ids, ~found, -scores.astype(np.float64)), axis=1)
    return Hits.from_found(
        np.take_along_axis(scores, order, axis=1),
        np.take_along_axis(np.asarray(ids, np.int64), order, axis=1),
        np.take_along_axis(found, order, axis=1),
    )


def field_names(fields) -> tuple[str, ...]:
    """``fields`` (payload field names a sidecar recorded) checked as plain identifiers, so that
    a store's filter or query can name them (:class:`~hubless.errors.Corrupt` otherwise)."""
    from hubless.errors import Corrupt

    names = tuple(fields)
    if not names or not all(isinstance(f, str) and _FIELD.fullmatch(f) for f in names):
        raise Corrupt(f"the sidecar records payload fields {list(names)!r}, not plain identifiers: attach again")
    return names


def sql_band(band: BandFilter) -> str:
    """A band as an SQL condition over the payload columns hubless wrote: some column below its
    edge, or NULL (a row without the value is in the band, never silently out of it). The edges
    are float32 values written as the shortest decimal that reads back as the same number, so
    the store's comparison is numpy's."""
    assert band.fields is not None  # searches_bands: only with the fields hubless wrote
    return " OR ".join(f"({f} < {float(e)!r} OR {f} IS NULL)" for f, e in zip(band.fields, band.edges))


def pad_hits(rows: list[list[tuple[float, int]]], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per query, its (score, id) hits as (scores, ids, found) arrays of ``k`` columns (after the
    last hit: score -inf, id -1, found False)."""
    scores = np.full((len(rows), k), -np.inf, np.float32)
    ids = np.full((len(rows), k), -1, np.int64)
    found = np.zeros((len(rows), k), bool)
    for i, hits in enumerate(rows):
        hits = hits[:k]
        if hits:
            scores[i, : len(hits)] = [s for s, _ in hits]
            ids[i, : len(hits)] = as_ids([item for _, item in hits], "a hit")
            found[i, : len(hits)] = True
    return scores, ids, found


#: What ids a source can hand over: every int64.
_INT64 = np.iinfo(np.int64)


def as_ids(values, where: str) -> np.ndarray:
    """``values`` (Python ints, an integer array, or whole-number texts already turned into ints)
    as int64 ids; an id outside the int64 range, or not a whole number, is refused
    (:class:`~hubless.errors.InvalidInput` naming it and ``where``): hubless keeps every id as an
    int64, so it refuses at attach, before anything is written, what it could not keep."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        if values.dtype.kind == "u" and values.size and values.max() > _INT64.max:
            raise InvalidInput(f"{where}: id {int(values.max())} is beyond the int64 range hubless keeps ids in (at most {_INT64.max})")
        return values.astype(np.int64, copy=False)
    if isinstance(values, np.ndarray) and values.dtype.kind != "O":
        raise InvalidInput(f"{where}: ids must be whole numbers; got values of type {values.dtype}")
    values = list(values)
    bad = next(
        (v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not _INT64.min <= int(v) <= _INT64.max), None
    )
    if bad is not None:
        raise InvalidInput(
            f"{where}: id {bad!r} is not a whole number in the int64 range hubless keeps ids in ({_INT64.min} to {_INT64.max})"
        )
    return np.asarray(values, np.int64).reshape(len(values))


def sample_hash(source: Source, ids_sorted: np.ndarray) -> tuple[list[int], str]:
    """(sample ids, sha256 of their ids and vectors as read): :data:`SAMPLE` ids evenly spaced
    over the sorted ids, part of a collection's fingerprint."""
    n = ids_sorted.size
    if n == 0:
        return [], hashlib.sha256(b"").hexdigest()
    picks = np.unique(np.linspace(0, n - 1, min(SAMPLE, n)).astype(np.int64))
    sample = ids_sorted[picks]
    vectors = source.fetch(sample)
    h = hashlib.sha256(sample.astype("<i8").tobytes())
    h.update(np.ascontiguousarray(vectors, "<f4").tobytes())
    return sample.tolist(), h.hexdigest()


#: URI scheme -> source class. Every module of :mod:`hubless.attached.sources` is imported on the
#: first look-up, so each kind registers itself (a new kind of store is one file in this package);
#: the store clients are imported lazily, when a source opens.
SOURCES: Registry[type[Source]] = Registry(
    "attach source URI scheme", "hubless.attached.sources", names_of=lambda cls: tuple(cls.__dict__.get("schemes", ()))
)


def open_source(source, **options) -> Source:
    """The collection ``source`` names: a FAISS index file (a path, ``faiss://path``, or a
    ``faiss.Index``) or a store URI of a registered scheme (:data:`SOURCES`); ``options`` are
    the source's own (``id_field``, ``vector_field``, ``metric``, ``shard``, ``client``)."""
    if isinstance(source, Source):
        return source
    if not isinstance(source, (str, Path)):
        try:
            import faiss
        except ImportError:  # pragma: no cover - faiss is a dependency of the index
            faiss = None
        if faiss is not None and isinstance(source, faiss.Index):
            faiss_source: Any = SOURCES["faiss"]  # takes the open index
            return faiss_source("<in-memory FAISS index>", index=source, **options)
        raise InvalidInput(f"source must be a FAISS index file, a faiss.Index or a store URI; got {type(source).__name__}")
    text = str(source)
    scheme, sep, _ = text.partition("://")
    if not sep:
        scheme = "faiss"  # a path: a FAISS index file
    if scheme not in SOURCES:
        forms = ", ".join(dict.fromkeys(cls.uri_form for cls in sorted(SOURCES.values(), key=lambda c: c.kind != "faiss")))
        raise InvalidInput(f"cannot attach to {text!r}: attach supports {forms}")
    cls = SOURCES[scheme]
    unknown = {"id_field", "vector_field", "metric"} & set(options)
    if cls.kind == "faiss" and unknown:
        raise InvalidInput(f"option(s) {', '.join(sorted(unknown))} do not apply to a FAISS index file")
    return cls(text, **options)


def relocate(uri: str, location: Path) -> str:
    """``uri`` with its location part (a local file or folder) replaced by ``location``:
    ``path`` / ``faiss://path`` for a FAISS file, ``scheme://location/name`` otherwise."""
    scheme, sep, rest = str(uri).partition("://")
    if not sep:
        return str(location)
    if scheme == "faiss":
        return f"faiss://{location}"
    return f"{scheme}://{location}/{rest.rstrip('/').rpartition('/')[2]}"
