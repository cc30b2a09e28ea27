"""Bad input to the Python API's main calls, generated (hypothesis): method specs, arrays of any
shape, dtype and content (NaN, Inf, zeros, empty, integers, objects), ``top_k`` and ground truth of
any kind. Each call either does its job or raises a :class:`hubless.errors.HublessError` with a
message; never another exception (an IndexError, a numpy or FAISS error a user would have to
decode), and a refused call changes no input array."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hubless
from hubless.errors import HublessError
from hubless.metrics import load_truth
from tests import reference as ref

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


@st.composite
def one_bad(draw, **arguments: tuple[st.SearchStrategy, st.SearchStrategy]) -> dict:
    """Each argument from its valid strategy but one, drawn from its fuzzed strategy (none bad in
    one example of N + 1): one bad argument at a time meets the checks and the work behind them,
    and a steady share of the examples does the work. (Drawing every argument "mostly valid"
    made that share hang on the constants hypothesis gathers from the modules imported before,
    so a fuzz reached the work or not depending on which tests ran first.)"""
    bad = draw(st.sampled_from([None, *arguments]))
    return {name: draw(fuzzed if name == bad else valid) for name, (valid, fuzzed) in arguments.items()}


def unit_arrays(n: int) -> st.SearchStrategy:
    return st.integers(0, 2**16).map(lambda seed: _unit(np.random.default_rng(seed), n))


def _unit(rng, n):
    a = rng.standard_normal((n, D)).astype(np.float32)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


class Fuzz:
    """What one fuzz test's calls did: each either did its job, its result checked against an
    independent computation, or refused with a :class:`HublessError` that says what is wrong,
    changing no input array. :meth:`reached_the_work` then checks that both happened often."""

    def __init__(self) -> None:
        self.done = self.refused = 0

    def call(self, call, *inputs, check=None):
        before = [np.array(a, copy=True) if isinstance(a, np.ndarray) else None for a in inputs]
        try:
            result = call()
        except HublessError as exc:
            self.refused += 1
            assert str(exc).strip(), "an error says what is wrong"
            for a, b in zip(inputs, before):
                if b is not None:
                    np.testing.assert_array_equal(a, b)  # a refused call changed no input
            return None
        self.done += 1
        if check is not None:
            check(result)  # done: the right answer, not merely an answer
        return result

    def reached_the_work(self) -> None:
        assert self.done >= 3 and self.refused >= 10, f"done {self.done}, refused {self.refused}"


def _unit64(x) -> np.ndarray:
    """The rows of ``x`` as the library reads them (float32, unit length), in float64."""
    a = np.asarray(x, np.float32).astype(np.float64)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


def _reference_scores(corr, queries, gallery, bank) -> np.ndarray:
    """The method's scores of ``queries`` over ``gallery`` by the papers' formulas
    (``tests/reference.py``: no hubless code), every input read as unit rows."""
    q, g, b = _unit64(queries), _unit64(gallery), _unit64(bank)
    p = corr.get_params()
    formulas = {
        "baseline": lambda: ref.cos(q, g),
        "nnn": lambda: ref.nnn(q, g, b, p.get("alpha"), p.get("k")),
        "csls": lambda: ref.csls(q, g, b, p.get("k")),
        "dn": lambda: ref.dn(q, g, b, p.get("lam"), gallery_ref=b),
        "is": lambda: ref.inverted_softmax(q, g, b, p.get("beta")),
        "dis": lambda: ref.dynamic_inverted_softmax(q, g, b, p.get("beta"), p.get("k_activation")),
        "dualis": lambda: ref.dual_is(q, g, b, b, p.get("beta_query"), p.get("beta_gallery")),
        "gc": lambda: ref.global_correction(q, g, b),
    }
    with np.errstate(all="ignore"):
        return formulas[corr.name]()


def _same_ranking_where_defined(ids, ref_scores, top_k) -> None:
    """``ids`` rank as ``ref_scores`` do (near-ties aside); a reference that over- or underflows in
    float64 (exp(beta s) of a huge beta) proves nothing and is left out."""
    if np.isfinite(ref_scores).all() and np.ptp(ref_scores, axis=1).min(initial=1.0) > 0:
        ref.assert_same_ranking(ids, ref_scores, top_k, atol=1e-4 * max(1.0, float(np.abs(ref_scores).max())))


def _fit_is_right(spec, gallery, bank):
    def check(corr):
        probe = _unit(np.random.default_rng(5), 4)
        if probe.shape[1] != corr.dim_:
            probe = np.random.default_rng(5).standard_normal((4, corr.dim_)).astype(np.float32)
        top_k = min(3, corr.n_gallery_)
        _same_ranking_where_defined(corr.search(probe, top_k)[1], _reference_scores(corr, probe, gallery, bank), top_k)

    return check


@seed(SEED)
@SETTINGS
@given(args=one_bad(spec=(GOOD_SPECS, specs), gallery=(unit_arrays(10), arrays), bank=(unit_arrays(20), arrays)))
def _fit_fuzz(fuzz, args):
    spec, gallery, bank = args["spec"], args["gallery"], args["bank"]
    fit = lambda: hubless.make_correction(spec).fit(gallery, bank, gallery_bank=bank, progress=False)  # noqa: E731
    fuzz.call(fit, gallery, bank, check=_fit_is_right(spec, gallery, bank))


def test_fit_refuses_bad_specs_and_arrays_with_a_hubless_error():
    fuzz = Fuzz()
    _fit_fuzz(fuzz)
    fuzz.reached_the_work()


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    gallery, bank = _unit(rng, 10), _unit(rng, 20)
    index = hubless.Index.build(gallery, bank, "nnn:alpha=0.5,k=3", "Flat")
    return gallery, bank, index, hubless.make_correction("is").fit(gallery, bank, progress=False)


def _search_is_right(corr, queries, top_k, gallery, bank):
    def check(result):
        scores, ids = result[0], result[1]
        found = min(int(top_k), gallery.shape[0])
        assert scores.shape == ids.shape == (np.shape(queries)[0], int(top_k))
        assert (ids[:, found:] == -1).all()  # a top_k beyond the gallery: empty slots, last
        _same_ranking_where_defined(ids[:, :found], _reference_scores(corr, queries, gallery, bank), found)

    return check


@seed(SEED)
@SETTINGS
@given(
    args=one_bad(
        queries=(unit_arrays(3), arrays),
        top_k=(st.integers(1, 12), st.one_of(st.integers(-3, 40), st.sampled_from([2**63, 1.5, "3", None, True]))),
    )
)
def _search_fuzz(fuzz, fitted, args):
    queries, top_k = args["queries"], args["top_k"]
    gallery, bank, index, corr = fitted
    for search, searched in ((index.search, index.correction), (corr.search, corr)):
        check = _search_is_right(searched, queries, top_k, gallery, bank)
        fuzz.call(lambda search=search: search(queries, top_k), queries, check=check)


def test_search_refuses_bad_queries_and_top_k_with_a_hubless_error(fitted):
    fuzz = Fuzz()
    _search_fuzz(fuzz, fitted)
    fuzz.reached_the_work()


truths = st.one_of(
    arrays,
    st.lists(st.integers(-2, 12), max_size=8),
    st.lists(st.lists(st.integers(-2, 12), max_size=3), max_size=8),
    st.sampled_from(["t2i:2", "i2t:2", "t2i:0", "t2i:x", "no-such-file.npy", "t2i:-1"]),
)


def _best_ranks(scores: np.ndarray, truth) -> np.ndarray:
    """Each query's best rank (0-based) of a relevant item under ``scores`` (ties: lower index first)."""
    order = ref.ranking(scores)
    position = np.argsort(order, axis=1)
    return np.array([position[i, truth.indices[truth.indptr[i] : truth.indptr[i + 1]]].min() for i in range(scores.shape[0])])


