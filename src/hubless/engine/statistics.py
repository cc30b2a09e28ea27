"""Bank statistics: everything the corrections learn from the reference banks, in few passes.

A correction states what it needs as a :class:`StatisticsRequest`; requests of several
corrections merge, so fitting many corrections (an evaluation, a hyper-parameter sweep) costs
one streamed pass per bank, not one per method or per parameter value:

* gallery x query bank: the top-K similarities of each gallery item (NNN, CSLS: every k <= K
  comes from the same pass), log-sum-exp at any number of betas (IS, DIS, DualIS, DualDIS), the
  sorted probe rows (GC) and, when asked, the nearest gallery item of every bank item (the bank's
  coverage, :func:`hubless.banks.coverage_report`) from the same blocks;
* gallery x gallery bank: log-sum-exp at the gallery betas (DualIS, DualDIS);
* query bank x gallery (and gallery bank x gallery): the top-k_a gallery items of every bank
  item, whose union is the activation set of the dynamic variants (DIS, DualDIS).

Exact duplicate gallery rows (:mod:`hubless.engine.duplicates`) get identical statistics: a copy
its first copy's top-k, log-sum-exps and probes, so copies get identical biases whatever the BLAS
rounded where they fell in its blocks, and each bank item's nearest gallery items name copies in
index order (:func:`tie_copies`, which a correction applies again when it is fitted from
statistics, so a distributed or incremental fit too). A copy of a bank item needs no rule: it
only adds its similarities to each gallery item's statistics and has nearest gallery items of
its own (the same items, their similarities possibly a last bit apart), so it decides no tie.

Every pass runs in fixed blocks (``stream_reduce(..., fixed_blocks=True)``), so the statistics
are bitwise the same on any number of cores, and a tiled fit whose shards start on block
boundaries reproduces them bitwise (:mod:`hubless.distributed.plan`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from hubless.engine.device import torch_device
from hubless.engine.duplicates import Duplicates, find_duplicates
from hubless.engine.stream import ColumnNearest, LogSumExp, SortedRows, TopK, stream_reduce
from hubless.errors import InvalidInput

__all__ = ["StatisticsRequest", "BankStatistics", "RowStatistics", "compute_statistics", "row_statistics", "tie_copies"]


@dataclass(frozen=True)
class StatisticsRequest:
    """What a correction needs from the banks (all fields default to "nothing")."""

    query_topk: int = 0
    query_betas: frozenset[float] = frozenset()
    gallery_betas: frozenset[float] = frozenset()
    query_activation_k: int = 0
    gallery_activation_k: int = 0
    query_probes: bool = False
    #: the nearest gallery item of every query-bank item (a diagnostic: no correction needs it)
    query_nearest: bool = False

    def merge(self, other: StatisticsRequest) -> StatisticsRequest:
        """The request that satisfies both ``self`` and ``other``."""
        return StatisticsRequest(
            query_topk=max(self.query_topk, other.query_topk),
            query_betas=self.query_betas | other.query_betas,
            gallery_betas=self.gallery_betas | other.gallery_betas,
            query_activation_k=max(self.query_activation_k, other.query_activation_k),
            gallery_activation_k=max(self.gallery_activation_k, other.gallery_activation_k),
            query_probes=self.query_probes or other.query_probes,
            query_nearest=self.query_nearest or other.query_nearest,
        )

    @property
    def needs_gallery_bank(self) -> bool:
        return bool(self.gallery_betas) or self.gallery_activation_k > 0


@dataclass
class BankStatistics:
    """Statistics of one gallery against its reference banks (see :func:`compute_statistics`).

    ``query_topk[i]``: the K largest s(b, r_i) over query-bank items b, descending.
    ``query_lse[beta][i]``: log sum_b exp(beta * s(b, r_i)); ``gallery_lse`` likewise over the
    gallery bank. ``query_activation[j]``: the k_a gallery items nearest to query-bank item j
    (ties by lower index); ``gallery_activation`` likewise for gallery-bank items.
    ``query_activation_scores`` (``gallery_activation_scores``) hold the similarities of those
    nearest items, so the sets can be kept current as the gallery changes (see
    :mod:`hubless.engine.updates`). ``query_probes[i]``: all s(b, r_i), sorted ascending.
    ``query_nearest[j]``: the gallery item nearest to query-bank item j (ties by lower index),
    ``query_nearest_scores[j]`` its similarity. Means are float64 vectors.
    """

    n_gallery: int
    n_query_bank: int
    n_gallery_bank: int | None
    query_bank_mean: np.ndarray
    gallery_mean: np.ndarray
    gallery_bank_mean: np.ndarray | None = None
    query_topk: np.ndarray | None = None
    query_lse: dict[float, np.ndarray] = field(default_factory=dict)
    gallery_lse: dict[float, np.ndarray] = field(default_factory=dict)
    query_activation: np.ndarray | None = None
    gallery_activation: np.ndarray | None = None
    query_activation_scores: np.ndarray | None = None
    gallery_activation_scores: np.ndarray | None = None
    query_probes: np.ndarray | None = None
    query_nearest: np.ndarray | None = None
    query_nearest_scores: np.ndarray | None = None

    @property
    def request(self) -> StatisticsRequest:
        """The request these statistics satisfy (what they hold)."""
        return StatisticsRequest(
            query_topk=0 if self.query_topk is None else self.query_topk.shape[1],
            query_betas=frozenset(self.query_lse),
            gallery_betas=frozenset(self.gallery_lse),
            query_activation_k=0 if self.query_activation is None else self.query_activation.shape[1],
            gallery_activation_k=0 if self.gallery_activation is None else self.gallery_activation.shape[1],
            query_probes=self.query_probes is not None,
            query_nearest=self.query_nearest is not None,
        )

    def restricted(self, request: StatisticsRequest) -> BankStatistics:
        """Only what ``request`` needs (views, no copies): what a fitted correction keeps."""
        missing = self.missing(request)
        if missing:
            raise InvalidInput("statistics lack " + "; ".join(missing))
        k, qa, ga = request.query_topk, request.query_activation_k, request.gallery_activation_k
        return replace(
            self,
            query_topk=_first(self.query_topk, k),
            query_lse={b: self.query_lse[b] for b in request.query_betas},
            gallery_lse={b: self.gallery_lse[b] for b in request.gallery_betas},
            query_activation=_first(self.query_activation, qa),
            query_activation_scores=_first(self.query_activation_scores, qa),
            gallery_activation=_first(self.gallery_activation, ga),
            gallery_activation_scores=_first(self.gallery_activation_scores, ga),
            query_probes=self.query_probes if request.query_probes else None,
            query_nearest=self.query_nearest if request.query_nearest else None,
            query_nearest_scores=self.query_nearest_scores if request.query_nearest else None,
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Flat name -> array form, for ``np.savez`` (inverse: :meth:`from_arrays`)."""
        out = {
            "sizes": np.array([self.n_gallery, self.n_query_bank, -1 if self.n_gallery_bank is None else self.n_gallery_bank]),
            "query_bank_mean": self.query_bank_mean,
            "gallery_mean": self.gallery_mean,
        }
        for name in _OPTIONAL_ARRAYS:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        for name in ("query_lse", "gallery_lse"):
            for beta, values in getattr(self, name).items():
                out[f"{name}@{beta!r}"] = values
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> BankStatistics:
        n_gallery, n_query_bank, n_gallery_bank = (int(v) for v in arrays["sizes"])
        stats = cls(
            n_gallery, n_query_bank, None if n_gallery_bank < 0 else n_gallery_bank, arrays["query_bank_mean"], arrays["gallery_mean"]
        )
        for name, values in arrays.items():
            if name in _OPTIONAL_ARRAYS:
                setattr(stats, name, values)
            elif "@" in name:
                field_name, beta = name.split("@")
                getattr(stats, field_name)[float(beta)] = values
        return stats

    def missing(self, request: StatisticsRequest) -> list[str]:
        """Names of what ``request`` needs and these statistics lack (empty when satisfied)."""
        lacks = []
        have_k = 0 if self.query_topk is None else self.query_topk.shape[1]
        if request.query_topk > have_k:
            lacks.append(f"top-{request.query_topk} query-bank similarities (have {have_k})")
        lacks += [f"query-bank log-sum-exp at beta={b}" for b in sorted(request.query_betas - set(self.query_lse))]
        lacks += [f"gallery-bank log-sum-exp at beta={b}" for b in sorted(request.gallery_betas - set(self.gallery_lse))]
        for name, need, have in (
            ("query-bank", request.query_activation_k, self.query_activation),
            ("gallery-bank", request.gallery_activation_k, self.gallery_activation),
        ):
            if need > (0 if have is None else have.shape[1]):
                lacks.append(f"{name} activation sets at k_activation={need}")
        if request.query_probes and self.query_probes is None:
            lacks.append("sorted query-bank probes")
        if request.query_nearest and self.query_nearest is None:
            lacks.append("the nearest gallery item of every query-bank item")
        return lacks

    def activation_mask(self, which: str, k_activation: int) -> np.ndarray:
        """Boolean (n_gallery,) mask of the activation set built from the ``which`` bank.

        The set is the union, over the bank's items, of their ``k_activation`` nearest gallery
        items (QB-Norm, Bogolin et al. 2022, section 3.4).
        """
        ids = self.query_activation if which == "query" else self.gallery_activation
        if ids is None or ids.shape[1] < k_activation:
            raise InvalidInput(f"{which}-bank activation sets at k_activation={k_activation} were not computed")
        mask = np.zeros(self.n_gallery, dtype=bool)
        mask[ids[:, :k_activation].ravel()] = True
        return mask


