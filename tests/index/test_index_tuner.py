"""The index tuner (hubless.index.tuner, issue 31 item 3): the factory and knob it picks reach
the recall target on queries it never saw, it measures on the query bank alone, and what it
chose and measured is saved with the index."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.data.synthetic import make_retrieval_data
from hubless.errors import InvalidInput, InvalidType
from hubless.index import tuner
from hubless.index.tuner import candidate_factories, estimate_bytes, parse_size, structure_bytes

runner = CliRunner()


@pytest.fixture(scope="module")
def data():
    return make_retrieval_data(n_items=6000, dim=32, n_query_bank=1200, n_gallery_bank=10, n_val_items=10, seed=3)


@pytest.fixture(scope="module")
def tuned(data):
    return hubless.Index.build(data.gallery, data.query_bank, "nnn:alpha=0.75,k=16", target_recall=0.9, sample=300)


def recall_at_10(index, queries) -> float:
    exact = index.ids[index.correction.search(queries, 10)[1]]
    found = index.search(queries, 10)[1]
    return float((found[:, :, None] == exact[:, None, :]).any(axis=2).sum(axis=1).mean() / 10)


def test_chosen_index_reaches_the_target_on_unseen_queries(data, tuned):
    t = tuned.config.tuning
    assert t["reached"] and t["recall"] >= 0.9 and t["heldout_recall"] >= 0.9
    assert [c["factory"] for c in t["candidates"]] == [f for f, _ in candidate_factories(6000, 32, 1)]
    # the fastest candidate reaching the target, whichever it is: at 6,000 x 32 every
    # candidate's single-query call takes 0.4-0.8 ms (measured: Flat 0.53, IVF64 0.79, HNSW32
    # 0.70), so the winner is the machine's load's to decide. "Some ANN index beats the scan"
    # held only while a single query's products waited for a BLAS thread team (issue 31)
    assert t["factory"] == tuned.factory
    if t["param"] is not None:
        assert getattr(tuned.config, t["param"]) == t["value"]
    chosen = next(c for c in t["candidates"] if c["factory"] == t["factory"])
    assert chosen["p50_ms"] == min(c["p50_ms"] for c in t["candidates"] if c["reached"])
    for c in t["candidates"]:  # each knob is the first power of two reaching the target
        if c["param"] is not None:
            assert c["curve"][-1] == [c["value"], c["recall"]]
            assert all(r < 0.9 for _, r in c["curve"][:-1])
    assert recall_at_10(tuned, data.queries[:1000]) >= 0.9  # test queries: never seen by the tuner


def test_the_tuner_reads_no_query_but_the_bank(data, monkeypatch):
    """Every query searched while tuning (exactly or through a candidate index) is a bank row;
    the test queries are passed nowhere (the tuner takes no other queries)."""
    seen = []
    real_index_search, real_exact = hubless.Index.search, hubless.NNN.search

    def index_search(self, queries, *args, **kwargs):
        seen.append(np.asarray(queries))
        return real_index_search(self, queries, *args, **kwargs)

    def exact_search(self, queries, *args, **kwargs):
        seen.append(np.asarray(queries))
        return real_exact(self, queries, *args, **kwargs)

    monkeypatch.setattr(hubless.Index, "search", index_search)
    monkeypatch.setattr(hubless.NNN, "search", exact_search)
    hubless.Index.build(data.gallery, data.query_bank, "nnn", target_recall=0.8, sample=100, latency_queries=5)
    bank = {row.tobytes() for row in hubless.NNN().fit(data.gallery[:1], data.query_bank).queries(data.query_bank).vectors}
    searched = np.concatenate(seen)
    assert len(seen) > 5 and all(row.tobytes() in bank for row in searched)
    assert set(tuner.tune_index.__code__.co_varnames[: tuner.tune_index.__code__.co_argcount]) == {"correction", "query_bank"}


def test_tuning_round_trips_through_save_and_load_and_cli_info(tuned, tmp_path):
    tuned.save(tmp_path / "idx")
    loaded = hubless.Index.load(tmp_path / "idx")
    assert loaded.info()["tuning"] == tuned.info()["tuning"] == tuned.config.tuning
    assert loaded.config.nprobe == tuned.config.nprobe and loaded.config.ef_search == tuned.config.ef_search
    r = runner.invoke(app, ["index", "info", str(tmp_path / "idx")])
    assert r.exit_code == 0 and f"chose {tuned.factory}" in r.output and "HNSW32" in r.output, r.output


def test_cli_build_with_target_recall_and_max_memory(data, tmp_path):
    np.save(tmp_path / "g.npy", data.gallery)
    np.save(tmp_path / "qb.npy", data.query_bank)
    args = ["index", "build", "--gallery", str(tmp_path / "g.npy"), "--query-bank", str(tmp_path / "qb.npy"), "--no-progress"]
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "a"), "--target-recall", "0.9", "--max-memory", "100KB"])
    assert r.exit_code == 0, r.output
    t = hubless.Index.load(tmp_path / "a").config.tuning
    assert t["max_memory"] == 100_000 and t["factory"] == "Flat"  # every structure needs more: the exact scan is kept
    assert all("skipped" in c for c in t["candidates"][1:]) and "max_memory" in r.output
    for bad, message in (
        (["--target-recall", "1.5"], "target_recall"),
        (["--target-recall", "0.9", "--max-memory", "lots"], "max_memory"),
        (["--max-memory", "1GB"], "--target-recall"),
    ):
        r = runner.invoke(app, [*args, "--out", str(tmp_path / "b"), *bad])
        assert r.exit_code != 0 and message in r.output, (bad, r.output)


def test_max_memory_chooses_ivf_pq_within_the_budget(data):
    corr = hubless.NNN(k=16).fit(data.gallery, data.query_bank)
    budget = estimate_bytes("IVF128,PQ8x4", 6000, 32) + 1000  # 4-bit codes: 6,000 items train too few 8-bit ones
    index = tuner.tune_index(corr, data.query_bank, target_recall=0.8, max_memory=budget, sample=150, latency_queries=5)
    t = index.config.tuning
    pq = next(c for c in t["candidates"] if ",PQ" in c["factory"])
    assert pq["factory"] == "IVF128,PQ8x4" and pq["bytes"] <= budget  # the widest codes that fit
    assert structure_bytes(index._snap.faiss) == t["bytes"] <= budget
    assert all("skipped" in c for c in t["candidates"] if c["factory"] not in ("Flat", pq["factory"]))


def test_an_unreachable_target_keeps_the_best_and_says_so(data):
    corr = hubless.NNN(k=16).fit(data.gallery, data.query_bank)
    with pytest.warns(UserWarning, match="no candidate index reached"):
        index = tuner.tune_index(corr, data.query_bank, target_recall=1.0, factories=["IVF16,PQ4x4"], rescore=False,
                                 sample=100, latency_queries=5)  # fmt: skip
    t = index.config.tuning
    assert not t["reached"] and t["recall"] < 1.0 and t["value"] == 16  # every list probed: the best it can do
    assert index.config.nprobe == 16 and index.factory == "IVF16,PQ4x4"


def test_bad_arguments_fail_before_the_fit(data):
    for target in (0, 1.5, -0.1, float("nan")):
        with pytest.raises(InvalidInput, match="target_recall"):
            hubless.Index.build(data.gallery, data.query_bank, target_recall=target)
    with pytest.raises(InvalidType, match="target_recall"):
        hubless.Index.build(data.gallery, data.query_bank, target_recall="high")
    with pytest.raises(InvalidInput, match="max_memory"):
        hubless.Index.build(data.gallery, data.query_bank, target_recall=0.9, max_memory="2 parsecs")
    with pytest.raises(InvalidInput, match="target_recall too"):
        hubless.Index.build(data.gallery, data.query_bank, max_memory="1GB")
    with pytest.raises(InvalidInput, match="query bank"):
        hubless.Index.build(data.gallery, None, "dn", target_recall=0.9)
    corr = hubless.NNN(k=4).fit(data.gallery[:100], data.query_bank[:15])
    with pytest.raises(InvalidInput, match="at least 20"):
        tuner.tune_index(corr, data.query_bank[:15])


def test_parse_size():
    assert parse_size("2GB") == 2 * 10**9 and parse_size("1.5 GiB") == int(1.5 * 2**30) and parse_size("512mib") == 512 * 2**20
    assert parse_size(4096) == parse_size("4096") == 4096 and parse_size("10k") == 10_000 and parse_size(None) is None
    for bad in ("", "GB", "-1GB", "1 GBB", "0"):
        with pytest.raises(InvalidInput):
            parse_size(bad)
    with pytest.raises(InvalidType):
        parse_size(True)


def test_memory_estimates_match_built_structures(tuned):
    """The estimate that rules candidates out before building is within 10% of what was built."""
    for c in tuned.config.tuning["candidates"]:
        assert c["bytes"] == pytest.approx(c["estimated_bytes"], rel=0.1), c["factory"]
