"""hubless: training-free hubness corrections for cross-modal (text-image) retrieval.

    import hubless
    nnn = hubless.NNN(alpha=0.75, k=16).fit(gallery, query_bank)
    scores, ids = nnn.search(queries, top_k=10)

Every correction is a per-candidate bias fitted on reference banks (never on test queries);
see :mod:`hubless.corrections`, ``docs/explanation/methods.md`` (the formulas) and ``docs/architecture.md`` (the code). The names below are imported on
first use (PEP 562), so ``import hubless`` and the command line start fast.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from hubless._version import __version__ as __version__

#: Public name -> module that defines it.
_EXPORTS = {
    "AdditiveCorrection": "hubless.corrections",
    "AttachedCollection": "hubless.attached",
    "attach": "hubless.attached",
    "Baseline": "hubless.corrections",
    "CSLS": "hubless.corrections",
    "Correction": "hubless.corrections",
    "DN": "hubless.corrections",
    "DualDIS": "hubless.corrections",
    "DualIS": "hubless.corrections",
    "DynamicInvertedSoftmax": "hubless.corrections",
    "GlobalCorrection": "hubless.corrections",
    "InvertedSoftmax": "hubless.corrections",
    "METHODS": "hubless.corrections",
    "NNN": "hubless.corrections",
    "fit_many": "hubless.corrections",
    "make_correction": "hubless.corrections",
    "load_correction": "hubless.corrections",
    "exact_search": "hubless.engine",
    "Hits": "hubless.hits",
    "Evaluation": "hubless.evaluation",
    "evaluate": "hubless.evaluation",
    "Index": "hubless.index",
    "IndexConfig": "hubless.index",
    "Truth": "hubless.metrics",
    "captions_per_item": "hubless.metrics",
    "Pipeline": "hubless.rerank",
    "Searcher": "hubless.search",
    "tune": "hubless.tuning",
    "correct_scores": "hubless.score_matrices",
    "evaluate_scores": "hubless.score_matrices",
    "tune_scores": "hubless.score_matrices",
    "NotFitted": "hubless.errors",
    "MissingDependency": "hubless.errors",
    "UnnormalizedEmbeddingsWarning": "hubless._validation",
}

if TYPE_CHECKING:  # type checkers and IDEs see every public name (X as X: a re-export); at run time they load lazily
    from hubless._validation import UnnormalizedEmbeddingsWarning as UnnormalizedEmbeddingsWarning
    from hubless.attached import AttachedCollection as AttachedCollection
    from hubless.attached import attach as attach
    from hubless.corrections import CSLS as CSLS
    from hubless.corrections import DN as DN
    from hubless.corrections import METHODS as METHODS
    from hubless.corrections import NNN as NNN
    from hubless.corrections import AdditiveCorrection as AdditiveCorrection
    from hubless.corrections import Baseline as Baseline
    from hubless.corrections import Correction as Correction
    from hubless.corrections import DualDIS as DualDIS
    from hubless.corrections import DualIS as DualIS
    from hubless.corrections import DynamicInvertedSoftmax as DynamicInvertedSoftmax
    from hubless.corrections import GlobalCorrection as GlobalCorrection
    from hubless.corrections import InvertedSoftmax as InvertedSoftmax
    from hubless.corrections import fit_many as fit_many
    from hubless.corrections import load_correction as load_correction
    from hubless.corrections import make_correction as make_correction
    from hubless.engine import exact_search as exact_search
    from hubless.errors import MissingDependency as MissingDependency
    from hubless.errors import NotFitted as NotFitted
    from hubless.evaluation import Evaluation as Evaluation
    from hubless.evaluation import evaluate as evaluate
    from hubless.hits import Hits as Hits
    from hubless.index import Index as Index
    from hubless.index import IndexConfig as IndexConfig
    from hubless.metrics import Truth as Truth
    from hubless.metrics import captions_per_item as captions_per_item
    from hubless.rerank import Pipeline as Pipeline
    from hubless.score_matrices import correct_scores as correct_scores
    from hubless.score_matrices import evaluate_scores as evaluate_scores
    from hubless.score_matrices import tune_scores as tune_scores
    from hubless.search import Searcher as Searcher
    from hubless.tuning import tune as tune

__all__ = sorted([*_EXPORTS, "__version__"])


#: Names exported before (until 0.2.0, with a DeprecationWarning).
_OLD_NAMES = {"NotFittedError": "hubless.errors:NotFitted", "MissingDependencyError": "hubless.errors:MissingDependency"}


def __getattr__(name: str) -> Any:
    if name in _OLD_NAMES:
        from hubless._deprecation import deprecated_names

        return deprecated_names(__name__, _OLD_NAMES)(name)
    module = _EXPORTS.get(name)
    if module is None:
        if name.startswith("_") or importlib.util.find_spec(f"hubless.{name}") is None:
            raise AttributeError(f"module 'hubless' has no attribute {name!r}")
        value = importlib.import_module(f"hubless.{name}")  # a subpackage: hubless.fairness, ...
        globals()[name] = value
        return value
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
