"""A FAISS index file as an attached collection: ``path/to/index.faiss`` (any FAISS index with the
inner-product metric; an ``IndexIDMap`` / ``IndexIDMap2`` gives the user's ids, else ids are the
positions, which ``remove_ids`` renumbers: attach says so in a note), vectors by
``reconstruct_n`` over the inner index, search with ``nprobe`` (IVF) / ``ef_search`` (HNSW;
without a beam recorded at attach, the larger of the index's own and 2 k'). A flat index, and
an IVF-Flat probed in every list, search exactly (:meth:`FaissSource.searches_exactly`). A bias
band of the certificate (:mod:`hubless.attached.bands`) is searched exactly over its own vectors
when it is small (:data:`BAND_SCAN`), else through the index with a selector of its positions.

The file is read whole when it is opened and again when it is rewritten (its inode, size and
modification time, :meth:`FaissSource.version`, differ from the ones read): ``bytes_read`` counts
the file's size at each read, what the process really read; vectors and ids then come from
memory. A FAISS file keeps no payload: :meth:`FaissSource.write_payload` refuses, naming the
sidecar."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hubless.attached.sources.base import BATCH, SOURCES, Source
from hubless.errors import InvalidInput, MissingFile, optional_import

__all__ = ["BAND_SCAN", "FaissSource"]

#: A bias band of at most this many items is scanned exactly over its own vectors (a FAISS flat
#: index of them, made once per band): an HNSW or IVF search filtered to it costs as much as a
#: plain search (13.9 against 13.7 ms at 100k x 256, ef 2560), the scan its size (16,384 x 256:
#: about a millisecond), and it is exact. Larger bands are searched through the index with a
#: selector of their positions.
BAND_SCAN = 16384


@SOURCES.register
class FaissSource(Source):
    """A FAISS index file (see the module docstring)."""

    kind = "faiss"
    schemes = ("faiss",)
    uri_form = "a FAISS index file (its path, or faiss://path)"
    knobs = {"nprobe": "IVF partitions probed per query", "ef_search": "HNSW candidates kept per query"}
    band_search = True
    band_by_payload = False  # a band is a selector of positions: no payload needed

    def __init__(self, uri: str, *, index=None) -> None:
        super().__init__(uri)
        self._faiss = optional_import("faiss", "attaching to a FAISS index", "faiss", "faiss-cpu")
        self.path = None if index is not None else Path(uri.removeprefix("faiss://"))
        self.local = self.path
        self.reads_whole = self.path is not None
        self._stamp: list[int] | None = None
        if index is None:
            index = self._read()
        self._load(index)

    @staticmethod
    def _stamp_of(stat) -> list[int]:
        return [int(stat.st_ino), int(stat.st_size), int(stat.st_mtime_ns)]

    def _read(self):
        assert self.path is not None  # only a source read from a file is read again
        if not self.path.is_file():
            raise MissingFile(f"no FAISS index file {self.uri}")
        stat = self.path.stat()
        try:
            index = self._faiss.read_index(str(self.path))
        except RuntimeError as exc:
            raise InvalidInput(f"{self.uri} is not a FAISS index: {str(exc).splitlines()[0]}") from None
        self._stamp = self._stamp_of(stat)
        self.bytes_read += int(stat.st_size)  # the whole file: what this process read
        return index

    def _fresh(self) -> None:
        """Read the file again when it was rewritten since (the collection changed)."""
        if self.path is None:
            return
        try:
            stat = self.path.stat()
        except OSError:
            raise MissingFile(f"the FAISS index file {self.uri} is gone") from None
        if self._stamp_of(stat) != self._stamp:
            self._load(self._read())

    def version(self) -> list[int] | None:
        """The file's inode, size and modification time (ns) as read (None: an index in memory);
        a rewritten file is read again first."""
        self._fresh()
        return None if self._stamp is None else list(self._stamp)

    def _count(self, n_ids: int, n_floats: int = 0) -> None:
        """Nothing: the file was read whole (and counted) when it was opened; the rest is memory."""

    @property
    def positions_as_ids(self) -> bool:
        """Whether the index has no id map, so its ids are its positions."""
        return self._ids is None

    def searches_exactly(self, knobs: dict) -> bool:
        faiss = self._faiss
        if isinstance(self.inner, faiss.IndexFlat):
            return True
        if isinstance(self.inner, faiss.IndexIVFFlat):  # every list probed: each stored vector scored exactly
            return int(knobs.get("nprobe") or self.inner.nprobe) >= int(self.inner.nlist)
        return False

    @property
    def beam_knob(self) -> str | None:
        if isinstance(self.inner, self._faiss.IndexHNSW):
            return "ef_search"
        return "nprobe" if self._faiss.try_extract_index_ivf(self.inner) is not None else None

    def beam_ladder(self, k: int) -> list[int]:
        if self.beam_knob == "ef_search":
            return [k * f for f in (1, 2, 4, 8, 16, 32)]
        if self.beam_knob == "nprobe":
            nlist = int(self._faiss.try_extract_index_ivf(self.inner).nlist)
            return sorted({min(2**p, nlist) for p in range(nlist.bit_length() + 1)})
        return []

    def _load(self, index) -> None:
        faiss = self._faiss
        uri = self.uri
        self._owner = index  # owns the C++ index: the downcast wrapper below does not
        self.index = faiss.downcast_index(index)
        if self.index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise InvalidInput(
                f"FAISS index {uri} ranks by L2 distance: a correction attaches to an inner-product index (METRIC_INNER_PRODUCT)"
            )
        if hasattr(self.index, "id_map"):  # IndexIDMap / IndexIDMap2: the user's ids
            self.inner = faiss.downcast_index(self.index.index)
            self._ids = faiss.vector_to_array(self.index.id_map).astype(np.int64)
        else:
            self.inner = self.index
            self._ids = None
        ivf = faiss.try_extract_index_ivf(self.inner)
        if ivf is not None:  # vectors by position (reconstruct_n / reconstruct_batch) need IVF's direct map
            try:
                ivf.make_direct_map()
            except RuntimeError:
                raise InvalidInput(
                    f"FAISS index {uri}: its IVF lists hold non-sequential ids (an IVF with ids of its own, or items removed "
                    "from an IndexIDMap over an IVF, which FAISS does not renumber): wrap a freshly built IVF in IndexIDMap2"
                ) from None
        self._order: np.ndarray | None = None
        self._bands: dict = {}  # band key -> how it is searched (_band), over this file's positions
        self._search_params: dict = {}  # (ef, nprobe, selector) -> FAISS search parameters

    @property
    def dim(self) -> int:
        return int(self.index.d)

    def count(self) -> int:
        self._fresh()
        return int(self.index.ntotal)

    def _ids_of(self, lo: int, hi: int) -> np.ndarray:
        return np.arange(lo, hi, dtype=np.int64) if self._ids is None else self._ids[lo:hi]

    def scan(self, batch: int = BATCH):
        n = self.count()
        for lo in range(0, n, batch):
            hi = min(n, lo + batch)
            vectors = self._reconstruct(lo, hi)
            self._count(hi - lo, vectors.size)
            yield self._ids_of(lo, hi), vectors

    def _reconstruct(self, lo: int, hi: int) -> np.ndarray:
        return np.asarray(self.inner.reconstruct_n(lo, hi - lo), np.float32)

    def scan_ids(self, batch: int = BATCH):
        n = self.count()
        for lo in range(0, n, batch):
            hi = min(n, lo + batch)
            self._count(hi - lo)
            yield self._ids_of(lo, hi)

    def _fetch(self, ids):
        self._fresh()
        if self._ids is None:
            hit = (ids >= 0) & (ids < self.count())
            found, positions = ids[hit], ids[hit]
        else:
            if self._order is None:
                self._order = np.argsort(self._ids, kind="stable")
            sorted_ids = self._ids[self._order]
            pos = np.minimum(np.searchsorted(sorted_ids, ids), max(sorted_ids.size - 1, 0))
            hit = (sorted_ids[pos] == ids) if sorted_ids.size else np.zeros(ids.shape, bool)
            found, positions = ids[hit], self._order[pos[hit]]
        vectors = np.asarray(self.inner.reconstruct_batch(np.ascontiguousarray(positions, np.int64)), np.float32)
        vectors = vectors.reshape(found.size, self.dim)
        self._count(found.size, vectors.size)
        return found, vectors

    def _search(self, queries, k, knobs):
        return self._search_in(queries, k, knobs, None)

    def _search_band(self, queries, k, band, knobs):
        found = self._bands.get(band.key)
        if found is None:
            found = self._bands[band.key] = self._band(band)
        if found[0] == "selector":
            return self._search_in(queries, k, knobs, found[2])
        _, positions, flat = found  # a small band: its own vectors, scanned exactly
        k_eff = min(k, positions.size)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        hit = np.zeros((len(queries), k), bool)
        if k_eff:
            d, i = flat.search(queries, k_eff)
            hit[:, :k_eff] = i >= 0
            scores[:, :k_eff] = np.where(hit[:, :k_eff], d, -np.inf)
            at = positions[np.maximum(i, 0)]
            ids[:, :k_eff] = self._ids[at] if self._ids is not None else at
        return scores, ids, hit

    def _band(self, band) -> tuple:
        """How a band is searched, made once per band and file: ("scan", its positions, an
        IndexFlatIP of its vectors) for a band of at most :data:`BAND_SCAN` items of an index that
        stores its vectors whole (its filtered search would cost as much as a plain one: the scan
        costs the band's size, and is exact), else ("selector", its bitmap, a FAISS selector of
        its positions)."""
        faiss = self._faiss
        members = np.asarray(band.members(), np.int64)
        n = self.count()
        if self._ids is None:
            mask = np.zeros(n, bool)
            mask[members[(members >= 0) & (members < n)]] = True
        else:
            mask = np.isin(self._ids, members)
        whole = isinstance(self.inner, (faiss.IndexFlat, faiss.IndexHNSWFlat, faiss.IndexIVFFlat))
        if whole and int(mask.sum()) <= BAND_SCAN:
            positions = np.flatnonzero(mask)
            flat = faiss.IndexFlatIP(self.dim)
            if positions.size:
                flat.add(np.asarray(self.inner.reconstruct_batch(positions), np.float32).reshape(positions.size, self.dim))
            return ("scan", positions, flat)
        bits = np.packbits(mask, bitorder="little")  # IDSelectorBitmap: bit i & 7 of byte i >> 3
        return ("selector", bits, faiss.IDSelectorBitmap(n, faiss.swig_ptr(bits)))  # the bits live as long as it

    def _search_in(self, queries, k, knobs, selector):
        faiss = self._faiss
        n = self.count()
        ef, nprobe = knobs.get("ef_search"), knobs.get("nprobe")
        if ef is None and isinstance(self.inner, faiss.IndexHNSW):
            # a list as long as the beam is poor at its end: at least twice k' (the index's own when larger)
            ef = max(int(self.inner.hnsw.efSearch), 2 * k)
        params = self._params(ef, nprobe, selector)
        k_eff = min(k, n)
        scores = np.full((len(queries), k), -np.inf, np.float32)
        ids = np.full((len(queries), k), -1, np.int64)
        found = np.zeros((len(queries), k), bool)
        if k_eff:
            d, i = self.inner.search(queries, k_eff, params=params) if params is not None else self.inner.search(queries, k_eff)
            found[:, :k_eff] = i >= 0  # FAISS's positions: -1 is its own empty slot, never a position
            scores[:, :k_eff] = np.where(found[:, :k_eff], d, -np.inf)
            ids[:, :k_eff] = self._ids[np.maximum(i, 0)] if self._ids is not None else np.maximum(i, 0)
        return scores, ids, found

    def _params(self, ef, nprobe, selector):
        """The search parameters for a beam and a band's selector (None: the index's own), made
        once per file and kept (a SWIG object per query costs as much as a small search)."""
        key = (ef, nprobe, id(selector))
        if key not in self._search_params:
            faiss = self._faiss
            ivf = faiss.try_extract_index_ivf(self.inner)
            found: Any = None
            if ef is not None and isinstance(self.inner, faiss.IndexHNSW):
                found = faiss.SearchParametersHNSW(efSearch=int(ef))
            elif ivf is not None and (nprobe is not None or selector is not None):
                found = faiss.SearchParametersIVF(nprobe=int(ivf.nprobe if nprobe is None else nprobe))
            elif selector is not None:
                found = faiss.SearchParameters()
            if found is not None and selector is not None:
                found.sel = selector
            if len(self._search_params) > 256:  # bounded: beams and bands are few
                self._search_params.clear()
            self._search_params[key] = found
        return self._search_params[key]
