"""What ``fit`` is given, checked once for one or several corrections: the gallery and the banks
(validated, normalised, a bank dropped when no correction uses it) and precomputed bank
statistics (computed on arrays of these sizes, holding what the corrections need)."""

from __future__ import annotations

from hubless._validation import as_embeddings
from hubless.engine import BankStatistics
from hubless.errors import InvalidInput, MissingInput

__all__ = ["check_statistics", "validate_fit_inputs"]


def validate_fit_inputs(corrections, gallery, query_bank, gallery_bank, *, use_query_bank: bool = False):
    """Validate the arrays of ``fit`` for corrections sharing one ``normalize`` setting.

    Returns float32 (gallery, query_bank, gallery_bank); a bank is None when no correction uses
    it (the query bank is kept with ``use_query_bank``). Raises when a correction needs a bank
    that is missing or a parameter exceeds a size.
    """
    normalize = corrections[0].normalize
    g = as_embeddings(gallery, "gallery", normalize=normalize)
    dim = g.shape[1]
    b = gb = None
    needing = [c for c in corrections if c.needs_query_bank]
    if needing and query_bank is None:
        raise MissingInput("query_bank", f"{type(needing[0]).__name__} needs a query bank (reference queries): pass {{arg}}")
    if query_bank is not None and (needing or use_query_bank):
        b = as_embeddings(query_bank, "query_bank", normalize=normalize, dim=dim)
    requiring = [c for c in corrections if c.gallery_bank_use == "required"]
    if requiring and gallery_bank is None:
        raise MissingInput(
            "gallery_bank", f"{type(requiring[0]).__name__} needs a gallery bank (reference items of the gallery's modality): pass {{arg}}"
        )
    if gallery_bank is not None and any(c.gallery_bank_use != "ignored" for c in corrections):
        gb = as_embeddings(gallery_bank, "gallery_bank", normalize=normalize, dim=dim)
    for c in corrections:
        c.check_sizes(g.shape[0], None if b is None else b.shape[0], None if gb is None else gb.shape[0])
    return g, b, gb


def check_statistics(stats: BankStatistics, gallery, query_bank, gallery_bank, request) -> None:
    """Refuse precomputed ``stats`` computed on arrays of other sizes than the ones given, or
    lacking what ``request`` needs (InvalidInput)."""
    sizes = (gallery.shape[0], None if query_bank is None else query_bank.shape[0])
    have = (stats.n_gallery, stats.n_query_bank if query_bank is not None else None)
    if sizes != have or (gallery_bank is not None and stats.n_gallery_bank != gallery_bank.shape[0]):
        raise InvalidInput("statistics were computed on arrays of other sizes than the ones passed to fit")
    missing = stats.missing(request)
    if missing:
        raise InvalidInput("statistics lack " + "; ".join(missing))
