"""The built-in demo: every correction on a synthetic benchmark, evaluated before and after.

It is ``hubless eval`` on :func:`~hubless.data.synthetic.make_retrieval_data`: the same code
path, so its numbers mean what the evaluation's numbers mean.
"""

from __future__ import annotations

from hubless.corrections import METHODS
from hubless.data.synthetic import SyntheticRetrieval, make_retrieval_data
from hubless.evaluation import Evaluation, evaluate

__all__ = ["DEFAULT_METHODS", "run_demo"]

#: Every correction at its documented defaults.
DEFAULT_METHODS = tuple(METHODS)


def run_demo(
    data: SyntheticRetrieval | None = None,
    methods=DEFAULT_METHODS,
    *,
    bootstrap: int = 200,
    progress: bool | None = None,
) -> Evaluation:
    """Evaluate ``methods`` text->image on ``data`` (default: :func:`make_retrieval_data`),
    fitted on its banks; the baseline comes first."""
    data = make_retrieval_data() if data is None else data
    return evaluate(
        data.gallery,
        data.queries,
        data.query_item,
        data.query_bank,
        methods,
        gallery_bank=data.gallery_bank,
        bootstrap=bootstrap,
        progress=progress,
        inputs={"data": f"synthetic (make_retrieval_data, {data.captions_per_item} captions per item)"},
    )
