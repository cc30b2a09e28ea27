"""Attach a correction to a collection the user already has (a FAISS index file, a LanceDB,
Qdrant, pgvector, Chroma or Milvus Lite collection): no re-export, a sidecar of biases keyed by
the collection's ids (:mod:`hubless.attached.fit`, kept in step by
:mod:`hubless.attached.updating`), and corrected search through the store's own ANN with a
certificate of exactness (:mod:`hubless.attached.certified`). The collections are read through
:mod:`hubless.attached.sources`, one module per kind of store."""

from hubless.attached.certified import AttachedCollection, AttachedResult
from hubless.attached.fit import attach
from hubless.attached.sidecar import Sidecar, read_sidecar
from hubless.attached.sources.base import Source, open_source
from hubless.attached.updating import update

__all__ = ["AttachedCollection", "AttachedResult", "Sidecar", "Source", "attach", "open_source", "read_sidecar", "update"]
