"""Bad input to the Python API's main calls, generated (hypothesis): method specs, arrays of any
shape, dtype and content (NaN, Inf, zeros, empty, integers, objects), ``top_k`` and ground truth of
any kind. Each call either does its job or raises a :class:`hubless.errors.HublessError` with a
message; never another exception (an IndexError, a numpy or FAISS error a user would have to
decode), and a refused call changes no input array."""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hubless
from hubless.errors import HublessError

#: The fuzz's examples: the same every run and in every checkout (derandomize's seed depends
#: on the test file's path).
SEED = 20261127

pytestmark = pytest.mark.slow

D = 4
SETTINGS = settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))

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


GOOD_SPECS = st.sampled_from(["nnn:k=3", "csls:k=3", "dn", "is", "dis:k_activation=2", "dualis", "gc", "baseline", "nnn:alpha=0.5,k=2"])


def mostly(valid: st.SearchStrategy, fuzzed: st.SearchStrategy) -> st.SearchStrategy:
    """The valid value two times in three, so that most examples get past the first check and
    one bad argument at a time reaches the work behind it."""
    return st.one_of(valid, valid, fuzzed)


def unit_arrays(n: int) -> st.SearchStrategy:
    return st.integers(0, 2**16).map(lambda seed: _unit(np.random.default_rng(seed), n))


#: (test name, "done" or "refused") of every call the fuzz made.
SEEN: Counter = Counter()


def _unit(rng, n):
    a = rng.standard_normal((n, D)).astype(np.float32)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _refused_or_done(call, *inputs):
    before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else None for a in inputs]
    test = sys._getframe(1).f_code.co_name
    try:
        result = call()
        SEEN[test, "done"] += 1
        return result
    except HublessError as exc:
        SEEN[test, "refused"] += 1
        assert str(exc).strip(), "an error says what is wrong"
        for a, b in zip(inputs, before):
            if b is not None:
                np.testing.assert_array_equal(a, b)  # a refused call changed no input
        return None


@seed(SEED)
@SETTINGS
@given(spec=mostly(GOOD_SPECS, specs), gallery=mostly(unit_arrays(10), arrays), bank=mostly(unit_arrays(20), arrays))
def test_fit_refuses_bad_specs_and_arrays_with_a_hubless_error(spec, gallery, bank):
    _refused_or_done(lambda: hubless.make_correction(spec).fit(gallery, bank, gallery_bank=bank, progress=False), gallery, bank)


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    gallery, bank = _unit(rng, 10), _unit(rng, 20)
    return hubless.Index.build(gallery, bank, "nnn:alpha=0.5,k=3", "Flat"), hubless.make_correction("is").fit(gallery, bank, progress=False)


@seed(SEED)
@SETTINGS
@given(
    queries=mostly(unit_arrays(3), arrays),
    top_k=mostly(st.integers(1, 12), st.one_of(st.integers(-3, 40), st.sampled_from([2**63, 1.5, "3", None, True]))),
)
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


@seed(SEED)
@SETTINGS
@given(data=st.data())
def test_evaluate_refuses_bad_truth_with_a_hubless_error(data):
    rng = np.random.default_rng(1)
    n_queries = data.draw(st.integers(1, 8))
    gallery, queries, bank = _unit(rng, 6), _unit(rng, n_queries), _unit(rng, 12)  # R@1 and R@5 of a 6-item gallery
    truth = data.draw(mostly(st.lists(st.integers(0, 5), min_size=n_queries, max_size=n_queries), truths))
    methods = data.draw(mostly(st.lists(GOOD_SPECS, min_size=1, max_size=2), st.lists(specs, min_size=1, max_size=2)))
    _refused_or_done(
        lambda: hubless.evaluate(gallery, queries, truth, bank, methods, gallery_bank=bank, ks=(1, 5), bootstrap=0, progress=False), queries
    )


