"""The plain collections a correction attaches to, one module per kind of store, each class
registered by its URI scheme in :data:`hubless.attached.sources.base.SOURCES` (a FAISS index
file is named by its path): :mod:`~hubless.attached.sources.faiss`,
:mod:`~hubless.attached.sources.lancedb`, :mod:`~hubless.attached.sources.qdrant` (a server's
collection and an in-process shard), :mod:`~hubless.attached.sources.pgvector`,
:mod:`~hubless.attached.sources.chroma`, :mod:`~hubless.attached.sources.milvus`. What a source
is and how one is opened: :mod:`hubless.attached.sources.base`."""
