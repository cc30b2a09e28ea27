"""The typed results of hubless.evaluate (hubless.evaluation.results): frozen, typed fields, the
results.json schema unchanged (keys and order, written by hand here), and the rerank numbers
still read as the dict they were."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import hubless
from hubless.errors import NotFound
from hubless.evaluation import Evaluation, MethodResult, RerankNumbers, TunedMethod


@pytest.fixture(scope="module")
def evaluation() -> Evaluation:
    rng = np.random.default_rng(0)
    gallery = rng.standard_normal((40, 8)).astype(np.float32)
    queries = gallery[np.repeat(np.arange(40), 2)] + 0.8 * rng.standard_normal((80, 8)).astype(np.float32)
    bank = rng.standard_normal((120, 8)).astype(np.float32)
    return hubless.evaluate(gallery, queries, np.repeat(np.arange(40), 2), bank, ["nnn:k=4", "is"], bootstrap=20, coverage=True)


def test_results_are_frozen_typed_objects(evaluation):
    r = evaluation["nnn"]
    assert isinstance(r, MethodResult) and r.spec.startswith("nnn:")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.metrics = {}  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        evaluation.ks = (1,)  # type: ignore[misc]
    assert evaluation.n_gallery == 40 and evaluation.n_queries == 80
    assert evaluation.results[0].delta == {} and set(r.delta) == set(r.metrics) - {"MdR"}
    assert all(isinstance(low, float) and low <= high for low, high in r.delta_ci95.values())
    with pytest.raises(NotFound):
        evaluation["dis"]


def test_to_dict_is_the_results_json_schema(evaluation):
    d = json.loads(json.dumps(evaluation.to_dict()))
    assert list(d) == ["inputs", "results", "query_bank_coverage"]
    assert list(d["inputs"]) == [
        "n_gallery", "n_distractors", "n_queries", "dim", "n_query_bank", "n_gallery_bank", "relevant_per_query", "ks", "bootstrap",
        "seed", "normalize", "ties",
    ]  # fmt: skip
    keys = ["method", "spec", "params", "metrics", "ci95", "delta_vs_baseline", "delta_ci95", "hubness", "seconds"]
    assert [list(r) for r in d["results"]] == [keys] * 3
    nnn = d["results"][1]
    assert nnn["params"] == {"alpha": 0.75, "k": 4} and list(nnn["metrics"]) == ["R@1", "R@5", "R@10", "MdR", "MnR", "MRR", "mAP@R"]
    assert nnn["ci95"]["R@1"] == list(evaluation["nnn"].ci95["R@1"]) and nnn["delta_ci95"]["R@1"][0] <= nnn["delta_ci95"]["R@1"][1]


def test_added_numbers_are_typed_fields_written_after_seconds(evaluation):
    numbers = RerankNumbers(
        k=20, fusion=None, fusion_weight=0.1, retrieve={"R@1": 50.0}, reranked={"R@1": 60.0}, ms_retrieve=0.5, ms_rerank=3.0
    )
    expected = {
        "k": 20, "fusion": None, "fusion_weight": 0.1, "retrieve": {"R@1": 50.0}, "retrieve+rerank": {"R@1": 60.0},
        "ms_per_query": {"retrieve": 0.5, "rerank": 3.0},
    }  # fmt: skip
    assert numbers == expected and dict(numbers) == expected and numbers["retrieve+rerank"] == {"R@1": 60.0}
    assert list(numbers) == list(expected) and len(numbers) == 6
    eccv = {"eccv_r1": {"t2i": 1.0, "i2t": 2.0}}
    r = dataclasses.replace(evaluation["nnn"], eccv=eccv, rerank=numbers)
    assert r.extra == {"eccv": eccv, "rerank": expected}
    with pytest.raises(TypeError):  # read-only: an entry added here would never reach the JSON
        r.extra["other"] = 1  # type: ignore[index]
    assert list(r.to_dict())[-3:] == ["seconds", "eccv", "rerank"] and r.to_dict()["rerank"] == expected
    assert "eccv" not in evaluation["nnn"].to_dict()  # the evaluation's own result is untouched


def test_tune_result_is_typed_and_its_json_unchanged():
    rng = np.random.default_rng(1)
    gallery = rng.standard_normal((30, 8)).astype(np.float32)
    val = gallery + 0.8 * rng.standard_normal((30, 8)).astype(np.float32)
    bank = rng.standard_normal((90, 8)).astype(np.float32)
    tuned = hubless.tune(
        gallery, val, np.arange(30), bank, ["nnn", "is"], objective="MnR", grids={"nnn": {"alpha": (0.5, 1.0), "k": (1, 2, 4)}}
    )
    nnn = tuned.best["nnn"]
    assert isinstance(nnn, TunedMethod) and nnn.objective == "MnR" and nnn.value == nnn.metrics["MnR"]
    assert nnn.value == min(row["MnR"] for row in tuned.tables["nnn"])  # lower is better for ranks
    assert tuned.fitted["nnn"].spec == nnn.spec and tuned.best_specs == [nnn.spec, tuned.best["is"].spec]
    expected = {"spec": nnn.spec, "params": nnn.params, "MnR": nnn.value, "metrics": nnn.metrics, "at_edge": nnn.at_edge}
    assert nnn == expected and list(nnn) == list(expected) and nnn["params"] == nnn.params  # still reads as the dict it was
    assert list(nnn.params) == ["alpha", "k"] and tuned.tables["nnn"][0] == {"alpha": 0.5, "k": 1, **tuned.tables["nnn"][0]}
    d = json.loads(json.dumps(tuned.to_dict()))
    assert list(d) == ["objective", "best", "validation", "baseline"] and d["best"]["nnn"] == expected
    assert len(d["validation"]["nnn"]) == 6 and d["baseline"] == tuned.baseline
    with pytest.raises(dataclasses.FrozenInstanceError):
        tuned.objective = "R@1"  # type: ignore[misc]


def test_every_result_object_is_frozen_and_slotted():
    from hubless.evaluation import TuneResult
    from hubless.evaluation.robustness import BankEvaluation
    from hubless.fairness import FairnessAudit, FairnessResult

    for cls in (Evaluation, MethodResult, RerankNumbers, TuneResult, TunedMethod, BankEvaluation, FairnessAudit, FairnessResult):
        assert cls.__dataclass_params__.frozen and "__slots__" in vars(cls), cls.__name__


def test_eccv_evaluation_refuses_a_result_without_a_fitted_correction(evaluation):
    from hubless.errors import InvalidInput
    from hubless.evaluation.eccv import eccv_evaluation

    by_hand = Evaluation(evaluation.inputs, [dataclasses.replace(r, correction=None) for r in evaluation.results], evaluation.ks)
    with pytest.raises(InvalidInput, match="fitted correction"):
        eccv_evaluation(by_hand, np.zeros((1, 8), np.float32), np.zeros((1, 8), np.float32), np.zeros((1, 8), np.float32))
