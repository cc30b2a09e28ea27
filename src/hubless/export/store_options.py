"""The options a store accepts, checked the same way for every store: typed export options (a
frozen dataclass per store, :func:`make_options`; unknown names refused naming the valid ones, an
option of one ANN type refused for another) and search options (:func:`check_options`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hubless.errors import InvalidInput, InvalidType

__all__ = ["NoOptions", "check_options", "make_options", "options_dict", "positive_int_or_none"]


@dataclass(frozen=True)
class NoOptions:
    """A store without export options of its own."""


def check_options(cls_name: str, given: dict, allowed: dict[str, str], what: str) -> None:
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        valid = ", ".join(f"{k} ({v})" for k, v in allowed.items()) or "none"
        raise InvalidType(f"unknown {what} option(s) {', '.join(unknown)} for {cls_name}; valid: {valid}")


def make_options(cls: type, given: dict, store: str, ann: str | None = None):
    """A typed options dataclass from keyword arguments: unknown names are an error naming the
    valid ones; values are checked by the dataclass's ``__post_init__``. A field whose metadata
    names the ANN types it applies to (``"ann": ("HNSW",)``) is refused for any other export
    (an exact one included), rather than ignored."""
    fields = {f.name: (f.metadata.get("help") or str(f.type)) for f in dataclasses.fields(cls)}
    check_options(store, given, fields, "export")
    for f in dataclasses.fields(cls):
        applies = f.metadata.get("ann")
        if f.name in given and applies is not None and ann not in applies:
            raise InvalidInput(
                f"{store} option {f.name} applies to ann={' or '.join(applies)} only; this export is "
                f"{'ann=' + ann if ann else 'exact (no ann)'}"
            )
    return cls(**given)


def positive_int_or_none(value, name: str) -> int | None:
    from hubless._validation import check_positive_int

    return None if value is None else check_positive_int(value, name)


def options_dict(options) -> dict:
    """Export options as a dict (kept in the store's info); {} for none."""
    if options is None or not dataclasses.is_dataclass(options) or isinstance(options, type):
        return {}
    return dataclasses.asdict(options)
