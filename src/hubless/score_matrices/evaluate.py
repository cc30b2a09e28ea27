"""Evaluate corrections from score matrices: the QB-Norm protocol for any model.

    ev = hubless.evaluate_scores(S, "t2i:20", SB, methods=["is", "dis"], ties="average",
                                 query_mask=mask)
    ev["dis:beta=20.0,k_activation=1"].metrics     # R@1, R@5, R@10, MdR, MnR, MRR, mAP@R

S is queries x gallery (e.g. the 59,800 x 2,990 text -> video scores of MSR-VTT's full split),
SB the query bank x gallery scores, SG (DualIS / DualDIS) gallery bank x gallery. Each may be an
array, a memory map or a file path (.npy / .npz / .pkl, see :func:`hubless.score_matrices.load_scores`); the banks are read in one streamed
pass each (:func:`hubless.corrections.score_fit.fit_on_scores`), S in blocks of rows
(:func:`hubless.score_matrices.rank.rank_score_rows`), so memory stays bounded whatever the sizes.

Protocol options of the papers (Bogolin et al. 2022, with the collaborative-experts metric):

* ``ties="average"``: tied scores share the mean of their positions (their metric); "index"
  (hubless's default: the lower gallery index first) and "optimistic" are the others;
* ``query_mask``: one boolean per row of S as stored; False rows are padding (MSR-VTT has two
  videos with 19 captions in a 20-per-video layout). Text -> video: those queries are left out.
  With ``transpose``: those captions leave the gallery, as in their video -> text metric;
* ``transpose=True``: every matrix is stored the other way round (S: gallery x queries, e.g. the
  text x video matrix evaluated video -> text; SB: gallery x bank); truth then follows the
  queries, e.g. ``"i2t:20"`` (video i -> captions 20i .. 20i + 19). Video -> text is a hit when
  the best-ranked of a video's captions is (their v2t metric).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeAlias, Union

import numpy as np
import numpy.typing as npt

from hubless.corrections import Correction
from hubless.corrections.score_fit import check_score_methods, fit_on_scores
from hubless.engine import use_device
from hubless.engine.device import DeviceName
from hubless.engine.score_statistics import check_score_matrix
from hubless.errors import InvalidInput
from hubless.evaluation import Evaluation, JSONValue, prepare_methods
from hubless.evaluation.evaluate import build_evaluation, check_bootstrap
from hubless.metrics.retrieval import check_ks, check_ties
from hubless.metrics.truth import Truth, TruthLike, load_truth
from hubless.score_matrices.files import load_mask, load_scores
from hubless.score_matrices.rank import rank_score_rows

__all__ = ["Columns", "ScoreInputs", "ScoreMatrix", "ScoreSource", "evaluate_scores", "prepare_scores"]

#: A score matrix (or query mask) as given: an array, a memory map, or a file path (.npy / .npz / .pkl).
ScoreSource: TypeAlias = Union[npt.ArrayLike, "os.PathLike[str]"]

#: Top results kept per query for the hubness statistics (N_1 and N_10), as in hubless.evaluate.
HUBNESS_DEPTH = 10


class ScoreMatrix(Protocol):
    """What the score-matrix mode reads rows from: a (n, m) numpy array, a memory map or
    :class:`Columns` (``read_rows`` reads ``matrix[rows]`` block by block)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype[Any]: ...

    def __getitem__(self, rows: Any) -> Any: ...


class Columns:
    """Some columns of a score matrix (an array or a memory map), read row block by row block:
    how a query mask removes padding items from the gallery without copying the matrix."""

    def __init__(self, matrix: ScoreMatrix, columns: npt.ArrayLike) -> None:
        self.matrix, self.columns = matrix, np.asarray(columns, dtype=np.int64)
        self.shape: tuple[int, ...] = (matrix.shape[0], self.columns.size)
        self.dtype: np.dtype[Any] = matrix.dtype
        self.ndim = 2

    def __getitem__(self, rows: Any) -> np.ndarray:
        return np.asarray(self.matrix[rows])[:, self.columns]


class ScoreInputs:
    """Validated score inputs of one evaluation: S, SB, SG in query x gallery orientation, the
    rows of S to rank and the truth over them (see :func:`prepare_scores`)."""

    def __init__(
        self,
        scores: ScoreMatrix,
        query_bank_scores: ScoreMatrix | None,
        gallery_bank_scores: ScoreMatrix | None,
        truth: Truth,
        rows: np.ndarray,
        n_masked: int,
    ) -> None:
        self.scores, self.query_bank_scores, self.gallery_bank_scores = scores, query_bank_scores, gallery_bank_scores
        self.truth, self.rows, self.n_masked = truth, rows, n_masked

    @property
    def n_gallery(self) -> int:
        return int(self.scores.shape[1])


def _oriented(matrix: ScoreSource | None, name: str, transpose: bool) -> ScoreMatrix | None:
    if matrix is None:
        return None
    if isinstance(matrix, (str, os.PathLike)):  # a file: memory-mapped where the format allows
        matrix = load_scores(matrix, name)
    checked: np.ndarray = check_score_matrix(matrix, name)
    return checked.T if transpose else checked


