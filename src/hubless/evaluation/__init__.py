"""Measure corrections honestly: :func:`evaluate` (accuracy with paired bootstrap intervals,
hubness, time; typed results in :mod:`hubless.evaluation.results`), built on one ranking core (:mod:`hubless.evaluation.core`) shared with tuning
and the fairness audit; ECCV Caption / CxC metrics for COCO-5k in :mod:`hubless.evaluation.eccv`."""

from hubless.evaluation.core import prepare_methods, rank_queries
from hubless.evaluation.evaluate import evaluate
from hubless.evaluation.results import EccvScores, Evaluation, Interval, JSONValue, MethodResult, RerankNumbers, TunedMethod, TuneResult

__all__ = [
    "EccvScores",
    "Evaluation",
    "Interval",
    "JSONValue",
    "MethodResult",
    "RerankNumbers",
    "TuneResult",
    "TunedMethod",
    "evaluate",
    "prepare_methods",
    "rank_queries",
]
