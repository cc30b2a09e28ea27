"""The public ranking hook every caller uses: Correction.rank + method_scores, equal to score()
and search() for every method; raw-neighbour statistics from anywhere; scikit-learn clone;
per-call FAISS search parameters under concurrency; start-up benchmark."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import hubless
from hubless.corrections import QueryRequest, QueryStatistics
from hubless.data.synthetic import make_retrieval_data
from tests import reference as ref

SPECS = [
    "baseline",
    "nnn:alpha=0.5,k=4",
    "csls:k=3",
    "dn:lam=0.3",
    "is:beta=7",
    "dis:beta=7,k_activation=2",
    "dualis:beta_query=6,beta_gallery=3",
    "dualdis:beta_query=6,beta_gallery=3",
    "gc",
]


def _fit(spec, d):
    return hubless.make_correction(spec).fit(d["gallery"], d["query_bank"], d["gallery_bank"])


@pytest.mark.parametrize("spec", SPECS)
def test_rank_then_method_scores_is_score_and_orders_as_search(spec, small_data):
    corr = _fit(spec, small_data)
    q = small_data["queries"]
    batch = corr.queries(q)
    sims = batch.vectors @ corr.gallery_.T
    ranking = corr.rank(batch, sims)
    np.testing.assert_allclose(corr.method_scores(batch, ranking), corr.score(q), rtol=1e-6, atol=1e-7)
    # search returns the best of that ranking, best first, ties to the lower id
    scores, ids = corr.search(q, top_k=6)
    ref.assert_same_ranking(ids, ranking.astype(np.float64), 6, atol=1e-6)
    np.testing.assert_allclose(scores, np.take_along_axis(corr.score(q), ids, axis=1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", SPECS)
def test_rank_over_blocks_and_candidate_lists_equals_rank_over_the_gallery(spec, small_data):
    corr = _fit(spec, small_data)
    batch = corr.queries(small_data["queries"])
    sims = batch.vectors @ corr.gallery_.T
    full = corr.rank(batch, sims)
    # contiguous blocks of items (as exact search streams them), statistics already in the batch
    parts = [corr.rank(batch, sims[:, a:b], columns=slice(a, b)) for a, b in ((0, 25), (25, 60))]
    np.testing.assert_allclose(np.hstack(parts), full, rtol=1e-6, atol=1e-6)
    # per-query candidate lists (as an index re-scores them)
    cand = np.argsort(-sims, axis=1)[:, :7]
    got = corr.rank(batch, np.take_along_axis(sims, cand, axis=1), columns=cand)
    np.testing.assert_allclose(got, np.take_along_axis(full, cand, axis=1), rtol=1e-6, atol=1e-6)
    # rank never changes its input unless asked to
    np.testing.assert_array_equal(sims, batch.vectors @ corr.gallery_.T)


@pytest.mark.parametrize("spec", ["dis:beta=7,k_activation=2", "dualdis", "csls:k=3"])
def test_raw_neighbour_statistics_from_any_source_give_the_same_result(spec, small_data):
    corr = _fit(spec, small_data)
    q = small_data["queries"]
    request = corr.query_request
    assert request.depth >= 1
    raw_scores, raw_ids = hubless.exact_search(q, corr.gallery_, request.depth)
    given = corr.queries(q, statistics=QueryStatistics.from_neighbours(request, raw_scores, raw_ids))
    derived = corr.queries(q)
    sims = derived.vectors @ corr.gallery_.T
    np.testing.assert_allclose(corr.rank(given, sims), corr.rank(derived, sims), rtol=1e-6)
    np.testing.assert_allclose(corr.method_scores(given, corr.rank(given, sims)), corr.score(q), rtol=1e-6, atol=1e-7)


def test_query_request_shapes():
    assert hubless.NNN().query_request == QueryRequest()
    assert hubless.DynamicInvertedSoftmax().query_request.top1
    assert hubless.CSLS(k=7).query_request.topk == 7
    assert QueryRequest(top1=True).merge(QueryRequest(topk=3)).depth == 3


def test_weight_override_per_call_and_one_rule_for_weights(small_data):
    corr = _fit("nnn:alpha=0.5,k=4", small_data)
    q = small_data["queries"]
    alone = hubless.NNN(alpha=0.2, k=4).fit(small_data["gallery"], small_data["query_bank"])
    np.testing.assert_allclose(corr.score(q, weight=0.2), alone.score(q), rtol=1e-6)
    for bad in (-1.0, float("nan"), np.array([0.1, -0.2])):
        with pytest.raises(ValueError):
            corr.search(q[:2], 3, weight=bad)
    with pytest.raises(ValueError):
        hubless.NNN(alpha=-1.0)
    with pytest.raises(ValueError):
        hubless.DN(lam=-0.5)
    with pytest.raises(TypeError, match="lam="):
        corr.search(q[:2], 3, lam=0.5)
    dn = _fit("dn", small_data)  # the same rule per call as in the constructor, for every weight
    with pytest.raises(ValueError, match="weight must be"):
        dn.search(q[:2], 3, weight=-1.0)
    index = hubless.Index(corr, "Flat")
    with pytest.raises(ValueError, match="weight must be"):
        index.search(q[:2], 3, weight=-1.0)


def test_sklearn_clone_get_params_and_not_fitted():
    from sklearn.base import clone

    nnn = hubless.NNN(alpha=0.5, k=8, normalize=False)
    twin = clone(nnn)
    assert twin is not nnn and twin.get_params() == nnn.get_params() == nnn.get_params(deep=True)
    for cls in hubless.METHODS.values():
        assert clone(cls()).get_params() == cls().get_params()
    with pytest.raises(hubless.NotFitted, match="not fitted"):
        twin.search(np.ones((1, 4), np.float32))
    assert issubclass(hubless.NotFitted, (ValueError, AttributeError))


def test_methods_describe_themselves():
    from hubless.corrections import method_help
    from hubless.tuning import DEFAULT_GRIDS

    for name, cls in hubless.METHODS.items():
        assert cls.summary, name
        assert DEFAULT_GRIDS[name] == cls.default_grid
        assert all(p in cls.param_names() for p in cls.default_grid)
        assert name in method_help()


@pytest.fixture(scope="module")
def ivf_data():
    return make_retrieval_data(n_items=3000, dim=32, n_query_bank=3000, n_val_items=10, seed=7)


def test_concurrent_searches_with_different_nprobe_do_not_interfere(ivf_data):
    d = ivf_data
    index = hubless.Index.build(d.gallery, d.query_bank, "nnn:alpha=0.75,k=16", "IVF64,Flat", nprobe=4, rescore=False)
    q = d.queries[:400]
    expected = {n: index.search(q, 10, nprobe=n)[1] for n in (1, 64)}
    assert (expected[1] != expected[64]).any()  # the two settings really differ
    errors, results = [], {1: [], 64: []}

    def worker(n):
        try:
            for _ in range(15):
                results[n].append(index.search(q, 10, nprobe=n)[1])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (1, 64, 1, 64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for n in (1, 64):
        for got in results[n]:
            np.testing.assert_array_equal(got, expected[n])
    assert index.config.nprobe == 4  # the defaults are untouched


def test_ivf_served_csls_takes_r_q_from_the_index(ivf_data, monkeypatch):
    """CSLS's r_q comes from one raw search of the index, not an exact pass over the gallery."""
    d = ivf_data
    index = hubless.Index.build(d.gallery, d.query_bank, "csls:k=10", "IVF64,Flat", nprobe=64)
    import hubless.corrections.base as base

    def no_exact(*args, **kwargs):
        raise AssertionError("exact search over the gallery")

    monkeypatch.setattr(base, "exact_search", no_exact)
    scores, ids = index.search(d.queries[:200], 10)
    monkeypatch.undo()
    ref_scores, ref_ids = index.correction.search(d.queries[:200], 10)
    np.testing.assert_array_equal(ids, ref_ids)  # nprobe = all lists: exact
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_startup_benchmark_runs():
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "startup.py"
    done = subprocess.run([sys.executable, str(script), "--repeats", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr  # a floor not met is said in the table, not an exit status
    rows = [line for line in done.stdout.splitlines() if line.startswith("| hubless ")]
    assert len(rows) == 3 and all(("met" in row) == ("eval" not in row) for row in rows), done.stdout
