"""Beyond one machine: bank statistics, index building and embedding on Ray (issue 20).

Install with ``pip install "hubless[distributed]"``. Ray is imported only when work starts.

* :func:`fit` / :func:`fit_many` / :func:`fit_statistics`: tiled bank statistics (gallery shard
  x bank shard per task), merged associatively; equal to a single-machine fit; resumable.
* :func:`build_index`: a live-index directory written by the tasks (rows, biases, statistics and
  IVF lists by gallery shard); the driver streams the lists into ``index.faiss`` and commits.
* :func:`write_augmented`: [r, bias(r)] parts written by tasks (the driver never reads the
  gallery), for any inner-product engine; :func:`augmented_queries` gives [q, -W(q)].
* :func:`embed`: the resumable embedding job with its chunks encoded by Ray Data workers.
"""

from hubless.distributed.augment import augmented_queries, write_augmented
from hubless.distributed.cluster import connect
from hubless.distributed.embed import embed
from hubless.distributed.fit import fit, fit_many, fit_statistics
from hubless.distributed.index import build_index
from hubless.storage.sources import EmbeddingSource, open_source

__all__ = [
    "EmbeddingSource",
    "augmented_queries",
    "build_index",
    "connect",
    "embed",
    "fit",
    "fit_many",
    "fit_statistics",
    "open_source",
    "write_augmented",
]