def _baseline_recall_is_right(similarities, truth):
    """The baseline's R@1 and R@5 are those of a brute-force ranking of ``similarities()``
    (queries x gallery; computed once the call is done, from input it accepted)."""

    def check(ev):
        scores = similarities()
        relevant = load_truth(truth, *scores.shape)
        best = _best_ranks(scores, relevant)
        for k in (1, 5):
            assert ev.results[0].metrics[f"R@{k}"] == pytest.approx(100 * np.mean(best < k)), k

    return check


@seed(SEED)
@SETTINGS
@given(data=st.data())
def _evaluate_fuzz(fuzz, data):
    rng = np.random.default_rng(1)
    n_queries = data.draw(st.integers(1, 8))
    gallery, queries, bank = _unit(rng, 6), _unit(rng, n_queries), _unit(rng, 12)  # R@1 and R@5 of a 6-item gallery
    args = data.draw(
        one_bad(
            truth=(st.lists(st.integers(0, 5), min_size=n_queries, max_size=n_queries), truths),
            methods=(st.lists(GOOD_SPECS, min_size=1, max_size=2), st.lists(specs, min_size=1, max_size=2)),
        )
    )
    truth, methods = args["truth"], args["methods"]
    evaluate = lambda: hubless.evaluate(gallery, queries, truth, bank, methods, gallery_bank=bank, ks=(1, 5), bootstrap=0, progress=False)  # noqa: E731
    fuzz.call(evaluate, queries, check=_baseline_recall_is_right(lambda: _unit64(queries) @ _unit64(gallery).T, truth))


