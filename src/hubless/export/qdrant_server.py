"""Qdrant server store (``qdrant+http://host:port/collection``, ``qdrant+https://...``) with ``qdrant-client``.

The same layout as the in-process store (:mod:`hubless.export.qdrant_store`): each item is a
point with two named vectors, both with Distance.DOT (never COSINE: it would normalise
[r, bias] and break the correction), ``corrected`` = [r, bias(r)] and ``plain`` = r, and its
metadata as payload. The hubless ``info`` (format version, spec, model, metric, dims, query
state) is a reserved point of the collection (id :data:`INFO_ID`, a UUID no gallery position
can take, with no vectors, so no search returns it). ``collection`` is an alias: an export writes
a new physical collection ``<collection>__hubless_<hex>`` and then switches the alias to it in one
atomic alias update, so the previous collection serves until then and stays intact if the
export fails. Tested against qdrant-client's own engine standing in for a server
(``tests/test_export_qdrant.py``); no Qdrant server was available to test against.
"""

from __future__ import annotations

import contextlib
import json
import uuid

import numpy as np

from hubless.errors import AlreadyExists, InvalidInput, MissingDependencyError, NotFound

#: The reserved id of the point that holds the hubless info (payload key "hubless").
INFO_ID = "00000000-0000-0000-0000-00000000b1a5"
#: HNSW candidates examined per query (at least 4 x top_k).
HNSW_EF = 128
ANN_TYPES = ("HNSW",)

_CLIENTS: dict[str, object] = {}  # url -> client, kept for searches


def writer_lock(location: str, table: str):
    """No lock across clients: each export writes a physical collection of its own name and
    switches the alias in one atomic update (the last export wins; none is half-written)."""
    return contextlib.nullcontext()


def _models():
    try:
        from qdrant_client import models
    except ImportError:
        raise MissingDependencyError("exporting to a Qdrant server", "qdrant_client", "qdrant-server") from None
    return models


def _connect(url: str):
    """The kept ``QdrantClient`` of ``url`` (``http://host:port``)."""
    _models()
    from qdrant_client import QdrantClient

    if url not in _CLIENTS:
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        # check_compatibility=False: its version check runs in a thread of its own and only
        # warns; the probe below reaches the server before any work and fails in one line.
        client = QdrantClient(url=url, check_compatibility=False)
        try:  # the client connects lazily: reach the server now, so a wrong URL is one clear error
            client.get_collections()
        except (ResponseHandlingException, UnexpectedResponse) as exc:
            client.close()
            if isinstance(exc, UnexpectedResponse):
                detail = f"it answered HTTP {exc.status_code} {exc.reason_phrase} (is it a Qdrant server? an API key?)"
            else:
                detail = " ".join(str(exc).split())
            raise ConnectionError(f"cannot reach the Qdrant server at {url}: {detail}") from None
        _CLIENTS[url] = client
    return _CLIENTS[url]


def _target(client, name: str) -> str | None:
    """The physical collection that alias (or collection) ``name`` serves, or None."""
    for alias in client.get_aliases().aliases:
        if alias.alias_name == name:
            return alias.collection_name
    return name if client.collection_exists(name) else None


def _point(models, pid, corrected, plain, record):
    from hubless.export.qdrant_store import _payload

    return models.PointStruct(id=pid, vector={"corrected": corrected, "plain": plain}, payload=_payload(record, pid))


