"""Data: the synthetic generator, and loaders for real benchmarks."""

from hubless.data.synthetic import SyntheticRetrieval, make_retrieval_data

__all__ = ["SyntheticRetrieval", "make_retrieval_data"]
