"""One facade for searching saved indexes: :class:`Searcher`.

    from hubless.search import Searcher
    searcher = Searcher({"coco": "idx/"})                       # or Searcher("idx/"), or {name: Index}
    result = searcher.search(texts=["a dog on a beach"], top_k=10, compare=True)
    result.records()[0]["hits"][0]   # {"id": 42, "score": 0.31, "metadata": {...}, "uncorrected_rank": 3, "rank_change": 2}

It loads the indexes, encodes text and image queries with the model each index records,
searches (:meth:`hubless.Index.search`), compares with the uncorrected ranking through the same
structure (:meth:`hubless.Index.search_uncorrected`, the weight-0 query), passes filters on
(``where=``), reranks with a cross-encoder (:class:`hubless.rerank.Pipeline`) and returns hits
with their metadata. ``hubless search`` and ``hubless serve`` are thin layers over it.

An attached collection (a sidecar directory written by ``hubless attach``, see
:mod:`hubless.attached`) is served by the same facade: a sidecar directory (or an
:class:`hubless.attached.AttachedCollection`) given where an index is expected is opened as an
:class:`AttachedIndex` on the collection its sidecar names. Its search is the certified attached
search (:meth:`hubless.attached.AttachedCollection.search_certified`; the result says which
queries were certified), ``compare`` is the store's own plain ranking, and the hits' metadata is
the store's payload (none for a FAISS file). It is read only: a write goes to the store, then
``hubless attach --update``; filters, reranking and versions are refused, naming why.

The model rule (one rule, one override): text and image queries are encoded with the model the
index records (``index build --model NAME``). A model given explicitly (``model=`` or a loaded
``encoder=``) must be that same model (same name, or the same last path part: a local copy of
``openai/clip-vit-base-patch32`` in ``models/clip-vit-base-patch32/`` counts as the same), unless
``allow_model_mismatch=True``; for an index that records no model it is required. In every case
the model's dimension must be the index's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hubless.errors import Conflict, InvalidInput, NotFound

__all__ = ["RERANK_COLUMNS", "AttachedIndex", "SearchResult", "Searcher", "choose_model", "same_model"]

#: Metadata columns that give what a reranker reads for a gallery item, in order of preference.
RERANK_COLUMNS = ("path", "text", "caption", "item")
#: What a query can be.
QUERY_KINDS = ("embeddings", "texts", "images", "item")


def same_model(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two model names (hub names or folders) name the same model: equal, or with the
    same last path part (``openai/clip-vit-base-patch32`` and ``/models/clip-vit-base-patch32/``)."""
    a, b = os.fspath(a).rstrip("/\\"), os.fspath(b).rstrip("/\\")
    return a == b or os.path.basename(a) == os.path.basename(b)


def choose_model(recorded: str | None, given: str | None, *, allow_mismatch: bool = False, what: str = "the index") -> str:
    """The model that encodes queries for an index or store that records ``recorded`` (see the
    module docstring): ``given`` if it is the same model (or ``allow_mismatch``), else the
    recorded one; a clear :class:`InvalidInput` when there is none or they differ."""
    if given is None:
        if recorded is None:
            raise InvalidInput(
                f"{what} records no model (build the index with --model NAME); pass a model (--model) to encode text or image queries"
            )
        return recorded
    if recorded is not None and not same_model(recorded, given) and not allow_mismatch:
        raise InvalidInput(
            f"{what} holds {recorded} embeddings; queries encoded with {given} would not be comparable "
            "(pass allow_model_mismatch=True / --allow-model-mismatch to use it anyway)"
        )
    return os.fspath(given)


