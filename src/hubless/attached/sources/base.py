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

A collection whose distance is not an inner product (Euclidean) is refused: its ranking is not
the similarity the correction corrects.
"""

from __future__ import annotations

import abc
import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hubless._registry import Registry
from hubless.errors import InvalidInput, NotFound

__all__ = ["BATCH", "SAMPLE", "SOURCES", "Source", "open_source", "pad_hits", "relocate", "sample_hash"]

#: Items read per batch by default.
BATCH = 8192
#: Ids whose vectors make a collection's sample hash.
SAMPLE = 32
#: A payload field hubless writes: a plain identifier, valid in every store (a SQL column too).
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,59}")


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
    def _search(self, queries: np.ndarray, k: int, knobs: dict) -> tuple[np.ndarray, np.ndarray]:
        """The store's plain top-``k`` by similarity: (scores float32, ids int64), (n, k) each."""

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

    def search(self, queries: np.ndarray, k: int, **knobs) -> tuple[np.ndarray, np.ndarray]:
        """The store's plain top-``k`` (scores, ids), best first, ties to the lower id, empty
        slots id -1 / score -inf. ``knobs``: :attr:`knobs` (others are refused, naming them)."""
        unknown = sorted(set(knobs) - set(self.knobs))
        if unknown:
            valid = ", ".join(f"{name} ({text})" for name, text in self.knobs.items()) or "none"
            raise InvalidInput(f"unknown search option(s) {', '.join(unknown)} for {self.kind} collection {self.uri}; valid: {valid}")
        scores, ids = self._search(np.ascontiguousarray(queries, np.float32), int(k), {k_: v for k_, v in knobs.items() if v is not None})
        return _ordered(scores, ids)

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


def _ordered(scores: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row best first, ties to the lower id, empty slots (id -1) last with score -inf."""
    scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
    big = np.where(ids < 0, np.iinfo(np.int64).max, ids)
    order = np.lexsort((big, -scores.astype(np.float64)), axis=1)
    return np.take_along_axis(scores, order, axis=1), np.take_along_axis(ids, order, axis=1).astype(np.int64)


def pad_hits(rows: list[list[tuple[float, int]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Per query, its (score, id) hits as (scores, ids) arrays of ``k`` columns (-inf / -1 after the last)."""
    scores = np.full((len(rows), k), -np.inf, np.float32)
    ids = np.full((len(rows), k), -1, np.int64)
    for i, hits in enumerate(rows):
        for j, (s, item) in enumerate(hits[:k]):
            scores[i, j], ids[i, j] = s, item
    return scores, ids


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
