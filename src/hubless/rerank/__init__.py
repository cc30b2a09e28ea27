"""Retrieve and rerank: a cross-encoder re-scores the corrected top-k (Geigle et al. 2022).

Model adapters need the ``models`` extra; importing this package does not import torch.
"""

from hubless._deprecation import deprecated_names
from hubless.rerank.evaluate import rerank_eval, rerank_evaluation
from hubless.rerank.loader import load_reranker
from hubless.rerank.pipeline import Pipeline, fuse
from hubless.rerank.rerankers import RERANKERS, BlipITMReranker, CallableReranker, CrossEncoderReranker, Reranker

__all__ = [
    "BlipITMReranker",
    "RERANKERS",
    "CallableReranker",
    "CrossEncoderReranker",
    "Pipeline",
    "Reranker",
    "fuse",
    "load_reranker",
    "rerank_eval",
    "rerank_evaluation",
]

#: ``RerankResult`` is now :class:`hubless.Hits` (deprecated name, removed in 0.2.0)
__getattr__ = deprecated_names(__name__, {"RerankResult": "hubless.hits:Hits"})