def test_evaluate_refuses_bad_truth_with_a_hubless_error():
    fuzz = Fuzz()
    _evaluate_fuzz(fuzz)
    fuzz.reached_the_work()


score_matrices = st.one_of(
    arrays,
    st.tuples(st.integers(1, 6), st.integers(1, 6), st.integers(0, 2)).map(
        lambda s: np.random.default_rng(s[2]).standard_normal((s[0], s[1])).astype(np.float32)
    ),
)


def score_rows(n_rows: int, n_cols: int) -> st.SearchStrategy:
    return st.integers(0, 2**16).map(lambda seed: np.random.default_rng(seed).standard_normal((n_rows, n_cols)).astype(np.float32))


def _topk_mean(matrix: np.ndarray, k: int, axis: int) -> np.ndarray:
    return -np.sort(-matrix, axis=axis).take(range(min(k, matrix.shape[axis])), axis=axis).mean(axis=axis)


def _reference_corrected(method: str, s: np.ndarray, sb: np.ndarray) -> np.ndarray | None:
    """A method's scores from the score matrices by the papers' formulas (None: a method left to
    the other tests; its result is checked for shape only)."""
    corr = hubless.make_correction(method)
    p = corr.get_params()
    with np.errstate(all="ignore"):
        if corr.name == "baseline":
            return s
        if corr.name == "nnn":
            return s - p["alpha"] * _topk_mean(sb, p["k"], 0)[None, :]
        if corr.name == "csls":
            return 2 * s - _topk_mean(s, p["k"], 1)[:, None] - _topk_mean(sb, p["k"], 0)[None, :]
        if corr.name == "is":
            return np.exp(p["beta"] * s) / np.exp(p["beta"] * sb).sum(axis=0)[None, :]
        if corr.name == "gc":
            return s - (sb[None, :, :] > s[:, None, :]).sum(axis=1)
    return None


def _correction_is_right(method, scores, bank, top_k):
    def check(result):
        s, sb = np.asarray(scores, np.float32).astype(np.float64), np.asarray(bank, np.float32).astype(np.float64)
        want = _reference_corrected(method, s, sb)
        if top_k is None:
            assert result.shape == s.shape
            ids, k = ref.ranking(np.asarray(result, np.float64)), s.shape[1]
        else:
            k = min(top_k, s.shape[1])
            ids = result[1][:, :k]
        if want is not None:
            _same_ranking_where_defined(ids[:, :k], want, k)

    return check


@seed(SEED)
@SETTINGS
@given(
    args=one_bad(scores=(score_rows(5, 6), score_matrices), bank=(score_rows(9, 6), score_matrices), method=(GOOD_SPECS, specs)),
    top_k=st.one_of(st.none(), st.integers(-1, 8)),
)
def _correct_fuzz(fuzz, args, top_k):
    scores, bank, method = args["scores"], args["bank"], args["method"]
    check = _correction_is_right(method, scores, bank, top_k)
    fuzz.call(lambda: hubless.correct_scores(scores, bank, method, top_k=top_k), scores, bank, check=check)