def prepare_scores(
    scores: ScoreSource,
    truth: TruthLike,
    query_bank_scores: ScoreSource | None = None,
    gallery_bank_scores: ScoreSource | None = None,
    *,
    query_mask: ScoreSource | None = None,
    transpose: bool = False,
) -> ScoreInputs:
    """Orient and check the matrices, apply the query mask and load the truth (module docstring)."""
    s = _oriented(scores, "scores", transpose)
    if s is None:
        raise InvalidInput("scores are needed (a query x gallery score matrix)")
    sb = _oriented(query_bank_scores, "query_bank_scores", transpose)
    sg = _oriented(gallery_bank_scores, "gallery_bank_scores", transpose)
    n_queries, n_gallery = s.shape
    for name, m in (("query_bank_scores", sb), ("gallery_bank_scores", sg)):
        if m is not None and m.shape[1] != n_gallery:
            side = "rows" if transpose else "columns"
            raise InvalidInput(f"{name} has {m.shape[1]} {side} but scores has {n_gallery} gallery items: they must score the same items")
    truth = load_truth(truth, n_queries, n_gallery)
    rows, n_masked = np.arange(n_queries), 0
    if query_mask is not None:
        stored = n_gallery if transpose else n_queries
        if isinstance(query_mask, (str, os.PathLike)):
            query_mask = load_mask(query_mask, stored)
        mask = np.asarray(query_mask).reshape(-1)
        if mask.dtype.kind not in "biuf" or mask.size != stored:
            raise InvalidInput(f"query_mask must hold one boolean per stored row of scores ({stored}); got {mask.size}")
        mask = mask != 0
        n_masked = int((~mask).sum())
        if not transpose:  # text -> video: padding queries are left out
            rows = np.flatnonzero(mask)
            if rows.size == 0:
                raise InvalidInput("query_mask masks every query")
            truth = truth.subset(rows)
        elif n_masked:  # video -> text: padding captions leave the gallery
            kept = np.flatnonzero(mask)
            position = np.full(n_gallery, -1)
            position[kept] = np.arange(kept.size)
            keep = mask[truth.indices]
            counts = np.add.reduceat(keep, truth.indptr[:-1]) if truth.indices.size else np.zeros(0, int)
            truth = Truth(np.concatenate([[0], np.cumsum(counts)]), position[truth.indices[keep]], kept.size)
            s = Columns(s, kept)
            sb = None if sb is None else Columns(sb, kept)
            sg = None if sg is None else Columns(sg, kept)
    return ScoreInputs(s, sb, sg, truth, rows, n_masked)


def evaluate_scores(
    scores: ScoreSource,
    truth: TruthLike,
    query_bank_scores: ScoreSource | None = None,
    methods: Sequence[str | Correction] = ("baseline", "dis"),
    *,
    gallery_bank_scores: ScoreSource | None = None,
    ks: Sequence[int] = (1, 5, 10),
    bootstrap: int = 1000,
    seed: int = 0,
    ties: str = "index",
    query_mask: ScoreSource | None = None,
    transpose: bool = False,
    progress: bool | None = None,
    inputs: Mapping[str, JSONValue] | None = None,
    device: DeviceName = None,
) -> Evaluation:
    """Fit each method on the bank score matrices, rank the rows of ``scores`` and measure
    (R@K, MdR, MnR, MRR, mAP@R, paired bootstrap intervals, hubness), as
    :func:`hubless.evaluate` does for embeddings; see the module docstring for the inputs.
    Methods that need embeddings (DN) are refused before any work, saying what they need.
    ``device``: where the bank statistics are reduced and the rows ranked ("cuda", "cpu" for
    torch, "numpy"; default ``HUBLESS_DEVICE`` or numpy): the rows are read and checked on the
    host either way.
    """
    if device is not None:  # the whole call with this device in effect
        arguments = {name: value for name, value in locals().items() if name != "device"}
        with use_device(device):
            return evaluate_scores(**arguments)
    check_ties(ties)
    check_bootstrap(bootstrap)
    corrections = prepare_methods(methods)
    check_score_methods(corrections)
    data = prepare_scores(scores, truth, query_bank_scores, gallery_bank_scores, query_mask=query_mask, transpose=transpose)
    ks = check_ks(ks, data.truth.n_gallery)
    t0 = time.perf_counter()
    fit_on_scores(corrections, data.query_bank_scores, data.gallery_bank_scores, n_gallery=data.n_gallery, progress=progress)
    fit_seconds = time.perf_counter() - t0
    ranked = rank_score_rows(
        corrections,
        data.scores,
        data.truth,
        rows=data.rows,
        ties=ties,
        depth=HUBNESS_DEPTH,
        progress=progress,
        desc=f"rank {len(corrections)} methods",
    )
    described: dict[str, JSONValue] = {
        "mode": "scores",
        "n_gallery": int(data.truth.n_gallery),
        "n_queries": int(data.rows.size),
        "n_masked": data.n_masked,
        "transpose": bool(transpose),
        "n_query_bank": None if data.query_bank_scores is None else int(data.query_bank_scores.shape[0]),
        "n_gallery_bank": None if data.gallery_bank_scores is None else int(data.gallery_bank_scores.shape[0]),
        "relevant_per_query": float(data.truth.counts.mean()),
        "ks": list(ks),
        "ties": ties,
        "bootstrap": int(bootstrap),
        "seed": int(seed),
    }
    described.update(inputs or {})
    return build_evaluation(
        corrections, ranked, [fit_seconds] * len(corrections), data.truth, ks, bootstrap, seed, described, progress=progress
    )
