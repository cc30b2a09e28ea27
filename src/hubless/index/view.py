"""The read-only face of an index: :class:`IndexView` (search, filters, describe).

Everything here reads one version of the index (a :class:`~hubless.index.live.Snapshot`, never
changed: writes make new ones) and changes nothing: :class:`hubless.Index` is an
:class:`IndexView` that also writes (:mod:`hubless.index.writer`) and owns a directory
(:mod:`hubless.index.directory`). A search takes the version current when it starts, so it
sees one consistent version whatever writes happen meanwhile; the search itself is
:mod:`hubless.index.snapshot_search`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hubless.corrections import AdditiveCorrection
from hubless.errors import InvalidInput
from hubless.hits import Hits
from hubless.index import snapshot_search
from hubless.index.config import IndexConfig
from hubless.index.faiss_build import search_knob
from hubless.index.info import IndexInfo
from hubless.index.live import Snapshot

__all__ = ["IndexView", "ItemColumn", "Items"]


@dataclass
class Items:
    """What :meth:`Index.get` returns: ``ids`` (int64), their ``embeddings`` (float32, as
    stored: normalised when the index normalises) and ``metadata`` (one dict per item with every
    key of the schema, or None for an index without metadata)."""

    ids: np.ndarray
    embeddings: np.ndarray
    metadata: list[dict] | None


class ItemColumn(Mapping):
    """One metadata column of an index's items, looked up by id (``column[id]``): what a
    reranker reads for each candidate (e.g. the ``path`` or ``text`` of an item). Reads the
    version the index had when this was made."""

    def __init__(self, index: IndexView, column: str) -> None:
        snap = index._snap
        if snap.metadata is None or column not in snap.metadata.schema.names:
            raise InvalidInput(f"the index's metadata has no column {column!r}")
        self._snap, self.column = snap, column

    def __getitem__(self, item_id):
        rows = self._snap.rows_of([int(item_id)])
        assert self._snap.metadata is not None  # checked when the column was chosen
        return self._snap.metadata.table.column(self.column)[int(rows[0])].as_py()

    def __iter__(self):
        return iter(self._snap.live_ids.tolist())

    def __len__(self) -> int:
        return self._snap.n_alive


class IndexView:
    """The read-only methods of :class:`hubless.Index` over its current version (``_snap``)."""

    _snap: Snapshot

    # ------------------------------------------------------------------ description
    @property
    def ntotal(self) -> int:
        """The number of items."""
        return self._snap.n_alive

    @property
    def method(self) -> str:
        """The correction's spec, e.g. ``"nnn:alpha=0.75,k=16"``."""
        return self._snap.spec

    @property
    def ids(self) -> np.ndarray:
        """The items' ids, in the index's order (the order of :attr:`correction`'s gallery)."""
        return self._snap.live_ids

    @property
    def correction(self) -> AdditiveCorrection:
        """The correction fitted on the items, as a fresh fit on them would be (gallery row ``i``
        is item :attr:`ids` ``[i]``). After writes it is derived from the kept statistics on
        first use (O(n), once per version)."""
        return self._snap.correction

    @property
    def config(self) -> IndexConfig:
        return self._snap.config

    @property
    def factory(self) -> str:
        return self.config.factory

    @property
    def model(self) -> str | None:
        return self.config.model

    @property
    def query_bank(self) -> np.ndarray | None:
        return self._snap.banks.get("query_bank")

    @property
    def gallery_bank(self) -> np.ndarray | None:
        return self._snap.banks.get("gallery_bank")

    @property
    def weight_param(self) -> str | None:
        """The name of the correction's query-time weight (``alpha`` for NNN, ``lam`` for DN;
        None when it has none); any search takes it as ``weight=`` too."""
        return self._snap.serving.weight_param

    @property
    def weight(self) -> float:
        """The correction's weight (NNN's alpha, DN's lambda; 1 or 0 for methods without one)."""
        return float(self._snap.serving.weight())

    @property
    def bias_error(self) -> dict[str, float] | None:
        """Mean and max |bias_ann - bias_exact| on a sample when biases came from an ANN search."""
        return self.config.bias_error

    @property
    def metadata_schema(self):
        """The pyarrow schema of the item metadata (None: the index has no metadata)."""
        meta = self._snap.metadata
        return None if meta is None else meta.schema

    @property
    def metadata(self) -> list[dict] | None:
        """Every item's metadata record, in the index's order (None without metadata). For a
        few items use :meth:`records` or :meth:`get`; for all of them as a typed table,
        :meth:`metadata_table`."""
        snap = self._snap
        if snap.metadata is None:
            return None
        if "records" not in snap.extra:
            snap.extra["records"] = snap.metadata.take(snap.live_rows)
        return snap.extra["records"]

    def metadata_table(self):
        """The items' metadata as a pyarrow Table (one row per item, in the index's order), with
        their ids as the first column ``id``; None for an index without metadata."""
        snap = self._snap
        if snap.metadata is None:
            return None
        import pyarrow as pa

        if "id" in snap.metadata.schema.names:  # written before the key was reserved
            raise InvalidInput(
                "this index's metadata has a key 'id' (written before hubless reserved it), which would repeat the ids "
                "column: read index.metadata or records(ids) instead"
            )
        table = snap.metadata.table.take(snap.live_rows) if snap.metadata.schema.names else pa.table({})
        return table.add_column(0, pa.field("id", pa.int64(), nullable=False), pa.array(snap.live_ids))

    def records(self, ids) -> list[dict]:
        """The metadata records of items ``ids`` (every schema key, None where unset; ``{}``
        for an index without metadata); an unknown id is a NotFound."""
        snap = self._snap
        rows = snap.rows_of(ids)
        return [{} for _ in rows] if snap.metadata is None else snap.metadata.take(rows)

    def get(self, ids) -> Items:
        """Items ``ids``: their embeddings and metadata (:class:`Items`); an unknown id is a NotFound."""
        snap = self._snap
        rows = snap.rows_of(ids)
        meta = None if snap.metadata is None else snap.metadata.take(rows)
        return Items(snap.ids[rows].copy(), snap.gather(rows), meta)

    def positions(self, ids) -> np.ndarray:
        """The positions of items ``ids`` in the index's order (in :attr:`ids`, and the rows of
        :attr:`correction`'s gallery); -1 for an id that is not in the index."""
        snap = self._snap
        ids = np.asarray(ids, dtype=np.int64).ravel()
        rows = snap.id_map.rows(ids, snap.n_rows)
        present = (rows >= 0) & snap.alive[np.maximum(rows, 0)]
        if "rank" not in snap.extra:
            snap.extra["rank"] = np.cumsum(snap.alive) - 1
        return np.where(present, snap.extra["rank"][np.maximum(rows, 0)], -1)

    def __contains__(self, item_id) -> bool:
        snap = self._snap
        row = snap.id_map.rows(np.asarray([item_id], dtype=np.int64), snap.n_rows)[0]
        return bool(row >= 0 and snap.alive[row])

    def info(self) -> IndexInfo:
        """The index's description (:class:`hubless.index.info.IndexInfo`: typed fields that
        also read as the dict they were, ``info()["dim"]``; ``.to_dict()`` for the plain dict)."""
        return IndexInfo.from_dict(self._info())

    def _info(self) -> dict[str, Any]:
        snap = self._snap
        corr = snap.serving
        bank = snap.bank
        return {
            "method": snap.spec,
            "n_items": snap.n_alive,
            "dim": snap.dim,
            "bias_columns": int(snap.bias.shape[1]),
            "normalize": bool(snap.normalize),
            "n_query_bank": int(bank.n_query_bank) if corr.needs_query_bank else None,
            "n_gallery_bank": None if bank.n_gallery_bank is None else int(bank.n_gallery_bank),
            "banks_kept": any(v is not None for v in snap.banks.values()),
            "metadata_columns": [] if snap.metadata is None else list(snap.metadata.schema.names),
            "next_id": int(snap.next_id),
            **self.config.to_dict(),
        }

    def __repr__(self) -> str:
        return f"Index({self._snap.spec!r}, factory={self.factory!r}, n_items={self.ntotal})"

    # ------------------------------------------------------------------ search
    def search(
        self,
        queries,
        top_k: int = 10,
        *,
        where: dict | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rescore: bool | None = None,
        **weight,
    ) -> Hits:
        """Top ``top_k`` items per query, best first: a :class:`~hubless.Hits` (it unpacks as
        ``scores, ids``: the method's own scores and the items' ids).

        ``where``: a metadata filter (``{"split": "test", "year": {"gte": 2020}}``; see
        :mod:`hubless.index.metadata`): the results are the corrected ranking restricted to the
        items that match (the correction itself, its gates included, is the index's). Slots that
        cannot be filled (fewer items, or fewer matching items, than ``top_k``; IVF lists probed
        that ran dry) come last, not ``found``, with id ``-1`` (``MISSING``) and score ``-inf``;
        the CLI and the service leave them out (the one top-k rule,
        :func:`hubless._validation.check_top_k`).

        ``weight=`` overrides the correction's weight per call (scalar or one per query; the old
        ``alpha=`` / ``lam=`` warn until 0.2.0). ``nprobe``/``ef_search``/``rescore`` override the
        index defaults for this call only (other threads searching meanwhile are not affected).
        """
        # one version for the whole call, whatever writes happen meanwhile
        return snapshot_search.search(
            self._snap, queries, top_k, where=where, nprobe=nprobe, ef_search=ef_search, rescore=rescore, **weight
        )

    def search_uncorrected(
        self,
        queries,
        top_k: int = 10,
        *,
        where: dict | None = None,
        nprobe: int | None = None,
        ef_search: int | None = None,
        rescore: bool | None = None,
    ) -> Hits:
        """The uncorrected top ``top_k`` as :class:`~hubless.Hits`: plain inner products <q, r> of the
        (normalised) queries, through the same structure as :meth:`search` (the weight-0 query
        [q, 0] on the FAISS index, the rows written since the base exactly; a Flat index is
        searched exactly), so comparing costs about one more search of the same kind. ANN
        candidates are re-scored exactly as in :meth:`search`; ``where`` filters as there;
        unfilled slots are not ``found`` (id -1, score -inf)."""
        return snapshot_search.search_uncorrected(
            self._snap, queries, top_k, where=where, nprobe=nprobe, ef_search=ef_search, rescore=rescore
        )

    def search_knob(self) -> tuple[str, int] | None:
        """("nprobe", n_lists) for IVF, ("ef_search", limit) for HNSW, None for Flat."""
        return None if self._snap.faiss is None else search_knob(self._snap.faiss)