@dataclass
class SearchResult:
    """What :meth:`Searcher.search` returns, each array (n_queries, top_k): ``ids`` (the items'
    ids; -1 for a slot that could not be filled) and ``scores`` (the method's own, or
    the reranker's with ``reranked``); ``uncorrected`` = (scores, ids) of the plain inner-product
    ranking when compared; ``first_stage_scores`` when reranked; ``queries``: the texts or image
    names given (else None)."""

    index: str
    method: str
    ids: np.ndarray
    scores: np.ndarray
    metadata: dict[int, dict] | None = None  # the records of the items in the results, by id
    uncorrected: tuple[np.ndarray, np.ndarray] | None = None
    first_stage_scores: np.ndarray | None = None
    reranked: bool = False
    rerank_k: int | None = None
    queries: list[str] | None = None
    #: an attached collection's search: per query, whether its answer is certified exact
    certified: np.ndarray | None = None

    def hits(self, row: int) -> list[dict]:
        """The found hits of query ``row``, best first: id, score (None when not finite), the
        item's metadata (when the index has some); with compare, each hit's uncorrected rank and
        rank change (None: not in the uncorrected top k); when reranked, the first-stage score."""
        found = self.ids[row] >= 0
        out = [self._hit(j, v) for j, v in zip(self.ids[row][found], self.scores[row][found])]
        if self.first_stage_scores is not None:
            for h, f in zip(out, self.first_stage_scores[row][found]):
                h["first_stage_score"] = _finite(f)
        if self.uncorrected is not None:
            before = {int(j): r for r, j in enumerate(self.uncorrected[1][row], start=1) if j >= 0}
            for rank, h in enumerate(out, start=1):
                h["uncorrected_rank"] = before.get(h["id"])
                h["rank_change"] = None if h["uncorrected_rank"] is None else h["uncorrected_rank"] - rank
        return out

    def uncorrected_hits(self, row: int) -> list[dict]:
        """The uncorrected top k of query ``row`` (compare only)."""
        assert self.uncorrected is not None  # compare=True
        scores, ids = self.uncorrected
        found = ids[row] >= 0
        return [self._hit(j, v) for j, v in zip(ids[row][found], scores[row][found])]

    def records(self) -> list[dict]:
        """One JSON-ready dict per query: ``query`` (its position), ``text`` (when texts or images
        were given), ``hits`` and, with compare, ``uncorrected``."""
        out = []
        for row in range(self.ids.shape[0]):
            record: dict[str, Any] = {"query": row}
            if self.queries is not None:
                record["text"] = self.queries[row]
            if self.certified is not None:
                record["certified"] = bool(self.certified[row])
            record["hits"] = self.hits(row)
            if self.uncorrected is not None:
                record["uncorrected"] = self.uncorrected_hits(row)
            out.append(record)
        return out

    def _hit(self, item_id, score) -> dict:
        hit: dict[str, Any] = {"id": int(item_id), "score": _finite(score)}
        if self.metadata is not None:
            hit["metadata"] = self.metadata[int(item_id)]
        return hit


@dataclass
class _Rows:
    embeddings: np.ndarray


class AttachedIndex:
    """An attached collection (:class:`hubless.attached.AttachedCollection`) seen as a served,
    read-only index: what :class:`Searcher` and the service read of an index (size, method,
    weight, dimension, membership, an item's vector, metadata records), its search the certified
    attached one. Open one with :meth:`open` on a sidecar directory (the collection is the one
    the sidecar names, opened with the options it was attached with) or wrap an open collection."""

    read_only = True
    model = None  # an attached collection records no model: embedding and item queries
    factory = None
    metadata_schema = None
    query_bank = None
    gallery_bank = None
    keep_versions = 0

    def __init__(self, collection, path: Path | None = None) -> None:
        self.collection = collection
        self.path = path

    @classmethod
    def open(cls, sidecar) -> AttachedIndex:
        """The collection named in sidecar directory ``sidecar``, checked against its
        fingerprint (:class:`~hubless.errors.Conflict` when it changed since)."""
        from hubless.attached import AttachedCollection

        return cls(AttachedCollection.from_sidecar(sidecar), Path(sidecar))

    def snapshot(self) -> AttachedIndex:
        return self

    def refresh(self) -> None:
        """Nothing to catch up with: each search checks the collection's count."""

    @property
    def ntotal(self) -> int:
        return self.collection.ntotal

    @property
    def method(self) -> str:
        return self.collection.spec

    @property
    def weight_param(self) -> str | None:
        return self.collection.correction.weight_param

    @property
    def weight(self) -> float | None:
        name = self.weight_param
        return None if name is None else float(getattr(self.collection.correction, name))

    @property
    def has_metadata(self) -> bool:
        return self.collection.source.kind != "faiss"  # a FAISS index file keeps no payload

    def info(self) -> dict:
        """The index-like description: method, dimension, size, ``kind`` "attached" and the
        store's ``source`` kind (not its address, which may hold credentials)."""
        side = self.collection.sidecar.info
        return {
            "kind": "attached",
            "source": self.collection.source.kind,
            "method": self.method,
            "dim": int(side["dim"]),
            "normalize": bool(side["normalize"]),
            "n_items": self.ntotal,
            "metadata_columns": [],
            "reserve": int(self.collection.reserve_ids.size),
        }

    def __contains__(self, item_id) -> bool:
        ids = self.collection.sidecar.ids
        at = int(np.searchsorted(ids, int(item_id)))
        return at < ids.size and int(ids[at]) == int(item_id)

    def get(self, ids) -> _Rows:
        """The stored vectors of ``ids`` (read from the store)."""
        return _Rows(self.collection.source.fetch(np.asarray(ids, np.int64)))

    def records(self, ids) -> list[dict]:
        """The store's payloads of ``ids`` (one dict per id)."""
        return self.collection.source.payloads(np.asarray(ids, np.int64))

    def search(self, queries, top_k: int, **options) -> tuple[np.ndarray, np.ndarray]:
        return self.collection.search(queries, top_k, **options)

    def search_certified(self, queries, top_k: int, **options):
        return self.collection.search_certified(queries, top_k, **options)

    def search_uncorrected(self, queries, top_k: int, **knobs) -> tuple[np.ndarray, np.ndarray]:
        """The store's own plain top-``top_k``."""
        return self.collection.source.search(np.asarray(queries, np.float32), top_k, **knobs)

    def _refuse(self, *args, **kwargs):
        raise Conflict(
            f"{self.collection.source.uri} is an attached collection, served read only: write to the store itself, "
            "then run hubless attach --update"
        )

    add = remove = delete = update_metadata = add_bank = restore = _refuse


