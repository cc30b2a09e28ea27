"""ECCV Caption and CxC metrics for COCO-5k (Chun et al. 2022), through the ``eccv-caption`` package.

ECCV Caption adds machine-proposed, human-verified positives to COCO's test split, so a
retrieved caption that describes the image but is not one of its 5 originals is no longer
counted as a miss. Its metrics are mAP@R, R-Precision and R@1 over the extended positives; CxC
(Parekh et al. 2021) adds its own positives (R@1). hubless maps its rankings (gallery indices in
Karpathy order: image i, captions 5i..5i+4) to COCO ids with the package's
``coco_test_ids.npy`` and calls its reference implementation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from hubless.errors import Corrupt, InvalidInput, optional_import
from hubless.evaluation.results import EccvScores, Evaluation

if TYPE_CHECKING:
    from hubless.corrections import Correction

__all__ = ["DEPTH", "coco5k_ids", "eccv_metrics", "eccv_evaluate"]

#: Ranked items kept per query: more than the largest number of ECCV positives (48 for i2t).
DEPTH = 50
N_IMAGES, N_CAPTIONS = 5000, 25000
TARGETS = ("eccv_map_at_r", "eccv_rprecision", "eccv_r1", "cxc_r1", "coco_5k_r1")


def _package_dir() -> Path:
    eccv_caption = optional_import("eccv_caption", "ECCV Caption metrics", "eccv", "eccv-caption")
    return Path(eccv_caption.__file__).parent


def coco5k_ids() -> tuple[np.ndarray, np.ndarray]:
    """COCO ids of the Karpathy 5k test split: (caption_ids (25,000,), image_ids (5,000,))."""
    data = _package_dir() / "data"
    caption_ids = np.load(data / "coco_test_ids.npy").astype(np.int64)
    caption_to_image = json.loads((data / "original_caption_to_image.json").read_text())
    per_caption = np.array([caption_to_image[str(c)][0] for c in caption_ids], dtype=np.int64)
    image_ids = per_caption[::5]
    if not (per_caption.reshape(N_IMAGES, 5) == image_ids[:, None]).all():  # pragma: no cover - package data
        raise Corrupt("eccv-caption's caption order does not follow 5 captions per image (reinstall eccv-caption)")
    return caption_ids, image_ids


def eccv_metrics(t2i_ranked: np.ndarray, i2t_ranked: np.ndarray) -> EccvScores:
    """ECCV Caption / CxC / COCO metrics (percent) from ranked gallery indices.

    ``t2i_ranked`` (25,000, >= DEPTH) image indices per caption; ``i2t_ranked`` (5,000, >= DEPTH)
    caption indices per image, both best first, in Karpathy order. Returns
    {metric: {"t2i": value, "i2t": value}} for mAP@R, R-Precision and R@1 (ECCV), CxC R@1 and
    COCO-5k R@1.
    """
    from eccv_caption import Metrics

    t2i_ranked, i2t_ranked = np.asarray(t2i_ranked), np.asarray(i2t_ranked)
    if t2i_ranked.shape[0] != N_CAPTIONS or i2t_ranked.shape[0] != N_IMAGES:
        raise InvalidInput(
            f"ECCV Caption is defined on COCO-5k: need rankings for 25,000 captions and 5,000 images; "
            f"got {t2i_ranked.shape[0]} and {i2t_ranked.shape[0]}"
        )
    if min(t2i_ranked.shape[1], i2t_ranked.shape[1]) < DEPTH:
        raise InvalidInput(f"rank at least {DEPTH} items per query (ECCV positives go up to 48)")
    caption_ids, image_ids = coco5k_ids()
    t2i = {int(c): image_ids[row].tolist() for c, row in zip(caption_ids, t2i_ranked)}
    i2t = {int(i): caption_ids[row].tolist() for i, row in zip(image_ids, i2t_ranked)}
    # The package prints, warns and draws progress bars of its own: keep them out of our output.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scores = Metrics().compute_all_metrics(i2t, t2i, target_metrics=TARGETS, Ks=(1,), verbose=False)
    return {name: {d: 100.0 * float(v) for d, v in scores[name].items()} for name in TARGETS if name in scores}


def eccv_evaluate(
    t2i_corrections: Sequence[Correction],
    captions: npt.ArrayLike,
    caption_bank: npt.ArrayLike,
    image_bank: npt.ArrayLike,
    *,
    progress: bool | None = None,
) -> dict[str, EccvScores]:
    """Every method in both directions on COCO-5k, scored with :func:`eccv_metrics`.

    ``t2i_corrections``: corrections already fitted text->image (gallery: the 5,000 images;
    query bank: ``caption_bank``; gallery bank: ``image_bank``), e.g. the ``correction`` of each
    result of :func:`hubless.evaluate`; image->text fits each method again with the roles of
    the banks swapped. Returns {spec: metrics}.
    """
    from hubless.corrections import make_correction

    out: dict[str, EccvScores] = {}
    for t2i in t2i_corrections:
        i2t = make_correction(t2i.spec).set_params(normalize=t2i.normalize).fit(captions, image_bank, caption_bank, progress=progress)
        out[t2i.spec] = eccv_metrics(
            t2i.search(captions, DEPTH, progress=progress)[1], i2t.search(t2i.gallery_, DEPTH, progress=progress)[1]
        )
    return out


def eccv_evaluation(
    evaluation: Evaluation,
    captions: npt.ArrayLike,
    caption_bank: npt.ArrayLike,
    image_bank: npt.ArrayLike,
    *,
    progress: bool | None = None,
) -> dict[str, EccvScores]:
    """ECCV Caption / CxC metrics of every method of a text->image :func:`hubless.evaluate`
    result on COCO-5k (:func:`eccv_evaluate` on its fitted corrections); each entry of
    ``evaluation.results`` is replaced by one whose ``eccv`` holds its numbers (written to
    ``results.json``); returns {spec: metrics}."""
    corrections = [r.correction for r in evaluation.results if r.correction is not None]
    if len(corrections) != len(evaluation.results):
        raise InvalidInput("ECCV evaluation searches with each result's fitted correction; a result built without one cannot be measured")
    scores = eccv_evaluate(corrections, captions, caption_bank, image_bank, progress=progress)
    evaluation.results[:] = [dataclasses.replace(r, eccv=scores[r.spec]) for r in evaluation.results]
    return scores
