"""A Qdrant server (``qdrant+http://host:port/collection``, ``qdrant+https://...``) with ``qdrant-client``.

The same layout as the in-process store (:mod:`hubless.export.qdrant_store`): each item is a
point with two named vectors, both with Distance.DOT (never COSINE: it would normalise
[r, bias] and break the correction), ``corrected`` = [r, bias(r)] and ``plain`` = r, and its
metadata as payload. The hubless ``info`` is a reserved point of the collection (id
:data:`INFO_ID`, a UUID no item id can take, with no vectors, so no search returns it).
``collection`` is an alias: an export writes a new physical collection
``<collection>__hubless_<hex>`` and then switches the alias to it in one atomic alias update;
the previous collection serves until then, stays intact if the export fails, and is dropped by
the next export (with any a killed export left). Several processes may search it. Tested
against qdrant-client's own engine standing in for a server (``tests/export/test_export_qdrant.py``):
no Qdrant server can be started here; a server that does not answer is a
:class:`~hubless.export.base.StoreUnavailable` error.
"""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from typing import Any

import numpy as np

from hubless.errors import HublessError, InvalidInput, NotFound, optional_import
from hubless.export.base import StaleRead, StoreUnavailable, StoreURI, VectorStore, register, split_location
from hubless.export.qdrant_store import QdrantOptions, check_point_ids, collect_hits, collect_rows
from hubless.export.store_rows import Rows

#: The reserved id of the point that holds the hubless info (payload key "hubless").
INFO_ID = "00000000-0000-0000-0000-00000000b1a5"

_CLIENTS: dict[str, Any] = {}  # url -> client, kept for searches


def qdrant_models():
    return optional_import("qdrant_client.models", "exporting to a Qdrant server", "qdrant-server", "qdrant_client")


def connect(url: str):
    """The kept ``QdrantClient`` of ``url`` (``http://host:port``); one that does not answer is
    a StoreUnavailable error."""
    qdrant_models()
    from qdrant_client import QdrantClient

    if url not in _CLIENTS:
        from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

        # check_compatibility=False: its version check runs in a thread of its own and only
        # warns; the probe below reaches the server before any work and fails in one line.
        client = QdrantClient(url=url, check_compatibility=False, timeout=10)
        try:  # the client connects lazily: reach the server now, so a wrong URL is one clear error
            client.get_collections()
        except (ResponseHandlingException, UnexpectedResponse) as exc:
            client.close()
            if isinstance(exc, UnexpectedResponse):
                detail = f"it answered HTTP {exc.status_code} {exc.reason_phrase} (is it a Qdrant server? an API key?)"
            else:
                detail = " ".join(str(exc).split())
            raise StoreUnavailable(f"cannot reach the Qdrant server at {url}: {detail}") from None
        _CLIENTS[url] = client
    return _CLIENTS[url]


@contextlib.contextmanager
def _answering(url: str):
    """Turn a lost connection to the server into StoreUnavailable (hubless errors pass)."""
    try:
        yield
    except HublessError:
        raise
    except Exception as exc:
        name = type(exc).__name__
        if name in ("ResponseHandlingException", "ConnectError", "ConnectTimeout", "ReadTimeout", "RemoteProtocolError"):
            _CLIENTS.pop(url, None)
            raise StoreUnavailable(f"the Qdrant server at {url} did not answer: {exc}") from None
        raise


