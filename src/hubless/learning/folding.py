"""Near-duplicate folding for a bank reservoir: which vectors nearly repeat one already kept.

A vector *folds* into a kept one when their cosine is at least ``threshold``. Finding one must not cost the size of the reservoir, so candidates come from
locality-sensitive hashes and are verified exactly:

* ``tables`` sign hashes (SimHash, Charikar 2002) of ``bits`` bits each: the signs of the
  vector's projections on random Gaussian directions, after subtracting a centre (the mean of
  the first vectors kept: embeddings share a large common direction, which would otherwise give
  most bits the same sign). Two vectors at angle theta agree on a bit with probability
  1 - theta / pi, so they share at least one table's code with probability
  1 - (1 - (1 - theta/pi)^bits)^tables: 0.98 at cos 0.98 with the defaults (8 tables of 14 bits),
  above 0.9999 at cos 0.995;
* the candidates are the ``candidates`` most recently kept vectors of each of the vector's
  buckets; a fold needs a verified dot product >= ``threshold``, so nothing is ever folded into
  a vector that is not that close;
* identical vectors always fold (an exact hash of their bytes).

Cost per vector: one row of a (d x tables*bits) product and at most ``tables * candidates`` dot
products, whatever the number kept; memory: one entry per kept vector and table.
"""

from __future__ import annotations

from itertools import islice

import numpy as np

__all__ = ["NearDuplicates"]

#: Vectors kept before the hash centre is fixed (and the first ones hashed again with it).
WARMUP = 256


class NearDuplicates:
    """The kept vectors' hash buckets (see the module docstring). Keys are ints chosen by the
    caller (a reservoir's row serials); vectors are float32 rows, held by reference."""

    def __init__(
        self, dim: int, threshold: float = 0.98, *, tables: int = 8, bits: int = 14, candidates: int = 32, seed: int = 0, center=None
    ) -> None:
        self.threshold, self.tables, self.bits, self.candidates = float(threshold), int(tables), int(bits), int(candidates)
        rng = np.random.default_rng(seed)
        self.planes = rng.standard_normal((dim, self.tables * self.bits)).astype(np.float32)
        self.weights = (1 << np.arange(self.bits, dtype=np.int64))[None, None, :]
        self.center = None if center is None else np.asarray(center, np.float32)
        self.vectors: dict[int, np.ndarray] = {}
        self.codes: dict[int, np.ndarray] = {}
        self.norms: dict[int, float] = {}
        self.buckets: list[dict[int, dict[int, None]]] = [{} for _ in range(self.tables)]  # code -> keys, oldest first
        self.exact: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.vectors)

    def hash(self, vectors: np.ndarray) -> np.ndarray:
        """(n, tables) int64 bucket codes of the directions of ``vectors`` (one product for the batch)."""
        unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.finfo(np.float32).tiny)
        centred = unit if self.center is None else unit - self.center
        signs = (centred @ self.planes > 0).reshape(len(vectors), self.tables, self.bits)
        return (signs * self.weights).sum(axis=2)

    def find(self, vector: np.ndarray, codes: np.ndarray) -> int | None:
        """The key of a kept vector whose dot product with ``vector`` is >= the threshold (the
        closest of the candidates), or None."""
        length = float(np.linalg.norm(vector)) or 1.0
        same = self.exact.get(hash(vector.tobytes()))
        if same is not None and np.array_equal(self.vectors[same], vector):
            return same
        keys: set[int] = set()
        for table, code in enumerate(codes.tolist()):
            bucket = self.buckets[table].get(code)
            if bucket:
                keys.update(islice(reversed(bucket), self.candidates))
        if not keys:
            return None
        found = list(keys)
        sims = (np.stack([self.vectors[k] for k in found]) @ vector) / (np.array([self.norms[k] for k in found]) * length)
        best = int(np.argmax(sims))
        return found[best] if sims[best] >= self.threshold else None

    def add(self, key: int, vector: np.ndarray, codes: np.ndarray) -> None:
        self.vectors[key] = vector
        self.norms[key] = float(np.linalg.norm(vector)) or 1.0
        self.codes[key] = codes
        self.exact[hash(vector.tobytes())] = key
        for table, code in enumerate(codes.tolist()):
            self.buckets[table].setdefault(code, {})[key] = None
        if self.center is None and len(self.vectors) >= WARMUP:
            self._centre()

    def remove(self, key: int) -> None:
        vector = self.vectors.pop(key, None)
        if vector is None:
            return
        codes = self.codes.pop(key)
        del self.norms[key]
        digest = hash(vector.tobytes())
        if self.exact.get(digest) == key:
            del self.exact[digest]
        for table, code in enumerate(codes.tolist()):
            bucket = self.buckets[table][code]
            del bucket[key]
            if not bucket:
                del self.buckets[table][code]

    def clear(self) -> None:
        self.vectors.clear()
        self.codes.clear()
        self.norms.clear()
        self.exact.clear()
        for buckets in self.buckets:
            buckets.clear()

    def _centre(self) -> None:
        """Fix the centre to the mean of the vectors kept and hash them again (once)."""
        keys = list(self.vectors)
        rows = np.stack([self.vectors[k] / self.norms[k] for k in keys])
        self.center = rows.mean(axis=0).astype(np.float32)
        codes = self.hash(rows)
        for buckets in self.buckets:
            buckets.clear()
        for key, code in zip(keys, codes):
            self.codes[key] = code
            for table, c in enumerate(code.tolist()):
                self.buckets[table].setdefault(c, {})[key] = None
