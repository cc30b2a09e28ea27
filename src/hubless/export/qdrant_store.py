"""Qdrant store, in-process: the real Qdrant engine (``qdrant-edge-py``) on a local directory.

Each item is a point with two named vectors, both with the Dot distance (never Cosine: it
would normalise [r, bias] and break the correction): ``corrected`` = [r, bias(r)] and
``plain`` = r, and its metadata as payload. ``qdrant://path/collection`` is the directory
``path/collection/``: it holds versions (``v-<id>/shard`` and ``v-<id>/hubless.json`` with the
format version, spec, model, metric and dims) and a ``CURRENT`` file naming the live one, so a
re-export writes a new version and switches ``CURRENT`` atomically (the previous collection
serves until then, and stays intact if the export fails). With ``ann="HNSW"`` Qdrant indexes
both vectors with HNSW (built before the switch); searches use it unless ``exact=True``.
"""

from __future__ import annotations

import atexit
import json
import shutil
import uuid
from pathlib import Path

import numpy as np

from hubless.errors import AlreadyExists, InvalidInput, MissingDependencyError, NotFound
from hubless.export.base import directory_lock as writer_lock  # noqa: F401  (one writer at a time: export, sync)

#: HNSW candidates examined per query (at least 4 x top_k).
HNSW_EF = 128
ANN_TYPES = ("HNSW",)
#: Segments larger than this many KB get an HNSW index; "never" for exact-only collections.
_NEVER_INDEX_KB = 2**40


_OPEN: dict[str, object] = {}  # shard path -> the loaded shard, kept for searches


@atexit.register
def _close_kept() -> None:
    """Close what searches kept open (at interpreter exit)."""
    for kept in _OPEN.values():
        kept.close()
    _OPEN.clear()


def _qdrant():
    try:
        import qdrant_edge
    except ImportError:
        raise MissingDependencyError("exporting to Qdrant", "qdrant_edge", "qdrant") from None
    return qdrant_edge


def _current(folder: Path) -> Path | None:
    try:
        name = (folder / "CURRENT").read_text().strip()
    except OSError:
        return None
    return folder / name if name and (folder / name).is_dir() else None


def write(
    location: str,
    table: str,
    augmented: np.ndarray,
    plain: np.ndarray,
    metadata,
    info: dict,
    *,
    overwrite: bool,
    batch: int = 8192,
    ann: str | None = None,
    **_,
):
    """Write a new version of collection ``table`` under ``location`` and make it current."""
    from hubless._io import write_json, write_text
    from hubless.progress import progress_bar

    qd = _qdrant()
    if ann is not None and ann.upper() not in ANN_TYPES:
        raise InvalidInput(f"unsupported Qdrant index {ann!r}; choose {' or '.join(ANN_TYPES)}")
    folder = Path(location) / table
    old = _current(folder)
    if old is not None and not overwrite:
        raise AlreadyExists(f"collection {table!r} exists in {location}: pass overwrite=True (--overwrite) to replace it")
    version = folder / f"v-{uuid.uuid4().hex[:12]}"
    threshold = 1 if ann is not None else _NEVER_INDEX_KB
    config = qd.EdgeConfig(
        vectors={
            "corrected": qd.EdgeVectorParams(size=augmented.shape[1], distance=qd.Distance.Dot),
            "plain": qd.EdgeVectorParams(size=plain.shape[1], distance=qd.Distance.Dot),
        },
        optimizers=qd.EdgeOptimizersConfig(indexing_threshold=threshold),
    )
    try:
        shard = qd.EdgeShard.create(str(version / "shard"), config)
        try:
            n = augmented.shape[0]
            for lo in progress_bar(range(0, n, batch), None, desc="export"):
                hi = min(lo + batch, n)
                aug, pl = augmented[lo:hi].tolist(), plain[lo:hi].tolist()
                points = [
                    qd.Point(lo + i, {"corrected": aug[i], "plain": pl[i]}, None if not metadata else _payload(metadata[lo + i], lo + i))
                    for i in range(hi - lo)
                ]
                shard.update(qd.UpdateOperation.upsert_points(points))
            if ann is not None:
                shard.optimize()
            shard.flush()
        finally:
            shard.close()
        write_json(version / "hubless.json", info)
        write_text(folder / "CURRENT", version.name)  # atomic: readers see the old or the new version
    except BaseException:
        shutil.rmtree(version, ignore_errors=True)
        raise
    if old is not None:
        kept = _OPEN.pop(str(old / "shard"), None)
        if kept is not None:
            kept.close()
        shutil.rmtree(old, ignore_errors=True)
    return folder


