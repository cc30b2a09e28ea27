"""NNN against the authors' reference implementation, `nnn-retrieval` (PyPI, package `nnn`)."""

from __future__ import annotations

import numpy as np
import pytest

import hubless
from hubless import UnnormalizedEmbeddingsWarning

nnn_ref = pytest.importorskip("nnn", reason="nnn-retrieval is in the test extra")


def _reference_search(gallery, bank, queries, alpha, k, top_k):
    retriever = nnn_ref.NNNRetriever(gallery.shape[1])
    ranker = nnn_ref.NNNRanker(retriever, gallery, bank, alternate_ks=k, batch_size=64, alternate_weight=alpha)
    return ranker.search(queries, top_k)


@pytest.mark.parametrize("alpha,k", [(0.75, 16), (0.25, 1), (1.5, 128), (0.5, 7)])
def test_matches_nnn_retrieval_on_random_data(alpha, k):
    rng = np.random.default_rng(k)
    unit = lambda n, d: (lambda x: x / np.linalg.norm(x, axis=1, keepdims=True))(  # noqa: E731
        rng.standard_normal((n, d))
    ).astype(np.float32)
    gallery, bank, queries = unit(500, 32), unit(2000, 32), unit(300, 32)
    ref_scores, ref_ids = _reference_search(gallery, bank, queries, alpha, k, 10)
    scores, ids = hubless.NNN(alpha=alpha, k=k).fit(gallery, bank).search(queries, top_k=10)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5, rtol=0)


def _published_fixture():
    """The fixture of the reference repository's own test: five unit retrieval vectors, queries
    between each and a shared axis, and reference queries jittered by +-0.01 (so not unit)."""
    retrieval = np.array([[0, 1.0, 0, 0], [1, 0, 0, 0], [0, -1, 0, 0], [-1, 0, 0, 0], [0, 0, 1, 0]], dtype=np.float32)
    queries = np.array([[0, 0.6, 0.8, 0], [0.6, 0, 0.8, 0], [0, -0.6, 0.8, 0], [-0.6, 0, 0.8, 0], [0, 0, 1, 0]], dtype=np.float32)
    jitter = 0.01
    shifts = [[0, jitter, 0, 0], [0, -jitter, 0, 0], [jitter, 0, 0, 0], [-jitter, 0, 0, 0]]
    references = np.concatenate([queries + np.array(s, dtype=np.float32) for s in shifts])
    return retrieval, queries, references


def test_published_fixture_moves_top1_off_the_hub():
    retrieval, queries, references = _published_fixture()
    base_scores, base_ids = hubless.Baseline(normalize=False).fit(retrieval).search(queries, top_k=1)
    assert base_ids[:, 0].tolist() == [4, 4, 4, 4, 4]
    np.testing.assert_allclose(base_scores[:, 0], [0.8, 0.8, 0.8, 0.8, 1.0], atol=2e-5)
    with pytest.warns(UnnormalizedEmbeddingsWarning, match="query_bank"):
        nnn = hubless.NNN(alpha=0.75, k=2, normalize=False).fit(retrieval, references)
    scores, ids = nnn.search(queries, top_k=1)
    assert ids[:, 0].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_allclose(scores[:, 0], [0.14625, 0.14625, 0.14625, 0.14625, 0.25], atol=2e-5)
    ref_scores, ref_ids = _reference_search(retrieval, references, queries, 0.75, 2, 1)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, atol=1e-5)
