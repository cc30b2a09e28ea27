"""Retrieval and hubness metrics (pure numpy, vectorised)."""

from hubless.metrics.hubness import k_occurrence
from hubless.metrics.retrieval import recall_at_k

__all__ = ["k_occurrence", "recall_at_k"]
