"""One facade for searching what hubless serves (saved indexes, attached collections, exported stores): :class:`Searcher`.

    from hubless import Searcher
    searcher = Searcher({"coco": "idx/"})                       # or Searcher("idx/"), or {name: Index}
    hits = searcher.search(texts=["a dog on a beach"], top_k=10, compare=True)   # a hubless.Hits
    hits.records()[0]["hits"][0]     # {"id": 42, "score": 0.31, "metadata": {...}, "uncorrected_rank": 3, "rank_change": 2}

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

A store written by ``hubless export`` (a store URI: ``lancedb://``, ``postgresql://``,
``qdrant://``, ...) is served the same way, as a :class:`StoreIndex`: its search is
:func:`hubless.export.search`, ``compare`` the store's plain search (``corrected=False``), the
hits' metadata the store's payload; read only (writes, versions, filters, reranking and item
queries are refused, naming why), and its URI, which may hold credentials, is never shown.

The model rule (one rule, one override): text and image queries are encoded with the model the
index records; see :mod:`hubless.search.model_rule`.

The package, one module per job: :mod:`~hubless.search.searcher` (the facade; what it returns
is :class:`hubless.Hits`, as every search does), :mod:`~hubless.search.attached_index` (an
attached collection served as an index), :mod:`~hubless.search.store_index` (an exported store
served as an index), :mod:`~hubless.search.model_rule` (which model encodes
the queries).
"""

from __future__ import annotations

from hubless._deprecation import deprecated_names
from hubless.search.attached_index import AttachedIndex
from hubless.search.model_rule import choose_model, same_model
from hubless.search.searcher import RERANK_COLUMNS, Searcher
from hubless.search.store_index import StoreIndex

__all__ = ["RERANK_COLUMNS", "AttachedIndex", "Searcher", "StoreIndex", "choose_model", "same_model"]

#: ``SearchResult`` is now :class:`hubless.Hits` (deprecated name, removed in 0.2.0)
__getattr__ = deprecated_names(__name__, {"SearchResult": "hubless.hits:Hits"})