score_matrices = st.one_of(
    arrays,
    st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2)).map(
        lambda s: np.random.default_rng(s[2]).standard_normal((s[0], s[1])).astype(np.float32)
    ),
)


def score_rows(n_rows: int, n_cols: int) -> st.SearchStrategy:
    return st.integers(0, 2**16).map(lambda seed: np.random.default_rng(seed).standard_normal((n_rows, n_cols)).astype(np.float32))


@seed(SEED)
@SETTINGS
@given(scores=mostly(score_rows(5, 6), score_matrices), bank=mostly(score_rows(9, 6), score_matrices), method=mostly(GOOD_SPECS, specs),
       top_k=st.one_of(st.none(), st.integers(-1, 8)))  # fmt: skip
def test_score_matrix_mode_refuses_bad_matrices_with_a_hubless_error(scores, bank, method, top_k):
    _refused_or_done(lambda: hubless.correct_scores(scores, bank, method, top_k=top_k), scores, bank)


@seed(SEED)
@SETTINGS
@given(scores=mostly(score_rows(5, 6), score_matrices), bank=mostly(score_rows(9, 6), score_matrices),
       truth=mostly(st.lists(st.integers(0, 5), min_size=5, max_size=5), truths),
       methods=mostly(st.lists(GOOD_SPECS.filter(lambda m: not m.startswith(("dual", "gc", "dn"))), min_size=1, max_size=2), st.lists(specs, min_size=1, max_size=2)))  # fmt: skip
def test_score_matrix_evaluation_refuses_bad_input_with_a_hubless_error(scores, bank, truth, methods):
    _refused_or_done(lambda: hubless.evaluate_scores(scores, truth, bank, methods, ks=(1, 5), bootstrap=0, progress=False), scores, bank)


attributes = st.one_of(
    st.dictionaries(st.sampled_from(["gender", "age", ""]), st.lists(st.sampled_from(["a", "b", None, 1, float("nan")]), max_size=8), max_size=2),
    st.sampled_from([None, {}, "gender", {"gender": "ab"}, {"gender": 3}]),
)  # fmt: skip


@seed(SEED)
@SETTINGS
@given(attributes=mostly(st.lists(st.sampled_from(["a", "b"]), min_size=6, max_size=6).map(lambda v: {"gender": v}), attributes),
       truth=mostly(st.lists(st.integers(0, 5), min_size=4, max_size=4), truths), top_n=mostly(st.integers(1, 6), st.integers(-1, 8)))  # fmt: skip
def test_the_fairness_audit_refuses_bad_input_with_a_hubless_error(attributes, truth, top_n):
    rng = np.random.default_rng(2)
    gallery, queries, bank = _unit(rng, 6), _unit(rng, 4), _unit(rng, 24)
    _refused_or_done(
        lambda: hubless.fairness.audit(gallery, queries, truth, attributes, bank, ["baseline", "nnn:k=3"], top_n=top_n, progress=False)
    )


def test_the_fuzz_reached_the_work():
    """Checks what the fuzz tests of this module did: each call both did its job and refused."""
    if not SEEN:
        pytest.skip("checks what the fuzz tests of this module did: run with them")
    for test in {t for t, _ in SEEN}:
        assert SEEN[test, "done"] >= 3 and SEEN[test, "refused"] >= 10, sorted(SEEN.items())


@pytest.mark.parametrize("attributes", [None, "gender", {"gender": 3}, {"gender": "abcdef"}])
def test_audit_attributes_of_the_wrong_kind_are_refused(attributes):
    """Found by the fuzz above: ``attributes=None`` raised AttributeError, a number len()'s TypeError."""
    from hubless.errors import InvalidType

    rng = np.random.default_rng(2)
    with pytest.raises(InvalidType, match="attribute"):
        hubless.fairness.audit(
            _unit(rng, 6), _unit(rng, 4), [0, 1, 2, 3], attributes, _unit(rng, 24), ["baseline", "nnn:k=3"], progress=False
        )
