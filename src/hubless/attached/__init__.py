"""Attach a correction to a collection the user already has (a FAISS index file, a LanceDB,
Qdrant, pgvector, Chroma or Milvus Lite collection): no re-export, a sidecar of biases keyed by
the collection's ids (:mod:`hubless.attached.fit`, kept in step by
:mod:`hubless.attached.updating`), and corrected search through the store's own ANN with a
certificate of exactness (:mod:`hubless.attached.certified`). The collections are read through
:mod:`hubless.attached.sources`, one module per kind of store."""

from hubless._deprecation import deprecated_names
from hubless.attached.certified import AttachedCollection
from hubless.attached.fit import attach
from hubless.attached.sidecar import Sidecar, read_sidecar
from hubless.attached.sources.base import Source, open_source
from hubless.attached.updating import update

__all__ = ["AttachedCollection", "Sidecar", "Source", "attach", "open_source", "read_sidecar", "update"]

#: ``AttachedResult`` is now :class:`hubless.Hits` (deprecated name, removed in 0.2.0)
__getattr__ = deprecated_names(__name__, {"AttachedResult": "hubless.hits:Hits"})
