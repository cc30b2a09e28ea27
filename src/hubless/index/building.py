"""What :meth:`hubless.Index.build` checks before it fits (so a bad argument fails in a second,
not after the fit) and the banks it keeps for later writes."""

from __future__ import annotations

from typing import Any

import numpy as np

from hubless._validation import as_embeddings, check_target_recall
from hubless.corrections import AdditiveCorrection
from hubless.errors import InvalidInput
from hubless.index.factory import check_factory
from hubless.index.ids import check_ids
from hubless.index.metadata import check_keys

__all__ = ["check_build_arguments", "kept_banks"]


def check_build_arguments(gallery, query_bank, factory: str | None, target_recall, max_memory, options: dict[str, Any]) -> None:
    """The arguments of :meth:`hubless.Index.build` that can be checked without fitting: the
    recall target and memory bound, the FAISS factory against the gallery's shape, the ids and
    the metadata (``options``: the constructor's keywords)."""
    if target_recall is None and max_memory is not None:
        raise InvalidInput("max_memory bounds what the tuner may choose: pass target_recall too (e.g. target_recall=0.95)")
    if target_recall is not None:
        from hubless.index.recall_tuning import parse_size

        check_target_recall(target_recall)
        parse_size(max_memory)
        if query_bank is None:
            raise InvalidInput("target_recall is measured on the query bank: pass query_bank")
    shape = np.shape(gallery)
    if factory is not None and len(shape) == 2:
        check_factory(factory, shape[0], shape[1] + 1)
    if options.get("ids") is not None and len(shape) == 2:
        check_ids(options["ids"], shape[0])
    if options.get("metadata") is not None or options.get("metadata_schema") is not None:
        check_keys(options.get("metadata"), options.get("metadata_schema"))


def kept_banks(corr: AdditiveCorrection, query_bank, gallery_bank) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The banks an index keeps so that :meth:`~hubless.Index.add` can compute new items' biases:
    as the fitted ``corr`` reads them (normalised as it normalises, of its dimension)."""
    qb = None if query_bank is None else as_embeddings(query_bank, "query_bank", normalize=corr.normalize, dim=corr.dim_)
    gb = None if gallery_bank is None else as_embeddings(gallery_bank, "gallery_bank", normalize=corr.normalize, dim=corr.dim_)
    return qb, gb
