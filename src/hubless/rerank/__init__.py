"""Retrieve and rerank: a cross-encoder re-scores the corrected top-k (Geigle et al. 2022).

Model adapters need the ``models`` extra; importing this package does not import torch.
"""

from hubless.rerank.evaluate import rerank_eval, rerank_evaluation
from hubless.rerank.loader import load_reranker
from hubless.rerank.pipeline import Pipeline, RerankResult, fuse
from hubless.rerank.rerankers import RERANKERS, BlipITMReranker, CallableReranker, CrossEncoderReranker, Reranker

__all__ = [
    "BlipITMReranker",
    "RERANKERS",
    "CallableReranker",
    "CrossEncoderReranker",
    "Pipeline",
    "RerankResult",
    "Reranker",
    "fuse",
    "load_reranker",
    "rerank_eval",
    "rerank_evaluation",
]
