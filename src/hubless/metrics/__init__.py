"""Retrieval and hubness metrics, ground truth and bootstrap intervals (pure numpy, vectorised)."""

from hubless.metrics.bootstrap import bootstrap_ci
from hubless.metrics.hubness import hubness_statistics, k_occurrence
from hubless.metrics.retrieval import PerQuery, check_ks, first_hit_ranks, per_query_metrics, recall_at_k, relevant_ranks, summarize
from hubless.metrics.truth import Truth, captions_per_item, load_truth

__all__ = [
    "PerQuery",
    "Truth",
    "bootstrap_ci",
    "captions_per_item",
    "check_ks",
    "first_hit_ranks",
    "hubness_statistics",
    "k_occurrence",
    "load_truth",
    "per_query_metrics",
    "recall_at_k",
    "relevant_ranks",
    "summarize",
]
