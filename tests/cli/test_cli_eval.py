"""`hubless eval` and `hubless tune` end to end on synthetic files; tuning refuses leaks."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.data.synthetic import make_retrieval_data
from hubless.tuning import DEFAULT_GRIDS, grid_edges, tune

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = make_retrieval_data(n_items=200, dim=32, n_query_bank=2000, n_gallery_bank=400, n_val_items=150, seed=2)
    root = tmp_path_factory.mktemp("eval")
    arrays = {
        "g": d.gallery, "q": d.queries.astype(np.float16), "qb": d.query_bank, "gb": d.gallery_bank,
        "vg": d.val_gallery, "vq": d.val_queries, "vt": d.val_query_item, "t": d.query_item,
    }  # fmt: skip
    for name, arr in arrays.items():
        np.save(root / f"{name}.npy", arr)
    return d, root


def test_eval_writes_the_documented_json_and_report(files):
    d, root = files
    out, report = root / "results.json", root / "report.html"
    args = ["eval", "--gallery", root / "g.npy", "--queries", root / "q.npy", "--truth", "t2i:5",
            "--query-bank", root / "qb.npy", "--gallery-bank", root / "gb.npy",
            "-m", "nnn:alpha=0.5,k=16", "-m", "is:beta=20", "-m", "dualdis",
            "--bootstrap", "100", "--out", out, "--report", report, "--no-progress"]  # fmt: skip
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert "nnn:alpha=0.5,k=16" in result.output and "ΔR@1" in result.output
    data = json.loads(out.read_text())
    assert data["inputs"]["files"]["gallery"]["shape"] == [200, 32]
    assert len(data["inputs"]["files"]["gallery"]["sha256"]) == 64
    assert [r["method"] for r in data["results"]] == ["baseline", "nnn", "is", "dualdis"]
    nnn = data["results"][1]
    assert nnn["params"] == {"alpha": 0.5, "k": 16}
    assert set(nnn["metrics"]) == {"R@1", "R@5", "R@10", "MdR", "MnR", "MRR", "mAP@R"}
    assert set(nnn["ci95"]) == set(nnn["metrics"])
    assert {"N1_max", "N1_kurtosis", "N1_skewness"} <= set(nnn["hubness"])
    assert set(nnn["seconds"]) == {"fit", "search"}
    # Same numbers as the library called directly (queries were saved as float16).
    ev = hubless.evaluate(d.gallery, d.queries.astype(np.float16), d.query_item, d.query_bank,
                          ["nnn:alpha=0.5,k=16"], bootstrap=100)  # fmt: skip
    assert nnn["metrics"] == pytest.approx(ev["nnn:alpha=0.5,k=16"].metrics)
    html = report.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    assert re.findall(r"<h2[^>]*>([^<]*)</h2>", html) == ["Inputs", "Results", "Hubness"]
    assert html.count("<img src='data:image/png;base64,") == 2


def test_eval_bad_input_is_one_clear_line(files):
    _, root = files
    bad = root / "bad.npy"
    bad.write_bytes(b"\x93NUMPY garbage")
    result = runner.invoke(app, ["eval", "--gallery", str(bad), "--queries", str(root / "q.npy"), "--truth", "t2i:5"])
    assert result.exit_code == 2
    assert "error:" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["eval", "--gallery", str(root / "g.npy"), "--queries", str(root / "q.npy"), "--truth", "t2i:3"])
    assert result.exit_code == 2 and "truth covers" in result.output


def test_tune_cli_chooses_on_validation_and_tests(files):
    _, root = files
    out, report = root / "tune.json", root / "tune.html"
    args = ["tune", "--gallery", root / "g.npy", "--validation-gallery", root / "vg.npy",
            "--validation-queries", root / "vq.npy", "--validation-truth", root / "vt.npy",
            "--queries", root / "q.npy", "--truth", root / "t.npy", "--query-bank", root / "qb.npy",
            "-m", "nnn", "-m", "is", "--bootstrap", "50", "--out", out, "--report", report, "--no-progress"]  # fmt: skip
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["best"]) == {"nnn", "is"}
    assert len(data["validation"]["nnn"]) == 110 and len(data["validation"]["is"]) == len(DEFAULT_GRIDS["is"]["beta"])
    best = max(data["validation"]["nnn"], key=lambda r: r["R@1"])
    assert data["best"]["nnn"]["R@1"] == best["R@1"]
    assert [r["spec"] for r in data["test"]["results"]][1:] == [data["best"]["nnn"]["spec"], data["best"]["is"]["spec"]]
    assert "nnn heat map" in report.read_text()
    assert data["best"]["nnn"]["at_edge"] == grid_edges(data["validation"]["nnn"], data["best"]["nnn"]["params"])


def test_grid_edges_flags_a_choice_on_the_border_of_a_long_enough_grid():
    points = [{"alpha": a, "k": k} for a in (0.25, 0.5, 0.75) for k in (1, 2)]
    assert grid_edges(points, {"alpha": 0.5, "k": 2}) == []  # k has two values only: not judged
    assert grid_edges(points, {"alpha": 0.75, "k": 1}) == ["alpha"]
    assert grid_edges(points, {"alpha": 0.25, "k": 1}) == ["alpha"]


def test_tune_refuses_validation_queries_that_are_test_queries_or_bank_rows():
    d = make_retrieval_data(n_items=100, dim=16, n_query_bank=500, n_val_items=50, seed=1)
    leaked = np.vstack([d.val_queries, d.queries[:1]])
    truth = np.concatenate([d.val_query_item, [0]])
    with pytest.raises(ValueError, match="test queries"):
        tune(d.val_gallery, leaked, truth, d.query_bank, ["nnn"], test_queries=d.queries)
    leaked = np.vstack([d.val_queries, d.query_bank[:2]])
    truth = np.concatenate([d.val_query_item, [0, 1]])
    with pytest.raises(ValueError, match="query bank"):
        tune(d.val_gallery, leaked, truth, d.query_bank, ["nnn"])


def test_tune_matches_evaluating_each_grid_point():
    d = make_retrieval_data(n_items=120, dim=16, n_query_bank=800, n_gallery_bank=200, n_val_items=80, seed=4)
    grids = {"nnn": {"alpha": (0.25, 1.0), "k": (2, 32)}, "dis": {"beta": (5.0, 50.0), "k_activation": (1, 5)}}
    tuned = tune(d.val_gallery, d.val_queries, d.val_query_item, d.query_bank, ["nnn", "dis"], grids=grids, objective="MRR")
    for method, rows in tuned.tables.items():
        for row in rows:
            params = {k: row[k] for k in grids[method]}
            spec = method + ":" + ",".join(f"{k}={v}" for k, v in params.items())
            ev = hubless.evaluate(d.val_gallery, d.val_queries, d.val_query_item, d.query_bank, [spec], bootstrap=0)
            assert row["MRR"] == pytest.approx(ev.results[1].metrics["MRR"]), spec
        assert tuned.best[method]["MRR"] == max(r["MRR"] for r in rows)
