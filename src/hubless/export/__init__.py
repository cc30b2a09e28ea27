"""Serve a corrected gallery from a vector database: LanceDB, PostgreSQL + pgvector, Qdrant.

    hubless.export.export(index, "lancedb://stores/gallery")       # [r, bias(r)] + plain r + metadata
    scores, ids, meta = hubless.export.search("lancedb://stores/gallery", q, top_k=10, alpha=0.5)

Rows hold the augmented vector [r, bias(r)] (column ``vector``, searched by inner product /
"dot", never cosine: normalising [r, bias] would break the correction) and the plain r
(column ``plain``). Queries are [q, -W(q)], so vector . query = r.q - W(q) bias(r), the
additive correction's ranking score (DESIGN.md; NNN/QB-Norm/DBNorm papers).
"""

from __future__ import annotations

from hubless.export.base import FORMAT_VERSION, StoreURI, parse_uri
from hubless.export.query import describe, export, search, sync, to_lancedb, to_pgvector, to_qdrant

__all__ = ["FORMAT_VERSION", "StoreURI", "describe", "export", "parse_uri", "search", "sync", "to_lancedb", "to_pgvector", "to_qdrant"]
