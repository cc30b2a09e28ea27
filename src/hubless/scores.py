"""Deprecated name of :mod:`hubless.score_matrices`, the score-matrix mode (until 0.2.0).

``import hubless.scores`` still gives the package's names (``load_scores``, ``evaluate_scores``,
``tune_scores``, ``correct_scores``, ...), with a DeprecationWarning on the first import; import
them from :mod:`hubless.score_matrices` (or ``hubless.evaluate_scores`` and friends).
"""

from __future__ import annotations

from hubless._deprecation import warn_deprecated
from hubless.score_matrices import *  # noqa: F403
from hubless.score_matrices import __all__ as __all__

warn_deprecated("the package hubless.scores", "hubless.score_matrices")
