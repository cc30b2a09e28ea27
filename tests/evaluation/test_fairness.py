"""Fairness: NDKL against the `reranking` reference and by hand; NDCG/AP against scikit-learn;
exact-match relevance; the planted-bias generator; the CLI."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from hubless.cli.main import app
from hubless.data.fairness import make_fairness_data, relevance_by_column, sispi_table, visogender_table
from hubless.fairness import audit, average_precision, gender_bias_at_n, joint_codes, ndcg, ndkl
from hubless.metrics import relevant_ranks
from hubless.metrics.truth import Truth
from tests.conftest import needs_shared


def test_ndkl_equals_the_reranking_package_on_random_lists():
    reference = pytest.importorskip("reranking.metrics")
    rng = np.random.default_rng(0)
    for _ in range(60):
        n_values = int(rng.integers(2, 6))
        length = int(rng.integers(1, 40))
        probs = rng.dirichlet(np.ones(n_values) * rng.uniform(0.2, 3))
        codes = rng.choice(n_values, size=length, p=probs)
        target = rng.dirichlet(np.ones(n_values)) if rng.random() < 0.3 else np.full(n_values, 1 / n_values)
        want = reference.ndkl(codes.tolist(), {v: float(target[v]) for v in range(n_values)})
        got = ndkl(codes[None, :], n_values, target=target)[0]
        assert got == pytest.approx(want, abs=1e-9)


def test_ndkl_by_hand():
    # Perfect interleaving of two values: D_n is uniform at every even n, off by one item at odd n.
    inter = ndkl(np.array([[0, 1, 0, 1]]), 2)[0]
    kl1 = np.log(2)  # D_1 = (1, 0)
    kl3 = (2 / 3) * np.log((2 / 3) / 0.5) + (1 / 3) * np.log((1 / 3) / 0.5)
    z = sum(1 / np.log2(n + 1) for n in range(1, 5))
    assert inter == pytest.approx((kl1 / np.log2(2) + kl3 / np.log2(4)) / z)
    # Fully one-sided: KL = log 2 at every depth, so NDKL = log 2.
    assert ndkl(np.array([[1, 1, 1, 1, 1]]), 2)[0] == pytest.approx(np.log(2))
    # A single item: KL(one-hot || uniform over 3) = log 3.
    assert ndkl(np.array([[2]]), 3)[0] == pytest.approx(np.log(3))
    # Ragged rows: padding is ignored.
    padded = ndkl(np.array([[0, 1, 0, 1], [1, 1, 9, 9]]), 2, lengths=np.array([4, 2]))
    assert padded[0] == pytest.approx(inter) and padded[1] == pytest.approx(np.log(2))


def test_joint_attribute_over_2_by_4_cells():
    reference = pytest.importorskip("reranking.metrics")
    rng = np.random.default_rng(1)
    g, e = rng.integers(0, 2, 30), rng.integers(0, 4, 30)
    codes, n = joint_codes(g, e, sizes=[2, 4])
    assert n == 8 and set(codes.tolist()) <= set(range(8))
    assert (codes == g * 4 + e).all()
    want = reference.ndkl(codes.tolist(), {v: 1 / 8 for v in range(8)})
    assert ndkl(codes[None, :], 8)[0] == pytest.approx(want, abs=1e-9)


def test_ndcg_and_ap_equal_scikit_learn():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    scores = rng.random((6, 40)).astype(np.float32)
    lists = [sorted(rng.choice(40, size=int(rng.integers(1, 8)), replace=False).tolist()) for _ in range(6)]
    truth = Truth.from_lists(lists, 40)
    ranks = relevant_ranks(scores, truth)
    ours_ndcg, ours_ap = ndcg(ranks, truth.indptr), average_precision(ranks, truth.indptr)
    for i, rel in enumerate(lists):
        y = np.zeros(40)
        y[rel] = 1
        assert ours_ndcg[i] == pytest.approx(sk.ndcg_score(y[None], scores[i][None]))
        assert ours_ap[i] == pytest.approx(sk.average_precision_score(y, scores[i]))


def test_gender_bias_at_n():
    codes = np.array([[1, 1, 0, 2, 1], [0, 0, 0, 0, 1]])
    assert gender_bias_at_n(codes, masculine=1, feminine=0, n=4).tolist() == [0.25, -1.0]


def test_relevance_is_exact_not_prefix(tmp_path):
    for name in ("nurse_1_female_asian.jpg", "nurse_practitioner_2_male_white.jpg", "nurse_3_male_black.jpg"):
        (tmp_path / name).write_bytes(b"")
    rows, queries = sispi_table(tmp_path)
    assert [q["profession"] for q in queries] == ["nurse", "nurse_practitioner"]
    assert queries[1]["text"] == "A photo of a nurse practitioner"
    truth = relevance_by_column(rows, queries, "profession")
    names = [r["path"].rsplit("/", 1)[1] for r in rows]
    assert [names[i] for i in truth.to_json()[0]] == ["nurse_1_female_asian.jpg", "nurse_3_male_black.jpg"]
    practitioner = next(r for r in rows if r["profession"] == "nurse_practitioner")
    assert practitioner["ethnicity"] == "white" and practitioner["gender"] == "male" and practitioner["id"] == 2


@needs_shared("visogender")
def test_visogender_metadata_loads():
    rows, queries = visogender_table()
    assert len(rows) == 690  # 460 occupation-participant + 230 occupation-object rows in the files
    assert {r["gender"] for r in rows} <= {"masculine", "feminine"}
    assert all(q["text"].startswith("the ") and " and their " in q["text"] for q in queries)
    relevance_by_column(rows, queries, "occupation")  # every query has images


def test_planted_bias_raises_ndkl_and_corrections_are_audited():
    values = []
    for b in (0.0, 0.15, 0.3):
        d = make_fairness_data(bias=b, seed=1)
        rel = relevance_by_column(d.gallery_rows, d.query_rows, "profession")
        attrs = {a: [r[a] for r in d.gallery_rows] for a in ("gender", "ethnicity")}
        result = audit(d.gallery, d.queries, rel, attrs, d.query_bank, ["baseline", "is"])
        values.append(result["baseline"].metrics["NDKL_gender"])
    assert values[0] < values[1] < values[2]
    assert set(result["is"].metrics) == {"NDCG", "AP", "NDKL_gender", "NDKL_ethnicity", "NDKL_joint", "precision@10", "bias@10"}
    assert result["is"].delta["NDKL_gender"] < 0  # the correction lowers the planted gender bias here
    most, least = result.extremes("NDKL_gender")
    assert most[0][1] >= least[0][1]


def _write_csv(path, rows):
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_fairness_cli_writes_json_and_report(tmp_path):
    d = make_fairness_data(bias=0.3, seed=2)
    np.save(tmp_path / "g.npy", d.gallery)
    np.save(tmp_path / "q.npy", d.queries)
    np.save(tmp_path / "qb.npy", d.query_bank)
    _write_csv(tmp_path / "gm.csv", d.gallery_rows)
    _write_csv(tmp_path / "qm.csv", d.query_rows)
    out, report = tmp_path / "f.json", tmp_path / "f.html"
    args = ["fairness", "--gallery", tmp_path / "g.npy", "--gallery-meta", tmp_path / "gm.csv", "--queries", tmp_path / "q.npy",
            "--query-meta", tmp_path / "qm.csv", "--attributes", "gender,ethnicity", "--query-bank", tmp_path / "qb.npy",
            "-m", "nnn", "-m", "is", "--out", out, "--report", report, "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    assert "NDKL_joint" in result.output and "most biased" in result.output
    data = json.loads(out.read_text())
    assert [r["method"] for r in data["results"]] == ["baseline", "nnn", "is"]
    assert len(data["results"][0]["per_query"]["NDKL_gender"]) == 20
    html = report.read_text()
    assert html.count("<img") == 2 and "Per query" in html
    bad = CliRunner().invoke(app, [str(a) for a in args[:9]] + ["--attributes", "age"])
    assert bad.exit_code == 2 and "no column" in bad.output


@needs_shared("visogender")
def test_visogender_with_synthetic_embeddings_end_to_end(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["data", "visogender", "--out", str(tmp_path), "--bias", "0.5"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "audit.json"
    r = runner.invoke(app, ["fairness", "--gallery", str(tmp_path / "gallery.npy"), "--gallery-meta", str(tmp_path / "gallery_meta.csv"),
                            "--queries", str(tmp_path / "queries.npy"), "--query-meta", str(tmp_path / "query_meta.csv"),
                            "--attributes", "gender", "--match", "occupation", "--query-bank", str(tmp_path / "query_bank.npy"),
                            "-m", "nnn", "--out", str(out)])  # fmt: skip
    assert r.exit_code == 0, r.output
    base = json.loads(out.read_text())["results"][0]["metrics"]
    assert base["bias@10"] > 0  # the planted lean towards 'masculine' shows