@register
class QdrantServerStore(VectorStore):
    schemes = ("qdrant+http", "qdrant+https")
    label = "Qdrant server"
    extra = "qdrant-server"
    ann_types = {"HNSW": "ef_search"}
    knob_range = {"ef_search": (128, 8192)}
    Options = QdrantOptions

    @classmethod
    def uri_form(cls, scheme=None) -> str:
        return f"{scheme or 'qdrant+http'}://host:port/collection"

    @classmethod
    def parse(cls, uri: str) -> StoreURI:
        from urllib.parse import urlsplit

        scheme = uri.partition("://")[0]
        location, table = split_location(uri, scheme, cls.uri_form(scheme))
        url = f"{scheme[len('qdrant+') :]}://{location}"
        try:
            parts = urlsplit(url)
            port = parts.port  # ValueError when it is not a number in 0-65535
        except ValueError:
            parts, port = None, -1
        if parts is None or not parts.hostname or port == -1 or parts.query or parts.fragment:
            raise InvalidInput(f"store URI {uri!r}: {location!r} is not a server address (host or host:port): {cls.uri_form(scheme)}")
        return StoreURI(scheme, url, table)

    def writer_lock(self):
        """No lock across clients: each export writes a physical collection of its own name and
        switches the alias in one atomic update (the last export wins; none is half-written)."""
        return contextlib.nullcontext()

    @property
    def client(self):
        return connect(self.location)

    def _target(self) -> str | None:
        """The physical collection that alias (or collection) ``table`` serves, or None."""
        with _answering(self.location):
            client = self.client
            for alias in client.get_aliases().aliases:
                if alias.alias_name == self.table:
                    return alias.collection_name
            return self.table if client.collection_exists(self.table) else None

    def exists(self) -> bool:
        return self._target() is not None

    def clean_leftovers(self) -> None:
        keep = self._target()
        own = re.compile(re.escape(self.table) + r"__hubless_[0-9a-f]{12}")
        with _answering(self.location):
            for c in self.client.get_collections().collections:
                if own.fullmatch(c.name) and c.name != keep:
                    self.client.delete_collection(c.name)

    def write_table(self, rows: Rows, info: dict, options, *, batch: int, ann: str | None) -> None:
        models = qdrant_models()
        check_point_ids(rows.ids, "Qdrant")
        with _answering(self.location):
            client = self.client
            old = self._target()
            new = f"{self.table}__hubless_{uuid.uuid4().hex[:12]}"
            dot = models.Distance.DOT
            hnsw = None
            if ann is not None and (options.m or options.ef_construct):
                hnsw = models.HnswConfigDiff(m=options.m, ef_construct=options.ef_construct)
            client.create_collection(
                new,
                vectors_config={
                    "corrected": models.VectorParams(size=int(rows.augmented.shape[1]), distance=dot, hnsw_config=hnsw),
                    "plain": models.VectorParams(size=int(rows.plain.shape[1]), distance=dot),
                },
                optimizers_config=None if ann is not None else models.OptimizersConfigDiff(indexing_threshold=0),
            )
            try:
                for part in rows.batches(batch):
                    client.upsert(new, _points(models, part), wait=True)
                client.upsert(new, [_info_point(models, info)], wait=True)
                ops = []
                if old is not None and old != self.table:
                    ops.append(models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=self.table)))
                elif old == self.table:  # a plain collection of that name (not made by hubless): it must go before the alias exists
                    client.delete_collection(self.table)
                ops.append(models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=new, alias_name=self.table)))
                client.update_collection_aliases(change_aliases_operations=ops)  # one atomic switch
            except BaseException:
                with contextlib.suppress(Exception):
                    client.delete_collection(new)
                raise

    @contextlib.contextmanager
    def reading(self):
        """One physical collection for the info and the rows of a search."""
        self._pinned: Any = self._physical()
        try:
            yield
        except (ValueError, NotFound) as exc:
            if "not found" in str(exc).lower():  # dropped by the exports after next
                raise StaleRead(str(exc)) from None
            raise
        except Exception as exc:
            if "not found" in str(exc).lower() or "doesn't exist" in str(exc).lower():
                raise StaleRead(str(exc)) from None
            raise
        finally:
            self._pinned = None

    @contextlib.contextmanager
    def changing(self):
        """One physical collection for a sync: writers on other clients are not locked out (the
        server has no lock hubless can hold), so an export switching the alias meanwhile must
        not receive a diff computed against the collection it replaced; the sync then changes
        the replaced collection, and the export wins whole."""
        self._pinned = self._physical()
        try:
            yield
        finally:
            self._pinned = None

    def _physical(self) -> str:
        pinned = getattr(self, "_pinned", None)
        if pinned is not None:
            return pinned
        name = self._target()
        if name is None:
            raise NotFound(f"no collection {self.table!r} in Qdrant server {self.location}")
        return name

    def read_info(self) -> dict:
        name = self._physical()
        with _answering(self.location):
            found = self.client.retrieve(name, [INFO_ID], with_payload=True, with_vectors=False)
        if not found or "hubless" not in (found[0].payload or {}):
            raise InvalidInput(f"collection {self.table!r} in {self.location} was not written by hubless export (no info point {INFO_ID})")
        return json.loads(found[0].payload["hubless"])

    def write_info(self, info: dict) -> None:
        models = qdrant_models()
        with _answering(self.location):
            self.client.upsert(self._physical(), [_info_point(models, info)], wait=True)

    def native_knobs(self, knob: str, value: int, k: int, options: dict) -> dict:
        return {"hnsw_ef": max(value, k)}

    def query(self, vectors: np.ndarray, k: int, *, column: str, exact: bool, knobs: dict):
        models = qdrant_models()
        name = self._physical()
        using = "corrected" if column == "vector" else "plain"
        params = models.SearchParams(exact=True) if exact or not knobs else models.SearchParams(hnsw_ef=int(knobs["hnsw_ef"]))
        requests = [models.QueryRequest(query=v, using=using, limit=k, with_payload=True, params=params) for v in vectors.tolist()]
        with _answering(self.location):
            return collect_hits([res.points for res in self.client.query_batch_points(name, requests)], k)

    def read_rows(self):
        models = qdrant_models()
        name = self._physical()
        skip = models.Filter(must_not=[models.HasIdCondition(has_id=[INFO_ID])])
        with _answering(self.location):
            return collect_rows(
                lambda offset: self.client.scroll(
                    name, scroll_filter=skip, limit=4096, offset=offset, with_vectors=["corrected"], with_payload=True
                )
            )

    def apply_changes(self, rows: Rows, removed: np.ndarray, info: dict) -> None:
        """Upsert rows, delete ``removed`` and rewrite the info point (each a server operation;
        an interrupted sync is completed by running it again)."""
        models = qdrant_models()
        check_point_ids(rows.ids, "Qdrant")
        name = self._physical()
        with _answering(self.location):
            for lo in range(0, len(rows), 8192):
                self.client.upsert(name, _points(models, rows.slice(lo, lo + 8192)), wait=True)
            if len(removed):
                self.client.delete(name, models.PointIdsList(points=[int(i) for i in removed]), wait=True)
            self.client.upsert(name, [_info_point(models, info)], wait=True)

    def drop_table(self) -> bool:
        own = re.compile(re.escape(self.table) + r"__hubless_[0-9a-f]{12}")
        with _answering(self.location):
            existed = self._target() is not None
            for alias in self.client.get_aliases().aliases:
                if alias.alias_name == self.table:
                    self.client.update_collection_aliases(
                        change_aliases_operations=[
                            qdrant_models().DeleteAliasOperation(delete_alias=qdrant_models().DeleteAlias(alias_name=self.table))
                        ]
                    )
            for c in self.client.get_collections().collections:
                if own.fullmatch(c.name):
                    self.client.delete_collection(c.name)
        return existed


def _points(models, rows: Rows) -> list:
    aug, pl, ids = rows.augmented.tolist(), rows.plain.tolist(), rows.ids.tolist()
    meta = rows.metadata
    return [
        models.PointStruct(id=ids[i], vector={"corrected": aug[i], "plain": pl[i]}, payload=None if meta is None else meta[i])
        for i in range(len(ids))
    ]


def _info_point(models, info: dict):
    return models.PointStruct(id=INFO_ID, vector={}, payload={"hubless": json.dumps(info)})
