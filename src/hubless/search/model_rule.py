"""Which model encodes text and image queries for an index or a store.

The model rule (one rule, one override): text and image queries are encoded with the model the
index records (``index build --model NAME``). A model given explicitly (``model=`` or a loaded
``encoder=``) must be that same model (same name, or the same last path part: a local copy of
``openai/clip-vit-base-patch32`` in ``models/clip-vit-base-patch32/`` counts as the same), unless
``allow_model_mismatch=True``; for an index that records no model it is required. In every case
the model's dimension must be the index's.

:func:`choose_model` applies the rule (in :class:`~hubless.search.Searcher`, for indexes, attached
collections and stores alike: the service and ``hubless search`` reach it there);
:func:`same_model` says whether two names name one model.
"""

from __future__ import annotations

import os

from hubless.errors import InvalidInput

__all__ = ["choose_model", "same_model"]


def same_model(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two model names (hub names or folders) name the same model: equal, or with the
    same last path part (``openai/clip-vit-base-patch32`` and ``/models/clip-vit-base-patch32/``)."""
    a, b = os.fspath(a).rstrip("/\\"), os.fspath(b).rstrip("/\\")
    return a == b or os.path.basename(a) == os.path.basename(b)


def choose_model(recorded: str | None, given: str | None, *, allow_mismatch: bool = False, what: str = "the index") -> str:
    """The model that encodes queries for an index or store that records ``recorded`` (see this
    module's docstring): ``given`` if it is the same model (or ``allow_mismatch``), else the
    recorded one; a clear :class:`InvalidInput` when there is none or they differ."""
    if given is None:
        if recorded is None:
            raise InvalidInput(
                f"{what} records no model (build the index with --model NAME); pass a model (--model) to encode text or image queries"
            )
        return recorded
    if recorded is not None and not same_model(recorded, given) and not allow_mismatch:
        raise InvalidInput(
            f"{what} holds {recorded} embeddings; queries encoded with {given} would not be comparable "
            "(pass allow_model_mismatch=True / --allow-model-mismatch to use it anyway)"
        )
    return os.fspath(given)
