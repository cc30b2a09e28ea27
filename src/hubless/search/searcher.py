"""The facade: :class:`Searcher` searches one or several saved indexes (or attached collections, or stores)
with queries of any kind; ``hubless search`` and ``hubless serve`` are thin layers over it (see
:mod:`hubless.search` for what it does)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hubless._validation import check_top_k
from hubless.errors import InvalidInput, NotFound
from hubless.hits import Hits
from hubless.search.attached_index import AttachedIndex, as_attached, search_attached
from hubless.search.model_rule import choose_model
from hubless.search.store_index import StoreIndex, as_store, search_store

__all__ = ["QUERY_KINDS", "RERANK_COLUMNS", "Searcher", "as_hits"]

#: Metadata columns that give what a reranker reads for a gallery item, in order of preference.
RERANK_COLUMNS = ("path", "text", "caption", "item")
#: What a query can be.
QUERY_KINDS = ("embeddings", "texts", "images", "item")


class Searcher:
    """Search one or several indexes with queries of any kind (see :mod:`hubless.search`).

    ``indexes``: a saved index directory or a :class:`hubless.Index` (served as its folder's name,
    or "index"), an attached collection's sidecar directory, a store URI written by
    ``hubless export`` (served as its table's name; see :mod:`hubless.search.store_index`), or a
    mapping name -> any of these. ``model`` / ``encoder``: the query encoder (a name or
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

        if isinstance(indexes, (str, os.PathLike, Index, AttachedIndex, StoreIndex)):
            store = as_store(indexes)
            if store is not None:  # a store URI: named after its table
                indexes = {store.table: store}
            elif isinstance(indexes, (Index, AttachedIndex)):
                indexes = {"index": indexes}
            elif isinstance(indexes, (str, os.PathLike)):
                indexes = {Path(indexes).name: indexes}
        if not indexes:
            raise InvalidInput("give at least one index to search")
        self._indexes: dict[str, Any] = {}  # name -> Index, AttachedIndex or StoreIndex
        self.paths: dict[str, Path | None] = {}
        for name, value in indexes.items():
            store = None if isinstance(value, Index) else as_store(value)
            attached = None if isinstance(value, Index) or store is not None else as_attached(value)
            if store is not None:  # a store written by hubless export: read only, no versions, no path
                self._indexes[name], self.paths[name] = store, None
            elif attached is not None:  # read only, no versions: no path for the routes that read one
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
        if isinstance(self._indexes[name], StoreIndex):
            raise InvalidInput(f"{name!r} is a store written by hubless export: it keeps no versions")
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
        """The model that encodes queries for index ``name`` (by the rule of :mod:`hubless.search.model_rule`; raises
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
        kinds = ["embeddings", "item"] if getattr(self.index(name), "item_queries", True) else ["embeddings"]
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
        **store_options,
    ) -> Hits:
        """The top ``top_k`` of each query in index ``index`` (the only one when None), as
        :class:`~hubless.Hits` with ``index``, ``method``, ``queries`` (the texts or image names
        given), ``metadata`` (the records of the items shown, by id), ``uncorrected`` (compare),
        the reranked fields, and an attached collection's ``certified`` and ``exact``.

        Queries: exactly one of ``embeddings``, ``texts``, ``images`` or ``item`` (see
        :meth:`queries`). ``weight``: the correction's weight for this call (NNN's alpha, DN's
        lambda; a scalar or one per query). ``compare``: also the uncorrected ranking through
        the same index structure. ``version``: search that kept version of a saved index
        (:meth:`hubless.Index.versions`) instead of the current one. ``where``: a metadata filter, passed to
        :meth:`hubless.Index.search`. ``rerank``: rerank the corrected top ``rerank_k`` with the
        reranker, which reads ``query_items`` (default: the texts or images given).
        ``nprobe`` / ``ef_search`` / ``rescore``: ANN knobs for this call. A ``top_k`` beyond the
        index's items (or, reranked, beyond ``rerank_k``) keeps the width: the slots that cannot
        be filled come last with id -1 and score -inf (the one top-k rule,
        :func:`hubless._validation.check_top_k`); :meth:`Hits.records` leaves them out.
        ``runner``: what runs the corrected search, ``runner(index, queries, top_k, **options)`` (default
        ``index.search``; the service passes its batcher). ``store_options``: on a store written by
        ``hubless export``, its own search options passed to :func:`hubless.export.search`
        (``target_recall``: the knob measured at export for that recall@10; ``exact``; LanceDB's
        ``refine_factor``); None values are left out; refused on an index or attached collection.
        """
        name = self.name(index)
        current = self._indexes[name].snapshot() if version is None else self.version(name, version)  # one version for the call
        top_k = check_top_k(top_k, current.ntotal, f"index {name!r}")  # beyond the items: unfilled slots, never narrower
        extra = {key: value for key, value in store_options.items() if value is not None}
        if extra and not isinstance(current, StoreIndex):
            hint = "; on an index, Index.calibrate (hubless index calibrate) sets the knob for a recall" if "target_recall" in extra else ""
            raise InvalidInput(f"{', '.join(sorted(extra))} apply to a store written by hubless export; {name!r} is not one{hint}")
        vectors = self.queries(name, embeddings=embeddings, texts=texts, images=images, item=item)
        options = self._options(current, weight, where, nprobe, ef_search, rescore)
        shown = [str(t) for t in texts] if texts is not None else [_image_name(i) for i in images] if images is not None else None
        fields: dict[str, Any] = {"index": name, "method": current.method, "queries": shown}
        if isinstance(current, AttachedIndex):
            return search_attached(fields, current, vectors, top_k, options, compare=compare, rerank=rerank)
        if isinstance(current, StoreIndex):
            return search_store(fields, current, vectors, top_k, {**options, **extra}, compare=compare, rerank=rerank)
        if rerank:
            given = texts if texts is not None else images
            items = list(query_items) if query_items is not None else None if given is None else list(given)
            hits = self._rerank(name, current, vectors, items, top_k, options)
        else:
            run = runner or (lambda idx, q, k, **kw: idx.search(q, k, **kw))
            hits = as_hits(run(current, vectors, top_k, **options))
        if compare:
            knobs = {k: v for k, v in options.items() if k in ("nprobe", "ef_search", "rescore", "where")}
            hits = hits.with_fields(uncorrected=current.search_uncorrected(vectors, top_k, **knobs))
        if current.metadata_schema is not None:  # the records of the items shown, looked up by id
            ids = hits.shown_ids()
            fields["metadata"] = dict(zip(ids.tolist(), current.records(ids)))
        return hits.with_fields(**fields)

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

    def _rerank(self, name: str, index, vectors, items, top_k: int, options: dict) -> Hits:
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
            raise InvalidInput(f"index {name!r} has no {wanted} column in its metadata: nothing for the reranker to read for an item")
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
        # only the first rerank_k are reranked: the slots past them are unfilled (the one top-k rule)
        return reranked.widened(top_k)


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


def as_hits(found) -> Hits:
    """A runner's answer as :class:`~hubless.Hits`: Hits as they are; a ``(scores, ids)`` pair
    (a custom runner's) padded with id -1, an index's ids being >= 0."""
    if isinstance(found, Hits):
        return found
    scores, ids = found
    return Hits.padded(scores, ids)