def test_score_matrix_mode_refuses_bad_matrices_with_a_hubless_error():
    fuzz = Fuzz()
    _correct_fuzz(fuzz)
    fuzz.reached_the_work()


@seed(SEED)
@SETTINGS
@given(
    args=one_bad(
        scores=(score_rows(5, 6), score_matrices),
        bank=(score_rows(9, 6), score_matrices),
        truth=(st.lists(st.integers(0, 5), min_size=5, max_size=5), truths),
        methods=(
            st.lists(GOOD_SPECS.filter(lambda m: not m.startswith(("dual", "gc", "dn"))), min_size=1, max_size=2),
            st.lists(specs, min_size=1, max_size=2),
        ),
    )
)
def _score_evaluation_fuzz(fuzz, args):
    scores, bank, truth, methods = args["scores"], args["bank"], args["truth"], args["methods"]
    evaluate = lambda: hubless.evaluate_scores(scores, truth, bank, methods, ks=(1, 5), bootstrap=0, progress=False)  # noqa: E731
    fuzz.call(evaluate, scores, bank, check=_baseline_recall_is_right(lambda: np.asarray(scores, np.float32).astype(np.float64), truth))


def test_score_matrix_evaluation_refuses_bad_input_with_a_hubless_error():
    fuzz = Fuzz()
    _score_evaluation_fuzz(fuzz)
    fuzz.reached_the_work()


attributes = st.one_of(
    st.dictionaries(st.sampled_from(["gender", "age", ""]), st.lists(st.sampled_from(["a", "b", None, 1, float("nan")]), max_size=8), max_size=2),
    st.sampled_from([None, {}, "gender", {"gender": "ab"}, {"gender": 3}]),
)  # fmt: skip


def _audit_is_right(gallery, queries, truth, top_n):
    """The baseline's precision@n is that of a brute-force top n of the plain similarities."""

    def check(result):
        n = min(int(top_n), gallery.shape[0])
        relevant = load_truth(truth, queries.shape[0], gallery.shape[0])
        top = ref.ranking(_unit64(queries) @ _unit64(gallery).T)[:, :n]
        hits = [np.isin(top[i], relevant.indices[relevant.indptr[i] : relevant.indptr[i + 1]]).mean() for i in range(queries.shape[0])]
        assert result["baseline"].metrics[f"precision@{n}"] == pytest.approx(np.mean(hits))

    return check


@seed(SEED)
@SETTINGS
@given(
    args=one_bad(
        attributes=(st.lists(st.sampled_from(["a", "b"]), min_size=6, max_size=6).map(lambda v: {"gender": v}), attributes),
        truth=(st.lists(st.integers(0, 5), min_size=4, max_size=4), truths),
        top_n=(st.integers(1, 6), st.integers(-1, 8)),
    )
)
def _audit_fuzz(fuzz, args):
    attributes, truth, top_n = args["attributes"], args["truth"], args["top_n"]
    rng = np.random.default_rng(2)
    gallery, queries, bank = _unit(rng, 6), _unit(rng, 4), _unit(rng, 24)
    audit = lambda: hubless.fairness.audit(gallery, queries, truth, attributes, bank, ["baseline", "nnn:k=3"], top_n=top_n, progress=False)  # noqa: E731
    fuzz.call(audit, check=_audit_is_right(gallery, queries, truth, top_n))


def test_the_fairness_audit_refuses_bad_input_with_a_hubless_error():
    fuzz = Fuzz()
    _audit_fuzz(fuzz)
    fuzz.reached_the_work()


@pytest.mark.parametrize("attributes", [None, "gender", {"gender": 3}, {"gender": "abcdef"}])
def test_audit_attributes_of_the_wrong_kind_are_refused(attributes):
    """Found by the fuzz above: ``attributes=None`` raised AttributeError, a number len()'s TypeError."""
    from hubless.errors import InvalidType

    rng = np.random.default_rng(2)
    with pytest.raises(InvalidType, match="attribute"):
        hubless.fairness.audit(
            _unit(rng, 6), _unit(rng, 4), [0, 1, 2, 3], attributes, _unit(rng, 24), ["baseline", "nnn:k=3"], progress=False
        )
