"""The methods :class:`~hubless.corrections.base.Correction` had before its public face became
fit / search / score / bias / save: each still works until 0.2.0, with a DeprecationWarning
naming the function that replaced it (the compatibility policy of CONTRIBUTING.md).

================================  ===============================================================
old method                        now
================================  ===============================================================
``corr.add_items(...)``           :func:`hubless.corrections.incremental.add_items` ``(corr, ...)``
``corr.remove_items(...)``        :func:`hubless.corrections.incremental.remove_items`
``corr.add_query_bank(...)``      :func:`hubless.corrections.incremental.add_query_bank`
``corr.add_gallery_bank(...)``    :func:`hubless.corrections.incremental.add_gallery_bank`
``corr.fit_scores(...)``          :func:`hubless.corrections.score_fit.fit_scores`
``corr.correct(scores)``          :func:`hubless.corrections.score_fit.correct_rows`
``corr.score_queries(scores)``    :func:`hubless.corrections.score_fit.rows_batch`
``corr.fitted_on_scores``         :func:`hubless.corrections.score_fit.fitted_on_scores`
``corr.fit_from_statistics(g, s)``  ``corr.fit(g, statistics=s)``
================================  ===============================================================

They are set on the class here, above the modules they call, so that ``corrections.base``
imports neither (no import circle); importing :mod:`hubless.corrections` installs them. Delete
this module in 0.2.0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from hubless._deprecation import warn_deprecated
from hubless.corrections.base import Correction
from hubless.corrections.incremental import add_gallery_bank, add_items, add_query_bank, remove_items
from hubless.corrections.score_fit import correct_rows, fit_scores, fitted_on_scores, rows_batch

__all__ = ["install"]


def _method(old: str, new: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def method(self, *args, **kwargs):
        warn_deprecated(f"Correction.{old}", new)
        return function(self, *args, **kwargs)

    method.__doc__ = f"Deprecated (removed in 0.2.0): use {new}."
    return method


def _fit_from_statistics(self, gallery, statistics):
    return self.fit(gallery, statistics=statistics)


def _fitted_on_scores(self) -> bool:
    warn_deprecated("Correction.fitted_on_scores", "hubless.corrections.score_fit.fitted_on_scores(correction)")
    return fitted_on_scores(self)


METHODS: dict[str, tuple[str, Callable[..., Any]]] = {
    "add_items": ("hubless.corrections.incremental.add_items(correction, ...)", add_items),
    "remove_items": ("hubless.corrections.incremental.remove_items(correction, ...)", remove_items),
    "add_query_bank": ("hubless.corrections.incremental.add_query_bank(correction, ...)", add_query_bank),
    "add_gallery_bank": ("hubless.corrections.incremental.add_gallery_bank(correction, ...)", add_gallery_bank),
    "fit_scores": ("hubless.corrections.score_fit.fit_scores(correction, ...)", fit_scores),
    "correct": ("hubless.corrections.score_fit.correct_rows(correction, scores)", correct_rows),
    "score_queries": ("hubless.corrections.score_fit.rows_batch(correction, scores)", rows_batch),
    "fit_from_statistics": ("correction.fit(gallery, statistics=statistics)", _fit_from_statistics),
}


def install() -> None:
    """Set the deprecated methods on :class:`Correction` (once; importing the package does)."""
    for old, (new, function) in METHODS.items():
        setattr(Correction, old, _method(old, new, function))
    Correction.fitted_on_scores = property(_fitted_on_scores)  # type: ignore[attr-defined]


install()