_OPTIONAL_ARRAYS = (
    "gallery_bank_mean",
    "query_topk",
    "query_activation",
    "gallery_activation",
    "query_activation_scores",
    "gallery_activation_scores",
    "query_probes",
    "query_nearest",
    "query_nearest_scores",
)


def _first(values: np.ndarray | None, k: int) -> np.ndarray | None:
    """The first ``k`` columns of ``values`` (None for k = 0 or no values)."""
    return values[:, :k] if k and values is not None else None


def _mean(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=0, dtype=np.float64)


def compute_statistics(
    gallery: np.ndarray,
    query_bank: np.ndarray | None,
    gallery_bank: np.ndarray | None,
    request: StatisticsRequest,
    *,
    progress: bool | None = None,
    bank_means: tuple[np.ndarray, np.ndarray | None] | None = None,
    gallery_duplicates: Duplicates | None = None,
) -> BankStatistics:
    """Compute the statistics in ``request`` by streaming similarity blocks (bounded memory).

    Inputs must be validated float32 arrays of one dimension (the corrections' ``fit`` does
    this; :meth:`hubless.Correction.fit` and :func:`hubless.fit_many` are the validating entry points).
    ``bank_means``: the banks' means (query bank, gallery bank) when they are known already
    (new gallery items against stored banks): then the banks are only read by the similarity
    pass the request needs, not averaged again (an O(bank) step a 1-row write would pay).
    ``gallery_duplicates``: the exact duplicate rows of ``gallery`` when they are known (found here
    otherwise); every copy of a gallery item gets its first copy's statistics (:func:`tie_copies`).
    """
    on_device = torch_device()
    if on_device is None:
        stats = _compute_statistics(gallery, query_bank, gallery_bank, request, progress, bank_means, _mean, fused=False)
    else:
        from hubless.engine import torch_arrays

        def mean(x: np.ndarray) -> np.ndarray:
            return torch_arrays.mean(x, *on_device)

        with torch_arrays.resident():  # each array is uploaded once for all the passes
            stats = _compute_statistics(gallery, query_bank, gallery_bank, request, progress, bank_means, mean, fused=True)
    return tie_copies(stats, find_duplicates(gallery) if gallery_duplicates is None else gallery_duplicates)


