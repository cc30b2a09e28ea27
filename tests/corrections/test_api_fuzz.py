"""Bad input to the Python API's main calls, generated (hypothesis): method specs, arrays of any
shape, dtype and content (NaN, Inf, zeros, empty, integers, objects), ``top_k`` and ground truth of
any kind. Each call either does its job or raises a :class:`hubless.errors.HublessError` with a
message; never another exception (an IndexError, a numpy or FAISS error a user would have to
decode), and a refused call changes no input array."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hubless
from hubless.errors import HublessError

pytestmark = pytest.mark.slow

D = 4
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))

dtypes = st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.int8, np.bool_, np.complex64, np.uint8])
shapes = st.one_of(
    st.tuples(st.integers(0, 12), st.sampled_from([D, D, D, 1, 0, 3])),
    hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5),
)
arrays = st.one_of(
    st.tuples(dtypes, shapes).flatmap(lambda ds: hnp.arrays(ds[0], ds[1])),  # any values of the dtype: NaN, Inf, huge
    st.tuples(st.integers(1, 12), st.integers(0, 3)).map(lambda nk: np.random.default_rng(nk[1]).standard_normal((nk[0], D)).astype(np.float32)),
    st.just(np.zeros((5, D), np.float32)),
    st.just(np.array([["a"] * D] * 3, dtype=object)),
    st.lists(st.lists(st.floats(allow_nan=True), min_size=D, max_size=D), max_size=4),  # nested lists, as JSON gives them
    st.sampled_from([None, "not an array", 3.0]),
)  # fmt: skip
specs = st.one_of(
    st.sampled_from(["nnn", "csls", "dn", "is", "dis", "dualis", "dualdis", "gc", "baseline", "nnn:alpha=0.5,k=2", "is:beta=20"]),
    st.builds(lambda m, p, v: f"{m}:{p}={v}", st.sampled_from(["nnn", "is", "dn", "csls", "gc"]),
              st.sampled_from(["alpha", "k", "beta", "lam", "nope", ""]),
              st.sampled_from(["0", "-1", "1e9", "nan", "inf", "x", "", "2.5", "99999999999999999999"])),
    st.text(max_size=12),
)  # fmt: skip


def _unit(rng, n):
    a = rng.standard_normal((n, D)).astype(np.float32)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _refused_or_done(call, *inputs):
    before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else None for a in inputs]
    try:
        return call()
    except HublessError as exc:
        assert str(exc).strip(), "an error says what is wrong"
        for a, b in zip(inputs, before):
            if b is not None:
                np.testing.assert_array_equal(a, b)  # a refused call changed no input
        return None


@SETTINGS
@given(spec=specs, gallery=arrays, bank=arrays)
def test_fit_refuses_bad_specs_and_arrays_with_a_hubless_error(spec, gallery, bank):
    _refused_or_done(lambda: hubless.make_correction(spec).fit(gallery, bank, gallery_bank=bank, progress=False), gallery, bank)


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    gallery, bank = _unit(rng, 10), _unit(rng, 20)
    return hubless.Index.build(gallery, bank, "nnn:alpha=0.5,k=3", "Flat"), hubless.make_correction("is").fit(gallery, bank, progress=False)


@SETTINGS
@given(queries=arrays, top_k=st.one_of(st.integers(-3, 40), st.sampled_from([2**63, 1.5, "3", None, True])))
def test_search_refuses_bad_queries_and_top_k_with_a_hubless_error(fitted, queries, top_k):
    index, corr = fitted
    for search in (index.search, corr.search):
        result = _refused_or_done(lambda search=search: search(queries, top_k), queries)
        if result is not None:  # done: a top-k of the gallery for every query
            scores, ids = result[0], result[1]
            assert scores.shape == ids.shape and ids.shape[1] == int(top_k)
            assert np.all((ids >= -1) & (ids < 10))


truths = st.one_of(
    arrays,
    st.lists(st.integers(-2, 12), max_size=8),
    st.lists(st.lists(st.integers(-2, 12), max_size=3), max_size=8),
    st.sampled_from(["t2i:2", "i2t:2", "t2i:0", "t2i:x", "no-such-file.npy", "t2i:-1"]),
)


@SETTINGS
@given(truth=truths, n_queries=st.integers(0, 8))
def test_evaluate_refuses_bad_truth_with_a_hubless_error(truth, n_queries):
    rng = np.random.default_rng(1)
    gallery, queries, bank = _unit(rng, 6), _unit(rng, n_queries) if n_queries else np.zeros((0, D), np.float32), _unit(rng, 12)
    _refused_or_done(lambda: hubless.evaluate(gallery, queries, truth, bank, ["nnn:k=2"], bootstrap=0, progress=False), queries)


score_matrices = st.one_of(
    arrays,
    st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2)).map(
        lambda s: np.random.default_rng(s[2]).standard_normal((s[0], s[1])).astype(np.float32)
    ),
)


@SETTINGS
@given(scores=score_matrices, bank=score_matrices, method=specs, top_k=st.one_of(st.none(), st.integers(-1, 8)))
def test_score_matrix_mode_refuses_bad_matrices_with_a_hubless_error(scores, bank, method, top_k):
    _refused_or_done(lambda: hubless.correct_scores(scores, bank, method, top_k=top_k), scores, bank)


@SETTINGS
@given(scores=score_matrices, bank=score_matrices, truth=truths, methods=st.lists(specs, min_size=1, max_size=2))
def test_score_matrix_evaluation_refuses_bad_input_with_a_hubless_error(scores, bank, truth, methods):
    _refused_or_done(lambda: hubless.evaluate_scores(scores, truth, bank, methods, bootstrap=0, progress=False), scores, bank)


attributes = st.one_of(
    st.dictionaries(st.sampled_from(["gender", "age", ""]), st.lists(st.sampled_from(["a", "b", None, 1, float("nan")]), max_size=8), max_size=2),
    st.sampled_from([None, {}, "gender", {"gender": "ab"}, {"gender": 3}]),
)  # fmt: skip


@SETTINGS
@given(attributes=attributes, truth=truths, top_n=st.integers(-1, 8))
def test_the_fairness_audit_refuses_bad_input_with_a_hubless_error(attributes, truth, top_n):
    rng = np.random.default_rng(2)
    gallery, queries, bank = _unit(rng, 6), _unit(rng, 4), _unit(rng, 12)
    _refused_or_done(lambda: hubless.fairness.audit(gallery, queries, truth, attributes, bank, top_n=top_n, progress=False))
