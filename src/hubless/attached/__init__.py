"""Attach a correction to a collection the user already has (a FAISS index file, a LanceDB,
Qdrant, pgvector, Chroma or Milvus Lite collection): no re-export, a sidecar of biases keyed by the collection's ids, and
corrected search through the store's own ANN with a certificate of exactness
(:mod:`hubless.attached.core`)."""

from hubless.attached.core import AttachedCollection, AttachedResult, attach, update
from hubless.attached.sidecar import Sidecar, read_sidecar
from hubless.attached.sources import Source, open_source

__all__ = ["AttachedCollection", "AttachedResult", "Sidecar", "Source", "attach", "open_source", "read_sidecar", "update"]
