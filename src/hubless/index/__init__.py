"""Serving corrections from FAISS indexes: :class:`Index` (build, search, add, remove, save, load)."""

from hubless.index.config import IndexConfig
from hubless.index.index import Index
from hubless.index.info import IndexInfo
from hubless.index.view import ItemColumn, Items

__all__ = ["Index", "IndexConfig", "IndexInfo", "ItemColumn", "Items"]
