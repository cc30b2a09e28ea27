"""The rows a store holds, per gallery item: its id, the augmented vector [r, bias(r)], the plain r
and its metadata (:class:`Rows`); what an export writes (:func:`index_rows`), what a sync
rewrites and deletes (:func:`diff_rows`), and metadata read back with the types it was written
with (:func:`typed_records`, :func:`typed_rows`), identical in every store."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Rows", "diff_rows", "index_rows", "typed_records", "typed_rows"]


@dataclass
class Rows:
    """What an export or a sync writes: item ids, [r, bias(r)], plain r and metadata rows
    (already checked by :mod:`hubless.export.metadata`; None when the index has none)."""

    ids: np.ndarray
    augmented: np.ndarray
    plain: np.ndarray
    metadata: list[dict] | None

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def slice(self, lo: int, hi: int) -> Rows:
        meta = None if self.metadata is None else self.metadata[lo:hi]
        return Rows(self.ids[lo:hi], self.augmented[lo:hi], self.plain[lo:hi], meta)

    def batches(self, batch: int, desc: str = "export"):
        """The rows in slices of ``batch`` (a progress bar on a terminal)."""
        from hubless.progress import progress_bar

        for lo in progress_bar(range(0, len(self), batch), None, desc=desc):
            yield self.slice(lo, min(lo + batch, len(self)))

    def take(self, where: np.ndarray) -> Rows:
        """The rows at positions ``where``."""
        meta = None if self.metadata is None else [self.metadata[i] for i in where.tolist()]
        return Rows(self.ids[where], self.augmented[where], self.plain[where], meta)


def index_rows(index, meta) -> Rows:
    """Every item of ``index`` as a store keeps it: ids, [r, bias(r)], plain r and ``meta``."""
    from hubless.index.live import augmented_rows

    corr = index.correction
    ids = getattr(index, "ids", None)
    ids = np.arange(index.ntotal, dtype=np.int64) if ids is None or callable(ids) else np.asarray(ids, np.int64)
    return Rows(ids, augmented_rows(corr), np.ascontiguousarray(corr.gallery_, np.float32), meta)


def diff_rows(rows: Rows, stored_ids, stored, stored_meta, stored_columns, columns) -> tuple[np.ndarray, np.ndarray]:
    """(positions of ``rows`` to write, stored ids to delete): a row is rewritten when it is new,
    its [r, bias] differs, or its metadata differs (by value and type)."""
    order = np.argsort(rows.ids, kind="stable")
    sorted_ids = rows.ids[order]
    pos = np.searchsorted(sorted_ids, stored_ids)
    pos = np.minimum(pos, max(len(sorted_ids) - 1, 0))
    present = (sorted_ids[pos] == stored_ids) if len(sorted_ids) else np.zeros(len(stored_ids), bool)
    removed = stored_ids[~present]
    current = np.zeros(len(rows), bool)
    where = order[pos[present]]  # row positions of stored items still present
    if len(where):
        same = np.all(stored[present] == rows.augmented[where], axis=1)
        if rows.metadata is not None or stored_meta is not None:
            new_meta = rows.metadata or [{}] * len(rows)
            old_meta = typed_records(stored_meta or [{}] * len(stored_ids), stored_columns)
            full = {k: None for k in (columns or {})}
            kept = np.flatnonzero(present)
            for n, (i, j) in enumerate(zip(where.tolist(), kept.tolist())):
                if same[n] and ({**full, **new_meta[i]} != {**full, **old_meta[j]} or _types(new_meta[i]) != _types(old_meta[j])):
                    same[n] = False
        current[where[same]] = True
    return np.flatnonzero(~current), removed


def _types(record: dict) -> dict:
    return {k: type(v) for k, v in record.items() if v is not None}


def typed_records(records: list, columns: dict | None) -> list[dict]:
    """Metadata records with every column present (missing -> None) and of its recorded type."""
    if not columns:
        return [{} for _ in records]
    from hubless.export.metadata import restore_value

    return [{k: restore_value((r or {}).get(k), t) for k, t in columns.items()} for r in records]


def typed_rows(rows: list, columns: dict | None) -> list:
    """Search rows with every metadata column present (missing -> None) and of its recorded
    type (a store that hands back 1 for a float column gives 1.0): identical in every store."""
    if not columns:
        return rows
    from hubless.export.metadata import restore_value

    return [[{"id": row["id"], **{k: restore_value(row.get(k), t) for k, t in columns.items()}} for row in hits] for hits in rows]
