"""Another query bank for an index, as a version: made aside, then adopted or kept as rejected.

A bank learned from traffic (:mod:`hubless.learning`) changes every item's bias, so it is not a
write of a few rows: :func:`candidate` makes the whole new version in memory (the live items
refitted on the new bank, :func:`with_query_bank`; the served index is not touched and searches
go on), which can be searched and judged like any index; then

* :func:`adopt` commits it as the index's next version, in one atomic switch of ``CURRENT``
  (a search holding the old version finishes on it), refusing if the index changed since the
  candidate was made (its statistics would describe other items);
* :func:`keep_rejected` records it as a kept version that is *not* current (``CURRENT`` is not
  touched: :func:`hubless.index.disk.keep_version`): listed by :meth:`Index.versions
  <hubless.index.Index.versions>`, searched with ``Index.load(path, version=v)``, made current
  with :meth:`Index.restore <hubless.index.Index.restore>` if a person decides so.

Both need an index opened live from a directory that keeps versions (``keep_versions`` >= 1);
an index in memory adopts in memory and keeps no rejected version.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from hubless._validation import as_embeddings
from hubless.corrections import make_additive
from hubless.engine import BankStatistics, compute_statistics
from hubless.errors import Conflict, InvalidInput
from hubless.index import writer
from hubless.index.live import Snapshot

if TYPE_CHECKING:
    from hubless.index.index import Index

__all__ = ["Candidate", "adopt", "candidate", "keep_rejected", "version_of", "with_query_bank"]


@dataclass(frozen=True, eq=False)
class Candidate:
    """A version of an index with another query bank, not committed: ``index`` (in memory, a
    full :class:`~hubless.index.Index` to search and judge) and the version it was made from."""

    index: Index
    origin: Snapshot

    @property
    def version(self) -> Snapshot:
        """The candidate's own version (what :func:`version_of` gives once it is adopted)."""
        return self.index._snap

    @property
    def bias(self) -> np.ndarray:
        """(n_items, c) bias columns of the live items, in the order of the origin's live items."""
        return self.index._snap.bias

    @property
    def origin_bias(self) -> np.ndarray:
        """The origin version's bias columns of the same items, in the same order."""
        return self.origin.bias[self.origin.live_rows]


def version_of(index: Index) -> Snapshot:
    """The version ``index`` holds now: an opaque token, the same object until a write (here or
    caught up from elsewhere) changes it; a candidate made from it records it as its origin."""
    return index._snap


def candidate(index: Index, bank, statistics: BankStatistics | None = None, *, progress: bool | None = None) -> Candidate:
    """``index``'s current version with its query bank replaced by ``bank``: every live item
    refitted on it (``statistics``: the live items' query-bank statistics against ``bank``,
    computed already, e.g. merged from parts; else computed here). ``index`` is not changed."""
    from hubless.index.index import Index

    snap = index._snap
    if not snap.serving.needs_query_bank:
        raise InvalidInput(f"{snap.spec} uses no query bank: there is nothing to learn")
    rows = as_embeddings(bank, "bank", normalize=snap.normalize, dim=snap.dim)
    made = Index.__new__(Index)
    made._setup(with_query_bank(snap, rows, statistics, progress=progress))
    return Candidate(made, snap)


def with_query_bank(
    snap: Snapshot, bank: np.ndarray, statistics: BankStatistics | None = None, *, progress: bool | None = None
) -> Snapshot:
    """``snap`` with its query bank replaced by ``bank`` (validated float32): the live items'
    query-bank statistics against it (``statistics``: computed already, in the live items'
    order, e.g. merged from parts by :mod:`hubless.learning.refit`; else computed here, n_items x
    n_bank) replace the old bank's, the gallery bank's are kept; every bias changes: a new base
    (:func:`hubless.index.writer.rebased`). Equals a fresh fit of the live items on ``bank`` to
    float rounding (bitwise when the items are one base and the statistics are computed here:
    kept gallery-bank statistics of rows written since the base came from other BLAS calls)."""
    from hubless.engine.updates import side_request

    snap.verify_mapped()
    gallery, kept = snap.logical()
    if statistics is None:
        statistics = compute_statistics(gallery, bank, None, side_request(snap.request, "query"), progress=progress)
    if (statistics.n_gallery, statistics.n_query_bank) != (gallery.shape[0], bank.shape[0]):
        raise InvalidInput(
            f"the statistics describe {statistics.n_gallery} items x {statistics.n_query_bank} bank queries; "
            f"the index has {gallery.shape[0]} live items and the bank {bank.shape[0]} queries"
        )
    query_side = {name: getattr(statistics, name) for name in QUERY_SIDE}
    stats = replace(kept, n_query_bank=bank.shape[0], query_lse=dict(statistics.query_lse), **query_side)
    corr = make_additive(snap.spec).set_params(normalize=snap.normalize).fit(gallery, statistics=stats)
    return writer.rebased(snap, corr, {**snap.banks, "query_bank": bank})


#: The statistics of the query bank (besides its size and log-sum-exps) that a new bank replaces.
QUERY_SIDE = ("query_bank_mean", "query_topk", "query_probes", "query_activation", "query_activation_scores")


def adopt(index: Index, made: Candidate) -> int | None:
    """Commit ``made`` as ``index``'s next version (atomically; for an index opened live, on
    disk at once); returns its number (None for an index in memory). A
    :class:`~hubless.errors.Conflict` if ``index`` changed since ``made`` was made."""

    def change(snap: Snapshot):
        _check_origin(snap, made)
        return made.index._snap, None

    index._write(change, full=True)
    return None if index._dir is None else int(index._dir.manifest["version"])


def keep_rejected(index: Index, made: Candidate) -> int | None:
    """Record ``made`` as a kept version of ``index``'s directory that is not current, under
    the index's write lock; returns its number (None for an index in memory, or one that keeps
    no versions: nothing is written)."""
    bound = index._dir
    if bound is None or index.keep_versions < 1:
        return None
    with index._lock, bound.lock(index.lock_timeout):
        index._catch_up()
        return bound.record(made.index._snap)


def _check_origin(snap: Snapshot, made: Candidate) -> None:
    if snap is not made.origin:
        raise Conflict("the index changed since this bank's version was made (another write committed): make it again")
