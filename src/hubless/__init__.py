"""hubless: training-free hubness corrections for cross-modal (text-image) retrieval.

    import hubless
    nnn = hubless.NNN(alpha=0.75, k=16).fit(gallery, query_bank)
    scores, ids = nnn.search(queries, top_k=10)

Every correction is a per-candidate bias fitted on reference banks (never on test queries);
see :mod:`hubless.corrections` and the project's DESIGN notes.
"""

from hubless._validation import UnnormalizedEmbeddingsWarning
from hubless.corrections import (
    CSLS,
    DN,
    METHODS,
    NNN,
    AdditiveCorrection,
    Baseline,
    Correction,
    DualDIS,
    DualIS,
    DynamicInvertedSoftmax,
    GlobalCorrection,
    InvertedSoftmax,
    fit_many,
    make_correction,
)
from hubless.engine import exact_search
from hubless.evaluation import Evaluation, evaluate
from hubless.index import Index
from hubless.metrics import Truth, captions_per_item
from hubless.rerank import Pipeline
from hubless.tuning import tune

__version__ = "0.1.0"

__all__ = [
    "AdditiveCorrection",
    "Baseline",
    "CSLS",
    "Correction",
    "DN",
    "DualDIS",
    "DualIS",
    "DynamicInvertedSoftmax",
    "Evaluation",
    "GlobalCorrection",
    "Index",
    "InvertedSoftmax",
    "METHODS",
    "NNN",
    "Pipeline",
    "Truth",
    "UnnormalizedEmbeddingsWarning",
    "__version__",
    "captions_per_item",
    "evaluate",
    "exact_search",
    "fit_many",
    "make_correction",
    "tune",
]
