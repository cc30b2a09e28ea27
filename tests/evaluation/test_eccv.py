"""ECCV Caption metrics: our COCO-5k id mapping, checked through the reference package."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("eccv_caption")

from hubless.evaluation.eccv import DEPTH, coco5k_ids, eccv_metrics  # noqa: E402
from hubless.metrics import captions_per_item  # noqa: E402


def test_ids_follow_karpathy_order():
    caption_ids, image_ids = coco5k_ids()
    assert caption_ids.shape == (25000,) and image_ids.shape == (5000,)
    assert len(set(caption_ids.tolist())) == 25000 and len(set(image_ids.tolist())) == 5000


@pytest.mark.slow  # 21 s measured here (the COCO-5k files)
def test_oracle_ranking_scores_100_on_coco_and_our_r1_matches_the_package():
    rng = np.random.default_rng(0)
    # Oracle: every caption ranks its own image first, every image its own 5 captions first.
    t2i = rng.integers(0, 5000, size=(25000, DEPTH))
    t2i[:, 0] = np.arange(25000) // 5
    i2t = rng.integers(0, 25000, size=(5000, DEPTH))
    i2t[:, :5] = np.arange(5000)[:, None] * 5 + np.arange(5)
    m = eccv_metrics(t2i, i2t)
    assert m["coco_5k_r1"] == {"t2i": 100.0, "i2t": 100.0}
    assert m["eccv_r1"]["t2i"] == 100.0
    # A scrambled ranking: the package's COCO R@1 equals ours computed from the same lists.
    t2i[::3, 0] = (t2i[::3, 0] + 1) % 5000
    m = eccv_metrics(t2i, i2t)
    t2i_truth, _ = captions_per_item(5000, 5)
    ours = 100.0 * np.mean(t2i[:, 0] == t2i_truth.indices)
    assert m["coco_5k_r1"]["t2i"] == pytest.approx(ours)
    assert 0 < m["eccv_map_at_r"]["t2i"] <= 100


def test_wrong_sizes_are_refused():
    with pytest.raises(ValueError, match="COCO-5k"):
        eccv_metrics(np.zeros((10, DEPTH), int), np.zeros((5000, DEPTH), int))
    with pytest.raises(ValueError, match="at least"):
        eccv_metrics(np.zeros((25000, 5), int), np.zeros((5000, 5), int))


@pytest.mark.slow
def test_eval_cli_eccv_end_to_end(tmp_path):
    import json

    from typer.testing import CliRunner

    from hubless.cli.main import app
    from hubless.data.synthetic import make_retrieval_data

    d = make_retrieval_data(n_items=5000, dim=16, n_query_bank=2000, n_gallery_bank=1000, n_val_items=10, seed=0)
    for name, arr in {"g": d.gallery, "q": d.queries, "qb": d.query_bank, "gb": d.gallery_bank}.items():
        np.save(tmp_path / f"{name}.npy", arr)
    out = tmp_path / "r.json"
    f = {name: str(tmp_path / f"{name}.npy") for name in ("g", "q", "qb", "gb")}
    args = ["eval", "--gallery", f["g"], "--queries", f["q"], "--truth", "t2i:5", "--query-bank", f["qb"],
            "--gallery-bank", f["gb"], "-m", "nnn", "--bootstrap", "0", "--eccv", "--out", str(out), "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    nnn = data["results"][1]
    assert set(nnn["eccv"]) == {"eccv_map_at_r", "eccv_rprecision", "eccv_r1", "cxc_r1", "coco_5k_r1"}
    # COCO-5k R@1 of the text->image direction is the R@1 that eval computes itself.
    assert nnn["eccv"]["coco_5k_r1"]["t2i"] == pytest.approx(nnn["metrics"]["R@1"])