def _attached(value) -> AttachedIndex | None:
    """``value`` as an attached collection when it is one (a sidecar directory or an
    AttachedCollection), else None."""
    from hubless.attached import AttachedCollection
    from hubless.attached.sidecar import is_sidecar

    if isinstance(value, AttachedIndex):
        return value
    if isinstance(value, AttachedCollection):
        return AttachedIndex(value)
    if isinstance(value, (str, os.PathLike)) and is_sidecar(value):
        return AttachedIndex.open(value)
    return None


def _finite(value) -> float | None:
    value = float(value)
    return value if np.isfinite(value) else None


class Searcher:
    """Search one or several indexes with queries of any kind (see the module docstring).

    ``indexes``: a saved index directory or a :class:`hubless.Index` (served as its folder's name,
    or "index"), or a mapping name -> either. ``model`` / ``encoder``: the query encoder (a name or
    folder / a loaded :class:`hubless.encoders.Encoder`) for every index, checked against the model
    each index records unless ``allow_model_mismatch``; by default each index's own recorded model
    is loaded on first use (once per model), on ``device``. ``reranker``: a
    :class:`hubless.rerank.Reranker` or a model name/folder; ``rerank_k`` candidates per query are
    reranked against the metadata column ``rerank_column`` (default: the first of
    :data:`RERANK_COLUMNS` present), with optional score ``fusion`` weighted by ``fusion_weight``.

    Thread-safe for searching; :meth:`replace` swaps in a new version of an index (a search sees
    the old or the new one, never a half-updated one).
    """

    def __init__(
        self,
        indexes,
        *,
        model: str | os.PathLike | None = None,
        encoder=None,
        device: str | None = None,
        allow_model_mismatch: bool = False,
        reranker=None,
        rerank_k: int = 20,
        fusion: str | None = None,
        fusion_weight: float = 0.1,
        rerank_column: str | None = None,
    ) -> None:
        from hubless.index import Index

        if isinstance(indexes, (str, os.PathLike, Index, AttachedIndex)):
            name = "index" if isinstance(indexes, (Index, AttachedIndex)) else Path(indexes).name
            indexes = {name: indexes}
        if not indexes:
            raise InvalidInput("give at least one index to search")
        self._indexes: dict[str, Any] = {}  # name -> Index or AttachedIndex
        self.paths: dict[str, Path | None] = {}
        for name, value in indexes.items():
            attached = None if isinstance(value, Index) else _attached(value)
            if attached is not None:  # read only, no versions: no path for the routes that read one
                self._indexes[name], self.paths[name] = attached, None
            elif isinstance(value, Index):
                self._indexes[name], self.paths[name] = value, None
            else:
                self._indexes[name], self.paths[name] = Index.open(value), Path(value)  # writes commit at once
        if encoder is not None and model is not None:
            raise InvalidInput("give model= (a name or folder) or encoder= (a loaded encoder), not both")
        self.model = None if model is None else os.fspath(model)
        self.encoder = encoder
        self.device = device
        self.allow_model_mismatch = bool(allow_model_mismatch)
        if isinstance(reranker, (str, os.PathLike)):
            from hubless.rerank import load_reranker

            reranker = load_reranker(reranker, device=device)
        self.reranker, self.rerank_k, self.fusion, self.fusion_weight = reranker, int(rerank_k), fusion, float(fusion_weight)
        self.rerank_column = rerank_column
        self._encoders: dict[str, Any] = {} if encoder is None else {encoder.name: encoder}
        self._loading = threading.Lock()

    # ------------------------------------------------------------------ the indexes
    @property
    def names(self) -> list[str]:
        return list(self._indexes)

    def name(self, name: str | None = None) -> str:
        """``name`` checked, or the only index's name when None."""
        if name is None:
            if len(self._indexes) != 1:
                raise InvalidInput(f"several indexes are searched ({', '.join(sorted(self._indexes))}): name one with 'index'")
            return next(iter(self._indexes))
        if name not in self._indexes:
            raise NotFound(f"no index named {name!r}; searched: {', '.join(sorted(self._indexes))}")
        return name

    def index(self, name: str | None = None):
        """The current version of index ``name`` (the only one when None)."""
        return self._indexes[self.name(name)]

    def version(self, name: str, version: int):
        """Kept version ``version`` of the saved index ``name``, read (memory-mapped) on first use
        and kept for later searches (the 8 most recently used)."""
        from hubless.index import Index

        path = self.paths.get(self.name(name))
        if isinstance(self._indexes[name], AttachedIndex):
            raise InvalidInput(f"{name!r} is an attached collection: it keeps no versions")
        if path is None:
            raise InvalidInput(f"index {name!r} is served from memory: it keeps no versions")
        key = (name, int(version))
        cache = self.__dict__.setdefault("_versions", {})
        with self._loading:
            hit = cache.pop(key, None)
            if hit is None:
                hit = Index.load(path, version=int(version), mmap=True)
            cache[key] = hit  # most recently used last
            while len(cache) > 8:
                cache.pop(next(iter(cache)))
        return hit

    def replace(self, name: str, index) -> None:
        """Make ``index`` the version of ``name`` that later searches use (e.g. after a write)."""
        self._indexes[self.name(name)] = index

    # ------------------------------------------------------------------ models
    def model_for(self, name: str | None = None) -> str:
        """The model that encodes queries for index ``name`` (by the module's rule; raises
        :class:`InvalidInput` saying why when there is none)."""
        name = self.name(name)
        given = self.model if self.encoder is None else self.encoder.name
        return choose_model(self._indexes[name].model, given, allow_mismatch=self.allow_model_mismatch, what=f"index {name!r}")

    def encoder_for(self, name: str | None = None):
        """The loaded query encoder of index ``name`` (loaded once per model, then shared; a
        model that failed to load is not tried again)."""
        from hubless.errors import HublessError, message

        model = self.model_for(name)
        with self._loading:
            if model not in self._encoders:
                from hubless.encoders import load_encoder

                try:
                    self._encoders[model] = load_encoder(model, device=self.device)
                except (HublessError, OSError) as exc:
                    self._encoders[model] = exc
            found = self._encoders[model]
        if isinstance(found, Exception):
            raise InvalidInput(f"text and image queries need the model {model}, which cannot be loaded here: {message(found)}") from found
        return found

    def query_kinds(self, name: str | None = None) -> list[str]:
        """What index ``name`` can be queried with here: embeddings and item ids always; texts
        and images when its query encoder is loaded and reads them."""
        kinds = ["embeddings", "item"]
        try:
            model = self.model_for(name)
        except InvalidInput:
            return kinds
        encoder = self._encoders.get(model)
        if encoder is not None and not isinstance(encoder, Exception):
            kinds += [k for k, m in (("texts", "text"), ("images", "image")) if m in encoder.modalities]
        return kinds

    def preload(self) -> dict[str, str | None]:
        """Load every index's query encoder now; name -> None, or why text/image queries are off
        for it (no model recorded, a model that cannot be loaded here, ...)."""
        from hubless.errors import HublessError, message

        problems: dict[str, str | None] = {}
        for name in self._indexes:
            try:
                encoder = self.encoder_for(name)
                dim = self._indexes[name].info()["dim"]
                if encoder.dim != dim:
                    raise InvalidInput(f"{encoder.name} gives {encoder.dim}-dimensional embeddings; the index holds {dim}-dimensional ones")
                problems[name] = None
            except (HublessError, OSError) as exc:
                problems[name] = message(exc)
        return problems

    # ------------------------------------------------------------------ queries
    def queries(self, name: str | None = None, *, embeddings=None, texts=None, images=None, item: int | None = None) -> np.ndarray:
        """(m, d) float32 query vectors for index ``name`` from exactly one of ``embeddings``,
        ``texts``, ``images`` (files or PIL images, encoded with the index's model) or ``item``
        (an item's id: "more like this")."""
        from hubless._validation import as_embeddings, exactly_one

        exactly_one(dict(zip(QUERY_KINDS, (embeddings, texts, images, item))))
        index = self.index(name)
        info = index.info()
        if item is not None:
            if int(item) not in index:
                raise NotFound(f"index {self.name(name)!r} has no item {item}")
            return index.get([int(item)]).embeddings
        if embeddings is not None:
            return as_embeddings(embeddings, "queries", normalize=info["normalize"], dim=info["dim"])
        from hubless.encoders import encode_queries

        encoder = self.encoder_for(name)
        if texts is not None:
            return encode_queries(encoder, texts=list(texts), expected_dim=info["dim"])
        return encode_queries(encoder, images=list(images), expected_dim=info["dim"])

    # ------------------------------------------------------------------ search
    def search(
        self,
        index: str | None = None,
        *,
        embeddings=None,
        texts: Sequence[str] | None = None,
        images: Sequence | None = None,
        item: int | None = None,
        top_k: int = 10,
        weight=None,
        compare: bool = False,
        where=None,
        rerank: bool = False,
        query_items: Sequence | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rescore: bool | None = None,
        runner: Callable | None = None,
        version: int | None = None,
    ) -> SearchResult:
        """The top ``top_k`` of each query in index ``index`` (the only one when None).

        Queries: exactly one of ``embeddings``, ``texts``, ``images`` or ``item`` (see
        :meth:`queries`). ``weight``: the correction's weight for this call (NNN's alpha, DN's
        lambda; a scalar or one per query). ``compare``: also the uncorrected ranking through
        the same index structure. ``version``: search that kept version of a saved index
        (:meth:`hubless.Index.versions`) instead of the current one. ``where``: a metadata filter, passed to
        :meth:`hubless.Index.search`. ``rerank``: rerank the corrected top ``rerank_k`` with the
        reranker, which reads ``query_items`` (default: the texts or images given).
        ``nprobe`` / ``ef_search`` / ``rescore``: ANN knobs for this call. ``runner``: what
        runs the corrected search, ``runner(index, queries, top_k, **options)`` (default
        ``index.search``; the service passes its batcher).
        """
        name = self.name(index)
        current = self._indexes[name].snapshot() if version is None else self.version(name, version)  # one version for the call
        vectors = self.queries(name, embeddings=embeddings, texts=texts, images=images, item=item)
        top_k = _top_k(top_k, current.ntotal)
        options = self._options(current, weight, where, nprobe, ef_search, rescore)
        shown = [str(t) for t in texts] if texts is not None else [_image_name(i) for i in images] if images is not None else None
        result = SearchResult(name, current.method, np.empty((0, 0), np.int64), np.empty((0, 0), np.float32), queries=shown)
        if isinstance(current, AttachedIndex):
            return _search_attached(result, current, vectors, top_k, options, compare=compare, rerank=rerank)
        if rerank:
            items = (
                list(query_items)
                if query_items is not None
                else list(texts)
                if texts is not None
                else list(images)
                if images is not None
                else None
            )
            self._rerank(result, current, vectors, items, top_k, options)
        else:
            run = runner or (lambda idx, q, k, **kw: idx.search(q, k, **kw))
            result.scores, result.ids = run(current, vectors, top_k, **options)
        if compare:
            knobs = {k: v for k, v in options.items() if k in ("nprobe", "ef_search", "rescore", "where")}
            result.uncorrected = current.search_uncorrected(vectors, top_k, **knobs)
        if current.metadata_schema is not None:  # the records of the items shown, looked up by id
            shown_ids = [result.ids] if result.uncorrected is None else [result.ids, result.uncorrected[1]]
            found = np.unique(np.concatenate([i.ravel() for i in shown_ids]))
            found = found[found >= 0]
            result.metadata = dict(zip(found.tolist(), current.records(found)))
        return result

    def _options(self, index, weight, where, nprobe, ef_search, rescore) -> dict:
        options: dict[str, Any] = {}
        if weight is not None:
            if index.weight_param is None:
                raise InvalidInput(f"{index.info()['method']} has no query-time weight to set")
            options["weight"] = weight
        if where is not None:
            options["where"] = where
        for key, value in (("nprobe", nprobe), ("ef_search", ef_search), ("rescore", rescore)):
            if value is not None:
                options[key] = value
        return options

    def _rerank(self, result: SearchResult, index, vectors, items, top_k: int, options: dict) -> None:
        from hubless.index import ItemColumn
        from hubless.rerank import Pipeline

        if self.reranker is None:
            raise InvalidInput("reranking needs a reranker (hubless serve --rerank MODEL / hubless search --rerank MODEL)")
        if items is None:
            raise InvalidInput(
                "reranking needs the query texts or images (the cross-encoder reads them): give texts, images or query_items"
            )
        columns = [] if index.metadata_schema is None else index.metadata_schema.names
        column = self.rerank_column or next((c for c in RERANK_COLUMNS if c in columns), None)
        if column not in columns:
            wanted = self.rerank_column or "/".join(RERANK_COLUMNS)
            raise InvalidInput(
                f"index {result.index!r} has no {wanted} column in its metadata: nothing for the reranker to read for an item"
            )
        k = min(self.rerank_k, index.ntotal)
        pipe = Pipeline(
            index,
            self.reranker,
            k=k,
            fusion=self.fusion,
            fusion_weight=self.fusion_weight,
            gallery_items=_Text(ItemColumn(index, str(column))),  # a Mapping: read by id
        )
        reranked = pipe.search(vectors, items, top_k=min(top_k, k), **options)
        result.ids, result.scores, result.first_stage_scores = reranked.ids, reranked.scores, reranked.first_stage_scores
        result.reranked, result.rerank_k = True, k


