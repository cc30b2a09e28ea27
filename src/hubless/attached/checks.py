"""Whether an attached collection is still the one its sidecar describes: the checks an open
collection makes before it answers (docs/attach.md, "What is detected").

* **At open** (:func:`verify_open`): the count; then, on a store with a version mark
  (:meth:`~hubless.attached.sources.base.Source.version`: a FAISS file's inode, size and
  modification time, a LanceDB table's version, a pgvector table's count and sum of ``xmin``),
  the mark against the one the sidecar recorded; on a store without one (Qdrant, Chroma,
  Milvus), :data:`~hubless.attached.digests.SAMPLE` items drawn at random, their vectors read
  and compared with their digests. Any difference is refused
  (:class:`~hubless.errors.Conflict`: run ``hubless attach --update``), except a FAISS file
  whose mark changed: the file is read whole anyway, so every vector is compared with its
  digest (:func:`compare_all`) and a file rewritten with the same content is served.
* **Before each search** (:func:`ensure_fresh`): a sidecar an update rewrote since it was read
  is read again (and checked as at open), so a long-lived handle (``hubless serve``) follows
  ``hubless attach --update``; then the same mark, read again (a changed mark is refused, or for
  a FAISS file re-checked whole, before the answer); on a store without a mark, the count, and a
  new random sample every :data:`RECHECK_SECONDS` of a long-lived handle.
* **After each search** (:func:`check_hits`), on a store without a mark: the hits about to be
  served are read from the store and compared with their digests, so an item changed in place
  that enters an answer is refused, not ranked with its old biases, and a reserve item changed
  or deleted in the store is never served from its stale copy.

What is not seen without a full read (``hubless attach --update --full``): on a store without a
version mark, a vector replaced in place that the samples miss and that enters no answer (it may
still push another item out of one: its store score is new, its biases old), or an item removed
and another added, between two samples. A sidecar written before digests has none to compare: its open checks the old 32-item
sample hash, and its answers are never claimed exact.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from hubless.attached.digests import SAMPLE, changed_in_sample, sample_positions, vector_digests
from hubless.attached.sources.base import BATCH
from hubless.errors import Conflict

__all__ = [
    "RECHECK_SECONDS",
    "SAMPLE",
    "check_count",
    "check_hits",
    "check_sample",
    "compare_all",
    "ensure_fresh",
    "sidecar_mark",
    "verify_open",
]

#: How often a long-lived handle of a store without a version mark reads a new sample.
RECHECK_SECONDS = 10.0


def _changed(collection, what: str) -> Conflict:
    return Conflict(
        f"{collection.source.uri} changed since it was attached ({what}): run hubless attach --update "
        "(hubless.attached.update; --full after vectors were replaced in place) before searching"
    )


def check_count(collection) -> None:
    n = collection.source.count()
    if n != collection.ntotal:
        raise _changed(collection, f"{collection.ntotal} items then, {n} now")


def verify_open(collection) -> None:
    """The checks of an open (see the module docstring)."""
    check_count(collection)
    if collection.sidecar.digests is None:
        _legacy_sample(collection)
        collection.mark = collection.source.version()  # no mark recorded: from now on, this one
        return
    mark = collection.source.version()
    if mark is None:
        check_sample(collection)
    elif mark != collection.mark:
        _mark_changed(collection, mark)
    collection.checked_at = time.monotonic()


def sidecar_mark(sidecar) -> list[int] | None:
    """The mark of the sidecar version on disk (its ``CURRENT`` file's inode, size and
    modification time; None for a sidecar not read from a folder)."""
    if sidecar.path is None:
        return None
    try:
        stat = (Path(sidecar.path) / "CURRENT").stat()
    except OSError:
        return None
    return [int(stat.st_ino), int(stat.st_size), int(stat.st_mtime_ns)]


def ensure_fresh(collection) -> None:
    """The checks before a search (see the module docstring); a sidecar an update rewrote since
    it was read is read again first."""
    if collection.reload():
        return  # read and checked as an open is
    mark = collection.source.version()
    if mark is not None:
        if mark != collection.mark:
            check_count(collection)
            _mark_changed(collection, mark)
        return
    check_count(collection)
    if collection.sidecar.digests is not None and time.monotonic() - collection.checked_at > RECHECK_SECONDS:
        check_sample(collection)
        collection.checked_at = time.monotonic()


def _mark_changed(collection, mark) -> None:
    if not collection.source.reads_whole or collection.sidecar.digests is None:
        raise _changed(collection, f"its version mark was {collection.mark}, now {mark}")
    found = compare_all(collection.source, collection.sidecar)
    if any(found.values()):
        raise _changed(collection, ", ".join(f"{v} {k}" for k, v in found.items()))
    collection.mark = mark  # the same content under a new mark: served


def check_sample(collection) -> None:
    """:data:`SAMPLE` items from a random offset: read, compared with their digests."""
    ids = collection.sidecar.ids
    cursor = int(np.random.default_rng().integers(0, max(ids.size, 1)))
    changed, gone = changed_in_sample(collection.source, ids, collection.sidecar.digests, sample_positions(ids.size, cursor), BATCH)
    if gone.size:
        raise _changed(collection, f"item {int(gone[0])} is gone")
    if changed.size:
        raise _changed(collection, f"the vector of item {int(changed[0])} differs from the one attached")


def compare_all(source, sidecar, batch: int = BATCH) -> dict:
    """Every item of ``source`` against ``sidecar``: how many were ``added``, ``removed`` and
    ``changed`` (a vector whose digest differs)."""
    ids, digests = sidecar.ids, sidecar.digests
    n = ids.size
    added = changed = seen = 0
    for item_ids, vectors in source.scan(batch):
        pos = np.minimum(np.searchsorted(ids, item_ids), max(n - 1, 0))
        known = (ids[pos] == item_ids) if n else np.zeros(item_ids.shape, bool)
        added += int((~known).sum())
        seen += int(known.sum())
        changed += int((known & (vector_digests(vectors) != digests[pos])).sum())
    return {"added": added, "removed": n - seen, "changed": changed}


def check_hits(collection, ids: np.ndarray, reserve: np.ndarray) -> None:
    """The hits about to be served (``ids``; ``reserve``: which of them were scored from the
    reserve's copies), read from a store without a version mark and compared with their digests:
    an item changed in place, or a reserve item changed or deleted, is refused."""
    if collection.sidecar.digests is None or ids.size == 0 or collection.source.version() is not None:
        return
    want = np.unique(ids)
    present, vectors = collection.source.fetch_present(want)
    if present.size < want.size:
        gone = int(np.setdiff1d(want, present)[0])
        raise _changed(collection, f"{'reserve item' if gone in set(ids[reserve].tolist()) else 'item'} {gone} is gone")
    rows = np.searchsorted(collection.sidecar.ids, present)
    differ = vector_digests(vectors) != collection.sidecar.digests[rows]
    if differ.any():
        item = int(present[differ][0])
        what = "reserve item" if item in set(ids[reserve].tolist()) else "item"
        raise _changed(collection, f"{what} {item} was changed in place")


def _legacy_sample(collection) -> None:
    """A sidecar written before digests: its 32 sampled items' hash."""
    from hubless.attached.sources.base import sample_hash

    try:
        _, digest = sample_hash(collection.source, collection.sidecar.ids)
    except KeyError:  # NotFound: a sampled id is gone
        digest = None
    if digest != collection.sidecar.fingerprint.get("sample_sha256"):
        raise _changed(collection, "the sampled items' vectors or ids differ")
