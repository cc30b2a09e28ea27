"""What a sidecar knows of its collection's content: a digest of every vector, and the samples of
them an open or an update compares.

**Digests** (:func:`vector_digests`): each vector's float32 words (little-endian, as the store
gave them, before any normalisation) hashed to 64 bits, row for row, in NumPy (no Python loop
over items): a multilinear hash over the words with fixed odd 64-bit keys,

    h(v) = mix( sum_j (w_j + 1) * K_j  mod 2**64 ),

``mix`` the splitmix64 finaliser. Two vectors that differ in any bit (a changed value, -0.0 for
0.0, a swapped id) have different digests but with probability about 2**-32 (for one changed
word, never: the keys are odd). Attach computes them from the vectors it reads anyway; a full
update compares them batch by batch; the default update and an open compare a *sample*.

**Samples** (:func:`sample_positions`): :data:`SAMPLE` items spread evenly over the sorted ids
from an offset, the *cursor*: an update advances the cursor it records in the sidecar (so that
successive updates check successive items, every item within ``n / SAMPLE`` updates), an open
draws one at random.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SAMPLE", "changed_in_sample", "sample_positions", "vector_digests"]

#: Items whose vectors an open or a default update reads and compares with their digests.
SAMPLE = 32
#: Rows hashed at once (bounds the (rows, d) uint64 temporaries).
_ROWS = 2048
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _keys(d: int) -> np.ndarray:
    return np.random.default_rng(0x5EED_D16E57).integers(0, 2**63, d, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def vector_digests(vectors: np.ndarray) -> np.ndarray:
    """The 64-bit content digest of each row of ``vectors`` (n, d) float32 (see the module
    docstring): (n,) uint64."""
    words = np.ascontiguousarray(vectors, "<f4").view("<u4")
    n, d = words.shape
    keys = _keys(d)
    out = np.empty(n, np.uint64)
    with np.errstate(over="ignore"):
        for lo in range(0, n, _ROWS):
            part = words[lo : lo + _ROWS].astype(np.uint64) + np.uint64(1)
            h = (part * keys).sum(axis=1, dtype=np.uint64)  # wraps: mod 2**64
            h ^= h >> np.uint64(30)
            h *= _M1
            h ^= h >> np.uint64(27)
            h *= _M2
            h ^= h >> np.uint64(31)
            out[lo : lo + _ROWS] = h
    return out


def sample_positions(n: int, cursor: int, size: int = SAMPLE) -> np.ndarray:
    """``size`` positions in ``range(n)`` spread evenly from ``cursor`` (every ``n // size``-th
    one), ascending: the items a sample check reads."""
    if n <= size:
        return np.arange(n, dtype=np.int64)
    stride = n // size
    return np.sort((int(cursor) % stride + np.arange(size, dtype=np.int64) * stride) % n)


def changed_in_sample(source, ids: np.ndarray, digests: np.ndarray, positions: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """The sampled items (``positions`` into the sorted ``ids``) read from the collection and
    compared with their ``digests``: (ids whose vector differs, ids the collection no longer holds)."""
    want = ids[positions]
    present, vectors = source.fetch_present(want, batch)
    gone = np.setdiff1d(want, present)
    rows = np.searchsorted(ids, present)
    changed = present[vector_digests(vectors) != digests[rows]]
    return changed, gone
