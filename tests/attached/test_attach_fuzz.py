"""The attached search with generated arguments, good and bad (hypothesis): queries of any shape,
dtype and content, ``top_k``, ``candidates``, ``max_candidates``, weights and store knobs. Each
call either answers (every found slot one of the collection's ids, its score finite, best first,
the exact corrected top-k when the candidates cover the collection) or is refused with a
:class:`hubless.errors.HublessError`; never another exception."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from hubless.errors import HublessError

#: The fuzz's examples: the same every run and in every checkout.
SEED = 20261127
#: "refused", "answered", "exact" (answered and checked against brute force): the fuzz's outcomes.
SEEN: Counter = Counter()
D, N = 4, 30

rng = np.random.default_rng(5)


def _unit(n):
    a = rng.standard_normal((n, D)).astype(np.float32)
    return a / np.linalg.norm(a, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def attached(tmp_path_factory):
    faiss = pytest.importorskip("faiss")
    from hubless.attached import attach

    root = tmp_path_factory.mktemp("attached")
    gallery, ids = _unit(N), np.arange(N, dtype=np.int64) * 5 + 7
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(D))
    index.add_with_ids(gallery, ids)
    faiss.write_index(index, str(root / "c.faiss"))
    bank = _unit(50)
    return attach(str(root / "c.faiss"), bank, "nnn:alpha=0.5,k=4", out=root / "side", progress=False), gallery, ids, bank


queries = st.one_of(
    st.integers(1, 4).map(_unit),
    st.integers(1, 4).map(_unit),
    st.tuples(st.sampled_from([np.float32, np.float64, np.int64, np.bool_, np.complex64]), hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)).flatmap(
        lambda ds: hnp.arrays(ds[0], ds[1])
    ),
    st.sampled_from([None, "q", [[1.0] * D], [[float("nan")] * D], np.zeros((2, D), np.float32)]),
)  # fmt: skip
counts = st.one_of(st.none(), st.integers(-2, 2 * N), st.sampled_from([2**63, 1.5, "8", True]))
options = st.dictionaries(
    st.sampled_from(["alpha", "weight", "nprobe", "ef_search", "lam", "nope"]),
    st.one_of(st.floats(allow_nan=True), st.integers(-3, 10), st.sampled_from([None, "x", 2**70])),
    max_size=2,
)


@seed(SEED)
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(q=queries, top_k=st.one_of(st.integers(1, 12), counts), candidates=counts, max_candidates=counts, extra=options)
def test_the_attached_search_answers_or_refuses_with_a_hubless_error(attached, q, top_k, candidates, max_candidates, extra):
    collection, gallery, ids, bank = attached
    try:
        result = collection.search_certified(q, top_k, candidates=candidates, max_candidates=max_candidates, **extra)
    except HublessError as exc:
        SEEN["refused"] += 1
        assert str(exc).strip()
        return
    SEEN["answered"] += 1
    found = result.found  # which slots hold a hit: read from the mask, never from the id
    assert found.shape == result.ids.shape == result.scores.shape and found.shape[1] == int(top_k)
    assert np.isin(result.ids[found], ids).all() and np.all(np.isfinite(result.scores[found]))
    assert (found.sum(axis=1) == min(int(top_k), N)).all() and not (np.diff(found.astype(int), axis=1) > 0).any()  # filled first
    assert not (result.exact & ~result.certified).any()  # exact is certified and more
    with np.errstate(invalid="ignore"):  # -inf - -inf past the collection's end
        assert not (np.diff(np.where(found, result.scores, -np.inf), axis=1) > 0).any()  # best first
    if candidates is not None and not isinstance(candidates, bool) and isinstance(candidates, int) and candidates >= N and not extra:
        alpha = 0.5
        bias = -np.sort(-(bank @ gallery.T), axis=0)[:4].mean(axis=0)
        rows = np.asarray(q, np.float32)
        rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
        exact = rows @ gallery.T - alpha * bias
        top = np.argsort(-exact, axis=1, kind="stable")[:, : min(int(top_k), N)]
        np.testing.assert_allclose(result.scores[:, : top.shape[1]], np.take_along_axis(exact, top, axis=1), atol=2e-5)
        SEEN["exact"] += 1


def test_the_fuzz_answered_refused_and_checked():
    if not SEEN:
        pytest.skip("checks what the fuzz test of this module did: run with it")
    assert SEEN["answered"] >= 20 and SEEN["refused"] >= 20 and SEEN["exact"] >= 3, SEEN
