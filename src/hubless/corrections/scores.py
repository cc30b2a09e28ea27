"""Fitting corrections on score matrices, given as instances or specs: the public path of
:func:`hubless.corrections.score_fit.fit_on_scores` (defined there, next to the table of what
each method reads from which matrix), re-exported here unchanged.
"""

from __future__ import annotations

from hubless.corrections.score_fit import check_score_methods, fit_on_scores

__all__ = ["check_score_methods", "fit_on_scores"]
