"""hubless: training-free hubness corrections for cross-modal (text-image) retrieval.

    import hubless
    nnn = hubless.NNN(alpha=0.75, k=16).fit(gallery, query_bank)
    scores, ids = nnn.search(queries, top_k=10)

Every correction is a per-candidate bias fitted on reference banks (never on test queries);
see :mod:`hubless.corrections` and ``docs/architecture.md``. The names below are imported on
first use (PEP 562), so ``import hubless`` and the command line start fast.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

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
    "exact_search": "hubless.engine",
    "Evaluation": "hubless.evaluation",
    "evaluate": "hubless.evaluation",
    "Index": "hubless.index",
    "IndexConfig": "hubless.index",
    "Truth": "hubless.metrics",
    "captions_per_item": "hubless.metrics",
    "Pipeline": "hubless.rerank",
    "tune": "hubless.tuning",
    "correct_scores": "hubless.scores",
    "evaluate_scores": "hubless.scores",
    "tune_scores": "hubless.scores",
    "NotFittedError": "hubless.errors",
    "MissingDependencyError": "hubless.errors",
    "UnnormalizedEmbeddingsWarning": "hubless._validation",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str):
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
