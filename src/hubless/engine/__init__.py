"""The streamed block engine: bank statistics and exact search in bounded memory."""

from hubless.engine.device import use_device
from hubless.engine.exact import exact_search
from hubless.engine.parallel import use_threads
from hubless.engine.statistics import BankStatistics, StatisticsRequest, compute_statistics
from hubless.engine.stream import Dense, LogSumExp, SortedRows, TopK, stream_reduce

__all__ = [
    "BankStatistics",
    "Dense",
    "LogSumExp",
    "SortedRows",
    "StatisticsRequest",
    "TopK",
    "compute_statistics",
    "exact_search",
    "stream_reduce",
    "use_device",
    "use_threads",
]
