"""Correct a stored score matrix: a drop-in for the QB-Norm authors' ``qb_norm`` in a pipeline.

    C = hubless.correct_scores(S, SB, "dis:beta=20")               # (n_queries, n_gallery) float32
    hubless.correct_scores("S.npy", "SB.npy", "dis", out="C.npy")  # streamed to a file
    top, ids = hubless.correct_scores(S, SB, "nnn", top_k=10)       # best first (a hubless.Hits)

The correction is fitted on the bank score matrices (one streamed pass each) and applied to S
block by block of rows. The values written are the method's own scores (for IS / DIS the
inverted-softmax probability exp(beta s) / sum_b exp(beta s(b, r)) and, for DIS queries whose
gate stays closed, the raw score, as ``qb_norm`` returns them), or with ``ranking=True`` the
scores the method ranks by (s - bias(r) for the additive methods), which never overflow.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from hubless._atomic import mark_npz, open_marked_npy, umask_mode
from hubless._validation import MISSING, check_top_k
from hubless.corrections import AdditiveCorrection, Correction, QueryBatch, make_correction
from hubless.corrections.score_fit import fit_on_scores
from hubless.engine.device import DeviceName, torch_device, use_device
from hubless.engine.parallel import run_blocks
from hubless.engine.score_statistics import check_score_matrix, read_rows, row_blocks
from hubless.errors import InvalidInput
from hubless.hits import Hits
from hubless.score_matrices.files import load_scores
from hubless.score_matrices.rank import RANK_BLOCK_ELEMENTS, score_batch
from hubless.score_matrices.rank import top_k as best_of

__all__ = ["correct_scores"]


def _matrix(value, name: str, n_cols: int | None = None):
    if value is None:
        return None
    if isinstance(value, (str, os.PathLike)):
        return load_scores(value, name, n_cols=n_cols)
    return check_score_matrix(value, name, n_cols=n_cols)


def correct_scores(
    scores,
    query_bank_scores=None,
    method: str | Correction = "dis",
    *,
    gallery_bank_scores=None,
    out: str | os.PathLike | None = None,
    top_k: int | None = None,
    ranking: bool = False,
    transpose: bool = False,
    progress: bool | None = None,
    device: DeviceName = None,
):
    """The corrected scores of ``scores`` (queries x gallery) under ``method`` fitted on the bank
    score matrices (see the module docstring). Inputs are arrays, memory maps or file paths
    (.npy/.npz/.pkl). ``transpose``: every matrix is stored gallery x queries (gallery x bank).

    Returns the (n_queries, n_gallery) float32 matrix, or with ``top_k`` each row's best
    ``top_k`` as :class:`~hubless.Hits` (``scores, ids = ...``: best first, ties to the lower
    index, ids the gallery's columns; a ``top_k`` beyond the gallery keeps the width, the slots
    past it last, not found, with id -1 and score -inf: the one top-k rule of
    :func:`hubless._validation.check_top_k`). With ``out`` the result
    is written there instead (atomically: .npy for the matrix, .npz with ``scores`` and ``ids``
    for top-k, both marked as hubless's so that a re-run may replace them: see
    :data:`hubless._atomic.ARRAY_MARK`) and the path is returned; the full matrix is then never
    held in memory.

    With a torch device (``device=``, ``use_device``, ``HUBLESS_DEVICE``) the bank passes of the
    fit run there, and with ``top_k`` an additive method's rows are ranked there too: each block
    is read and checked on the host, uploaded once, and only its top ``top_k`` come back (the same
    values and ids as without a device).
    """
    corr = make_correction(method)
    if scores is None:
        raise InvalidInput("scores is required: the (n_queries, n_gallery) score matrix to correct (an array or a .npy/.npz/.pkl file)")
    s = _matrix(scores, "scores")
    s = s.T if transpose else s
    sb = _matrix(query_bank_scores, "query_bank_scores")
    sg = _matrix(gallery_bank_scores, "gallery_bank_scores")
    sb, sg = (None if m is None else (m.T if transpose else m) for m in (sb, sg))
    n_queries, n_gallery = s.shape
    if top_k is not None:
        top_k = check_top_k(top_k, n_gallery)
    if out is not None:
        out = Path(out)
        suffix = ".npz" if top_k else ".npy"
        if out.suffix.lower() != suffix:
            raise InvalidInput(f"out must be a {suffix} file ({'top-k scores and ids' if top_k else 'the corrected matrix'}); got {out}")
    with use_device(device):  # the bank passes on the device when one is given
        fit_on_scores([corr], sb, sg, n_gallery=n_gallery, progress=progress)
    if out is not None and not top_k:
        return _write_matrix(corr, s, out, ranking, progress)
    width = top_k or n_gallery
    values = np.full((n_queries, width), -np.inf, np.float32)
    ids = np.full((n_queries, width), MISSING, np.int64) if top_k else None
    found = min(width, n_gallery)  # the slots past the gallery stay unfilled

    on_device = torch_device(device)

    def work(start: int, stop: int) -> None:
        if ids is not None and on_device is not None and isinstance(corr, AdditiveCorrection) and corr.exactly_additive:
            values[start:stop, :found], ids[start:stop, :found] = _top_on_device(corr, s, start, stop, found, ranking, on_device[0])
            return
        if ids is None:
            values[start:stop] = _corrected(corr, s, start, stop, ranking)
            return
        # the best by the ranking scores, then the method's scores of those (an underflow to 0 of
        # exp(beta s) could tie items the ranking tells apart)
        block = read_rows(s, start, stop, "scores")
        batch = score_batch([corr], block)
        best, best_ids = best_of(corr.rank(batch, block), found)
        values[start:stop, :found] = best if ranking else np.asarray(corr.method_scores(batch, best), dtype=np.float32)
        ids[start:stop, :found] = best_ids

    run_blocks(work, row_blocks(n_queries, n_gallery, RANK_BLOCK_ELEMENTS), progress=progress, desc=f"correct ({corr.spec})")
    if out is None:
        return Hits.padded(values, ids) if top_k else values
    assert ids is not None  # a full matrix was written above

    def write_npz(path: str) -> None:
        np.savez(path, scores=values, ids=ids)
        mark_npz(path)

    _atomic(out, write_npz)
    return out


def _corrected(corr: Correction, s, start: int, stop: int, ranking: bool) -> np.ndarray:
    """Rows ``start:stop`` of the corrected matrix, float32."""
    block = read_rows(s, start, stop, "scores")
    batch = score_batch([corr], block)
    ranked = corr.rank(batch, block)
    if ranking:
        return ranked
    # method scores are an increasing map of the ranking scores per query: the order is kept
    return np.asarray(corr.method_scores(batch, ranked), dtype=np.float32)


def _top_on_device(corr: AdditiveCorrection, s, start: int, stop: int, k: int, ranking: bool, device: str):
    """(values, ids) of the ``k`` best corrected scores of rows start:stop, ranked on the device
    (:func:`hubless.engine.torch_ranking.corrected_top_k`: the rows read and checked on the host,
    the raw neighbours, the bias and the top-k on the device); the method's own scores of those k
    from the host formula (:meth:`~hubless.corrections.Correction.method_scores` maps each
    ranking score on its own, per query)."""
    from hubless.engine import torch_ranking

    block = read_rows(s, start, stop, "scores")
    batch = QueryBatch(np.empty((stop - start, 0), np.float32))  # score rows carry no vectors
    depth = min(corr.query_request.depth, block.shape[1])
    values, ids = torch_ranking.corrected_top_k(
        block, k, depth=depth, weights=lambda raw: corr.weights_from_neighbours(batch, raw), bias=corr.bias_columns_, device=device
    )
    return (values if ranking else np.asarray(corr.method_scores(batch, values), dtype=np.float32)), ids


def _atomic(out: Path, write) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=out.suffix, dir=out.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, umask_mode())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_matrix(corr: Correction, s, out: Path, ranking: bool, progress) -> Path:
    """Stream the corrected matrix into a memory-mapped .npy beside ``out``, then rename it."""

    def write(path: str) -> None:
        target = open_marked_npy(path, s.shape)  # marked: a re-run may replace it

        def work(start: int, stop: int) -> None:
            target[start:stop] = _corrected(corr, s, start, stop, ranking)

        run_blocks(work, row_blocks(s.shape[0], s.shape[1], RANK_BLOCK_ELEMENTS), progress=progress, desc=f"correct ({corr.spec})")
        target.flush()

    _atomic(out, write)
    return out