def _search_attached(result: SearchResult, current: AttachedIndex, vectors, top_k: int, options: dict, *, compare: bool, rerank: bool):
    """:meth:`Searcher.search` on an attached collection: the certified search (its ``certified``
    in the result), the store's plain ranking for ``compare``, the store's payloads as metadata."""
    if rerank:
        raise InvalidInput(f"{result.index!r} is an attached collection: reranking is not offered on it")
    if "where" in options:
        raise InvalidInput(f"{result.index!r} is an attached collection: metadata filters (where) are not offered on it")
    found = current.search_certified(vectors, top_k, **options)
    result.scores, result.ids, result.certified = found.scores, found.ids, found.certified
    if compare:
        knobs = {k: v for k, v in options.items() if k != "weight"}
        result.uncorrected = current.search_uncorrected(vectors, top_k, **knobs)
    if current.has_metadata:
        shown_ids = [result.ids] if result.uncorrected is None else [result.ids, result.uncorrected[1]]
        ids = np.unique(np.concatenate([i.ravel() for i in shown_ids]))
        ids = ids[ids >= 0]
        result.metadata = dict(zip(ids.tolist(), current.records(ids)))
    return result


def _top_k(top_k, n: int) -> int:
    from hubless._validation import check_positive_int

    return min(check_positive_int(top_k, "top_k"), n)


def _image_name(image) -> str:
    return os.fspath(image) if isinstance(image, (str, os.PathLike)) else "(image)"


class _Text(Mapping):
    """A metadata column read as text (an item without a value reads as "")."""

    def __init__(self, column) -> None:
        self.column = column

    def __getitem__(self, item_id) -> str:
        value = self.column[item_id]
        return "" if value is None else str(value)

    def __iter__(self):
        return iter(self.column)

    def __len__(self) -> int:
        return len(self.column)
