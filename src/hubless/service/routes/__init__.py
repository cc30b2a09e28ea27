"""The endpoints, one router per concern (included by :func:`hubless.service.create_app`)."""

from hubless.service.routes import indexes, items, ops, page, queries

__all__ = ["indexes", "items", "ops", "page", "queries"]
