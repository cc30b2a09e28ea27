"""Serve a corrected gallery from a vector database: LanceDB, PostgreSQL + pgvector, Qdrant, Milvus Lite, Chroma.

    hubless.export.export(index, "lancedb://stores/gallery", ann="IVF_FLAT", target_recall=0.95)
    hits = hubless.export.search("lancedb://stores/gallery", q, top_k=10, weight=0.5)
    hits.scores, hits.ids, hits.metadata    # a hubless.Hits, as every search returns

Rows hold the augmented vector [r, bias(r)] (searched by inner product / "dot", never cosine:
normalising [r, bias] would break the correction), the plain r and the metadata. Queries are
[q, -W(q)], so vector . query = r.q - W(q) bias(r), the additive correction's ranking score
(DESIGN.md; NNN/QB-Norm/DBNorm papers). Every store is a :class:`VectorStore` registered by its
URI scheme (:mod:`hubless.export.base`); see docs/stores.md.
"""

from __future__ import annotations

from hubless.export.api import describe, drop, export, search, sync, to_lancedb, to_pgvector, to_qdrant
from hubless.export.base import FORMAT_VERSION, StoreURI, VectorStore, open_store, parse_uri, registered

__all__ = [
    "FORMAT_VERSION",
    "StoreURI",
    "VectorStore",
    "describe",
    "drop",
    "export",
    "open_store",
    "parse_uri",
    "registered",
    "search",
    "sync",
    "to_lancedb",
    "to_pgvector",
    "to_qdrant",
]