def _info_point(models, info: dict):
    return models.PointStruct(id=INFO_ID, vector={}, payload={"hubless": json.dumps(info)})


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
    """Write a new physical collection, then point alias ``table`` at it and drop the old one.
    Without ``ann`` the collection is never indexed (exact scans); ``ann="HNSW"`` keeps Qdrant's
    default HNSW indexing."""
    from hubless.progress import progress_bar

    models = _models()
    if ann is not None and ann.upper() not in ANN_TYPES:
        raise InvalidInput(f"unsupported Qdrant index {ann!r}; choose {' or '.join(ANN_TYPES)}")
    client = _connect(location)
    old = _target(client, table)
    if old is not None and not overwrite:
        raise AlreadyExists(f"collection {table!r} exists in {location}: pass overwrite=True (--overwrite) to replace it")
    new = f"{table}__hubless_{uuid.uuid4().hex[:12]}"
    dot = models.Distance.DOT
    client.create_collection(
        new,
        vectors_config={
            "corrected": models.VectorParams(size=int(augmented.shape[1]), distance=dot),
            "plain": models.VectorParams(size=int(plain.shape[1]), distance=dot),
        },
        optimizers_config=None if ann is not None else models.OptimizersConfigDiff(indexing_threshold=0),
    )
    try:
        n = augmented.shape[0]
        for lo in progress_bar(range(0, n, batch), None, desc="export"):
            hi = min(lo + batch, n)
            aug, pl = augmented[lo:hi].tolist(), plain[lo:hi].tolist()
            points = [_point(models, lo + i, aug[i], pl[i], None if not metadata else metadata[lo + i]) for i in range(hi - lo)]
            client.upsert(new, points, wait=True)
        client.upsert(new, [_info_point(models, info)], wait=True)
        ops = []
        if old is not None and old != table:
            ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=table)))
        elif old == table:  # a plain collection of that name (not made by hubless): it must go before the alias exists
            client.delete_collection(table)
        ops.append(models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=new, alias_name=table)))
        client.update_collection_aliases(change_aliases_operations=ops)  # one atomic switch
    except BaseException:
        client.delete_collection(new)
        raise
    if old is not None and old != table:
        client.delete_collection(old)
    return f"{location}/{table}"


def open_table(location: str, table: str):
    """((client, physical collection), hubless info) of collection (alias) ``table``."""
    client = _connect(location)
    name = _target(client, table)
    if name is None:
        raise NotFound(f"no collection {table!r} in Qdrant server {location}")
    found = client.retrieve(name, [INFO_ID], with_payload=True, with_vectors=False)
    if not found or "hubless" not in (found[0].payload or {}):
        raise InvalidInput(f"collection {table!r} in {location} was not written by hubless export (no info point {INFO_ID})")
    return (client, name), json.loads(found[0].payload["hubless"])


def query(handle, vectors: np.ndarray, k: int, column: str = "vector", *, exact: bool = False, hnsw_ef: int = HNSW_EF, **_):
    """Top-k by dot product per query, in one ``query_batch_points`` request: (scores, ids, rows)."""
    models = _models()
    client, name = handle
    using = "corrected" if column == "vector" else "plain"
    params = models.SearchParams(exact=True) if exact else models.SearchParams(hnsw_ef=max(int(hnsw_ef), 4 * k))
    requests = [models.QueryRequest(query=v, using=using, limit=k, with_payload=True, params=params) for v in vectors.tolist()]
    from hubless.export.qdrant_store import collect_hits

    return collect_hits([res.points for res in client.query_batch_points(name, requests)], k)


def read_rows(handle) -> tuple[np.ndarray, np.ndarray]:
    """(ids, [r, bias] rows) stored in the collection, by id (scrolled in pages, the info point skipped)."""
    models = _models()
    client, name = handle
    from hubless.export.qdrant_store import collect_rows

    skip = models.Filter(must_not=[models.HasIdCondition(has_id=[INFO_ID])])
    return collect_rows(
        lambda offset: client.scroll(name, scroll_filter=skip, limit=4096, offset=offset, with_vectors=["corrected"], with_payload=False)
    )


def apply_changes(handle, ids: np.ndarray, augmented: np.ndarray, plain: np.ndarray, metadata, removed: np.ndarray, info: dict) -> None:
    """Upsert rows ``ids``, delete ``removed`` and rewrite the info point (each a server
    operation; an interrupted sync is completed by running it again)."""
    models = _models()
    client, name = handle
    aug, pl = augmented.tolist(), plain.tolist()
    points = [_point(models, int(i), aug[n], pl[n], None if not metadata else metadata[n]) for n, i in enumerate(ids)]
    for lo in range(0, len(points), 8192):
        client.upsert(name, points[lo : lo + 8192], wait=True)
    if len(removed):
        client.delete(name, models.PointIdsList(points=[int(i) for i in removed]), wait=True)
    client.upsert(name, [_info_point(models, info)], wait=True)
