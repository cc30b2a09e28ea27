"""Bootstrap confidence intervals over queries (percentile method, seeded, vectorised).

Each metric is a mean (or, for MdR, a median) of per-query values; resampling the queries with
replacement B times and taking the 2.5th and 97.5th percentiles of the B re-computed metrics
gives the 95% interval the NNN paper reports. The same seed draws the same resamples for every
method, so intervals of differences (corrected - baseline, per query) are paired.
"""

from __future__ import annotations

import numpy as np

from hubless._validation import check_seed
from hubless.errors import InvalidInput

__all__ = ["bootstrap_ci"]

#: Resample indices drawn at once (bounds memory to this many int64 values).
_CHUNK_ELEMENTS = 1 << 22


def bootstrap_ci(
    values: dict[str, np.ndarray],
    n_resamples: int = 1000,
    *,
    seed: int = 0,
    confidence: float = 0.95,
) -> dict[str, tuple[float, float]]:
    """Percentile bootstrap interval of each metric from its per-query ``values``.

    ``values`` maps a metric name to a per-query array (all of one length); ``"MdR"`` is
    summarised by the median, everything else by the mean. Returns {name: (low, high)}.
    """
    if n_resamples < 1:
        raise InvalidInput(f"n_resamples must be >= 1; got {n_resamples}")
    if not 0 < confidence < 1:
        raise InvalidInput(f"confidence must be in (0, 1); got {confidence}")
    arrays = {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}
    sizes = {a.shape for a in arrays.values()}
    if len(sizes) != 1 or len(next(iter(sizes))) != 1 or next(iter(sizes))[0] == 0:
        raise InvalidInput("bootstrap_ci needs non-empty 1-D per-query arrays of one length")
    n = next(iter(sizes))[0]
    rng = np.random.default_rng(check_seed(seed))
    draws = {name: np.empty(n_resamples) for name in arrays}
    chunk = max(1, _CHUNK_ELEMENTS // n)
    for start in range(0, n_resamples, chunk):
        stop = min(n_resamples, start + chunk)
        idx = rng.integers(0, n, size=(stop - start, n))
        for name, arr in arrays.items():
            sample = arr[idx]
            draws[name][start:stop] = np.median(sample, axis=1) if name == "MdR" else sample.mean(axis=1)
    tail = 100.0 * (1.0 - confidence) / 2.0
    return {name: (float(np.percentile(d, tail)), float(np.percentile(d, 100.0 - tail))) for name, d in draws.items()}