def _payload(record, item: int | None = None) -> dict | None:
    """An item's metadata as a Qdrant payload: JSON scalars kept, anything else as its str();
    text that is not valid Unicode (a lone surrogate) is refused with a ValueError naming it."""
    if record is None:
        return None
    out = {str(k): v if v is None or isinstance(v, (str, int, float, bool)) else str(v) for k, v in record.items()}
    for key, value in out.items():
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidInput(
                    f"metadata {key!r} of item {item} is not valid Unicode text ({value!r}): fix or drop it and export again"
                ) from None
    return out


def open_table(location: str, table: str):
    """(the loaded shard, hubless metadata) of the current version of collection ``table``."""
    qd = _qdrant()
    folder = Path(location) / table
    version = _current(folder)
    if version is None:
        raise NotFound(f"no collection {table!r} in Qdrant store {location}")
    try:
        info = json.loads((version / "hubless.json").read_text())
    except (OSError, ValueError):
        raise InvalidInput(f"collection {table!r} in {location} was not written by hubless export (no hubless.json)") from None
    key = str(version / "shard")
    if key not in _OPEN:  # a re-export is a new version: a new key
        for stale in [k for k in _OPEN if k.startswith(str(folder) + "/")]:
            _OPEN.pop(stale).close()
        _OPEN[key] = qd.EdgeShard.load(key)
    return _OPEN[key], info


def query(shard, vectors: np.ndarray, k: int, column: str = "vector", *, exact: bool = False, hnsw_ef: int = HNSW_EF, **_):
    """Top-k by dot product per query, as one planned batch: (scores, ids, rows)."""
    qd = _qdrant()
    using = "corrected" if column == "vector" else "plain"
    params = qd.SearchParams(exact=True) if exact else qd.SearchParams(hnsw_ef=max(int(hnsw_ef), 4 * k))
    requests = [
        qd.QueryRequest(limit=k, query=qd.Query.Nearest(v, using=using), with_payload=True, params=params) for v in vectors.tolist()
    ]
    return collect_hits(shard.query_batch(qd.QueryBatchRequest(requests)), k)


def collect_hits(results, k: int):
    """(scores, ids, rows) from Qdrant's scored points per query (either client's: ``id``,
    ``score``, ``payload``); ties go to the lower id, as in hubless; empty slots are id -1."""
    scores = np.full((len(results), k), -np.inf, np.float32)
    ids = np.full((len(results), k), -1, np.int64)
    rows = []
    for i, hits in enumerate(results):
        hits = sorted(hits, key=lambda h: (-h.score, h.id))
        for j, hit in enumerate(hits):
            ids[i, j], scores[i, j] = hit.id, hit.score
        rows.append([{"id": int(h.id), **(h.payload or {})} for h in hits])
    return scores, ids, rows


def collect_rows(scroll) -> tuple[np.ndarray, np.ndarray]:
    """(ids, [r, bias] rows) by id from ``scroll(offset) -> (records, next offset)`` pages."""
    ids, rows, offset = [], [], None
    while True:
        records, offset = scroll(offset)
        ids += [r.id for r in records]
        rows += [r.vector["corrected"] for r in records]
        if offset is None:
            break
    order = np.argsort(ids, kind="stable")
    return np.asarray(ids, np.int64)[order], np.asarray(rows, np.float32).reshape(len(ids), -1)[order]


def read_rows(shard) -> tuple[np.ndarray, np.ndarray]:
    """(ids, [r, bias] rows) stored in the collection, by id (scrolled in pages)."""
    qd = _qdrant()
    return collect_rows(
        lambda offset: shard.scroll(qd.ScrollRequest(offset=offset, limit=4096, with_vector=["corrected"], with_payload=False))
    )


def apply_changes(shard, ids: np.ndarray, augmented: np.ndarray, plain: np.ndarray, metadata, removed: np.ndarray, info: dict) -> None:
    """Upsert rows ``ids``, delete ``removed`` and rewrite hubless.json of the current version.
    Qdrant applies each operation through its write-ahead log; an interrupted sync is completed
    by running it again."""
    from hubless._io import write_json

    qd = _qdrant()
    aug, pl = augmented.tolist(), plain.tolist()
    points = [
        qd.Point(int(i), {"corrected": aug[n], "plain": pl[n]}, None if not metadata else _payload(metadata[n], int(i)))
        for n, i in enumerate(ids)
    ]
    if points:
        shard.update(qd.UpdateOperation.upsert_points(points))
    if len(removed):
        shard.update(qd.UpdateOperation.delete_points([int(i) for i in removed]))
    shard.flush()
    folder = next(Path(k).parent for k, v in _OPEN.items() if v is shard)
    write_json(folder / "hubless.json", info)