def tie_copies(stats: BankStatistics, duplicates: Duplicates) -> BankStatistics:
    """``stats`` with every exact copy of a gallery item (``duplicates``, of the gallery they
    describe) given its first copy's per-item statistics (top-k, log-sum-exps, probes: identical
    biases) and each bank item's nearest gallery items relabelled as if every copy had its first
    copy's similarity (:meth:`~hubless.engine.duplicates.Duplicates.relabel_top_k`: copies in
    index order). ``stats`` itself when nothing changes, else a copy (the inputs are kept)."""
    if not duplicates:
        return stats
    spread = duplicates.spread

    def relabel(scores: np.ndarray | None, ids: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        order = np.broadcast_to(-np.arange(ids.shape[1], dtype=np.float32), ids.shape)  # no scores kept: keep the order
        values, new_ids = duplicates.relabel_top_k(order if scores is None else scores, ids)
        return (None if scores is None else values), new_ids

    changes: dict = {
        "query_topk": None if stats.query_topk is None else spread(stats.query_topk),
        "query_probes": None if stats.query_probes is None else spread(stats.query_probes),
        "query_lse": {b: spread(v) for b, v in stats.query_lse.items()},
        "gallery_lse": {b: spread(v) for b, v in stats.gallery_lse.items()},
    }
    for side in ("query", "gallery"):
        ids = getattr(stats, f"{side}_activation")
        if ids is not None:
            changes[f"{side}_activation_scores"], changes[f"{side}_activation"] = relabel(getattr(stats, f"{side}_activation_scores"), ids)
    if stats.query_nearest is not None:
        changes["query_nearest"] = duplicates.first_of(stats.query_nearest)  # one nearest item: the group's first
    return _changed(stats, changes)


def _changed(stats: BankStatistics, changes: dict) -> BankStatistics:
    """``stats`` with ``changes`` (field -> new value), or ``stats`` itself when every new value
    is the old object."""

    def same(old, new) -> bool:
        if isinstance(old, dict):
            return all(new[k] is v for k, v in old.items())
        return old is new

    if all(same(getattr(stats, name), value) for name, value in changes.items()):
        return stats
    return replace(stats, **changes)


def _compute_statistics(gallery, query_bank, gallery_bank, request, progress, bank_means, mean, *, fused: bool) -> BankStatistics:
    """The passes of :func:`compute_statistics`: one gallery x bank pass per bank. ``fused``
    (the torch engine): the activation sets are column top-k lists of those very blocks (a
    column reduction costs little on a device; a second product would cost a whole pass). The
    numpy engine keeps them in their own bank x gallery pass, on the block grid the distributed
    fit's tiles reproduce bitwise (:func:`nearest_gallery_items`)."""
    n_gallery = gallery.shape[0]
    query_k = min(request.query_activation_k, n_gallery) if fused else 0
    gallery_k = min(request.gallery_activation_k, n_gallery) if fused else 0
    if query_bank is None:
        query_bank = np.zeros((0, gallery.shape[1]), dtype=np.float32)
    if bank_means is None:
        query_mean = mean(query_bank) if len(query_bank) else np.zeros(gallery.shape[1])
        gallery_bank_mean = None if gallery_bank is None else mean(gallery_bank)
    else:
        query_mean, gallery_bank_mean = bank_means
    stats = BankStatistics(
        n_gallery=n_gallery,
        n_query_bank=query_bank.shape[0],
        n_gallery_bank=None if gallery_bank is None else gallery_bank.shape[0],
        query_bank_mean=query_mean,
        gallery_mean=mean(gallery),
        gallery_bank_mean=gallery_bank_mean,
    )
    by_query_bank = row_statistics(
        gallery,
        query_bank,
        k=request.query_topk,
        betas=request.query_betas,
        probes=request.query_probes,
        nearest=max(query_k, int(request.query_nearest)) if len(query_bank) else 0,
        progress=progress,
        desc="query bank",
    )
    stats.query_topk, stats.query_lse, stats.query_probes = by_query_bank.topk, by_query_bank.lse, by_query_bank.probes
    if by_query_bank.nearest is not None:
        scores, ids = by_query_bank.nearest
        if request.query_nearest:
            stats.query_nearest_scores, stats.query_nearest = scores[:, 0].copy(), ids[:, 0].copy()
        if query_k:
            stats.query_activation_scores, stats.query_activation = scores[:, :query_k], ids[:, :query_k]
    if request.needs_gallery_bank and gallery_bank is None:
        raise InvalidInput("these statistics need a gallery bank; pass gallery_bank=")
    by_gallery_bank = row_statistics(
        gallery, gallery_bank, betas=request.gallery_betas, nearest=gallery_k, progress=progress, desc="gallery bank"
    )
    stats.gallery_lse = by_gallery_bank.lse
    if by_gallery_bank.nearest is not None:
        stats.gallery_activation_scores, stats.gallery_activation = by_gallery_bank.nearest
    if request.query_activation_k and not query_k:
        stats.query_activation_scores, stats.query_activation = nearest_gallery_items(
            query_bank, gallery, min(request.query_activation_k, n_gallery), progress=progress
        )
    if request.gallery_activation_k and not gallery_k:
        assert gallery_bank is not None  # checked above: the request needs it
        stats.gallery_activation_scores, stats.gallery_activation = nearest_gallery_items(
            gallery_bank, gallery, min(request.gallery_activation_k, n_gallery), progress=progress
        )
    return stats


class RowStatistics(NamedTuple):
    """What :func:`row_statistics` computes; each part is None / empty when not asked for."""

    topk: np.ndarray | None
    lse: dict[float, np.ndarray]
    probes: np.ndarray | None
    #: (scores, ids), (n_bank, k) each, of the k gallery items nearest to each bank item
    nearest: tuple[np.ndarray, np.ndarray] | None = None


def row_statistics(
    gallery: np.ndarray,
    bank: np.ndarray | None,
    *,
    k: int = 0,
    betas: Iterable[float] = (),
    probes: bool = False,
    nearest: int = 0,
    initial_topk: np.ndarray | None = None,
    progress: bool | None = None,
    desc: str = "bank",
) -> RowStatistics:
    """Top-k, {beta: log-sum-exp} and sorted probes of each gallery item's similarities to
    ``bank`` and the ``nearest`` gallery items nearest to each bank item (a column top-k of the
    same blocks; the numpy engine computes one, the torch engine any number), all in one
    streamed pass (none at all when nothing is asked for). ``initial_topk``: an earlier top-k of
    the same items to merge the bank into."""
    n = gallery.shape[0]
    betas = sorted(betas)
    if bank is None:  # nothing to stream against
        bank = np.zeros((0, gallery.shape[1]), dtype=np.float32)
    on_device = torch_device()
    if on_device is not None and (k or betas or probes or nearest):
        from hubless.engine import torch_passes

        return RowStatistics(
            *torch_passes.row_statistics(
                gallery,
                bank,
                k=k,
                betas=betas,
                probes=probes,
                nearest=nearest,
                initial_topk=initial_topk,
                device=on_device[0],
                dtype=on_device[1],
            )
        )
    if nearest > 1:
        raise InvalidInput("the numpy engine keeps one nearest gallery item per bank item in a row pass (nearest <= 1)")
    topk = TopK(n, k, initial=None if initial_topk is None else (initial_topk, None)) if k else None
    lse = LogSumExp(n, betas) if betas else None
    rows = SortedRows(n, bank.shape[0]) if probes else None
    columns = ColumnNearest(bank.shape[0]) if nearest else None
    reducers = [r for r in (topk, lse, rows, columns) if r is not None]
    if reducers:
        stream_reduce(gallery, bank, reducers, progress=progress, desc=desc, fixed_blocks=True)
    return RowStatistics(
        None if topk is None else topk.values,
        {} if lse is None else {b: lse.values[:, t] for t, b in enumerate(betas)},
        None if rows is None else rows.values,
        None if columns is None else (columns.values[:, None], columns.ids[:, None]),
    )


def nearest_gallery_items(
    bank: np.ndarray,
    gallery: np.ndarray,
    k: int,
    *,
    initial: tuple[np.ndarray, np.ndarray] | None = None,
    id_offset: int = 0,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of the ``k`` gallery items nearest to each bank item (ties: lower id),
    optionally merged into an ``initial`` (scores, ids) over earlier gallery items."""
    on_device = torch_device()
    if on_device is not None:
        from hubless.engine import torch_passes

        return torch_passes.nearest_gallery_items(
            bank, gallery, k, initial=initial, id_offset=id_offset, device=on_device[0], dtype=on_device[1]
        )
    nearest = TopK(bank.shape[0], k, with_ids=True, initial=initial, id_offset=id_offset)
    stream_reduce(bank, gallery, [nearest], progress=progress, desc="activation sets", fixed_blocks=True)
    return nearest.values, nearest.ids_
