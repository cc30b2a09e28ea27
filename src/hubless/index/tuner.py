"""Choose a corrected index for a recall target: :func:`tune_index` (the method: :mod:`hubless.index.recall_tuning`).

    from hubless.index.tuner import tune_index
    index = tune_index(correction, query_bank, target_recall=0.95, max_memory="2GB")

The sizes and candidates (:func:`parse_size`, :func:`estimate_bytes`, :func:`structure_bytes`,
:func:`candidate_factories`) and the measuring are :mod:`hubless.index.recall_tuning`'s, which builds
its candidates through the index class it is given; this module gives it :class:`hubless.Index`
(``Index.build(target_recall=)`` does the same), so the index and the tuner import no circle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hubless.index.index import Index
from hubless.index.recall_tuning import candidate_factories, estimate_bytes, parse_size, structure_bytes, tune_for_recall

if TYPE_CHECKING:
    from hubless.corrections import AdditiveCorrection

__all__ = ["candidate_factories", "estimate_bytes", "parse_size", "structure_bytes", "tune_index"]


def tune_index(correction: AdditiveCorrection, query_bank, **options: Any) -> Index:
    """A :class:`hubless.Index` over the fitted ``correction`` with the factory and knob chosen
    for ``target_recall`` on samples of ``query_bank``, ``config.tuning`` recording the choice:
    :func:`hubless.index.recall_tuning.tune_for_recall` with the index class :class:`hubless.Index`,
    whose keywords ``options`` are (``target_recall``, ``max_memory``, ``factories``, ``top_k``,
    ``sample``, ``latency_queries``, ``seed``, ``gallery_bank``, ``keep_banks`` and the index's
    own: ``ids``, ``metadata``, ``model``, ``rescore``, ...), documented there once."""
    return tune_for_recall(Index, correction, query_bank, **options)
