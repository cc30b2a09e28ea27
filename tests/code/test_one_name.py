"""One name per concept and one meaning per flag (issue 28 item 6, issue 53): ``weight=`` for the
correction's weight at search time everywhere (the method's own name still works until 0.2.0,
with a DeprecationWarning), ``fusion_weight`` for the
rerank fusion weight (``lam=`` / ``--lam`` / ``--alpha`` deprecated), a folder means the same
rows with and without ``--ray``, and ``for_queries`` gives a query side that claims no fit."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.corrections.additive import QuerySide
from hubless.errors import InvalidType, NotFitted
from tests.conftest import unit_rows

runner = CliRunner()


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(8)
    return unit_rows(rng, 300, 12), unit_rows(rng, 500, 12), unit_rows(rng, 9, 12)


@pytest.mark.parametrize("spec, own", [("nnn:alpha=0.75,k=8", "alpha"), ("dn:lam=0.5", "lam")])
def test_weight_is_the_name_everywhere(arrays, spec, own):
    gallery, bank, queries = arrays
    gb = bank if spec.startswith("dn") else None
    corr = hubless.make_correction(spec).fit(gallery, bank, gb)
    index = hubless.Index.build(gallery, bank, spec, "IVF4,Flat", gallery_bank=gb, nprobe=4)
    for searcher in (corr, index):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # weight= is the one name: no warning
            by_weight = searcher.search(queries, 5, weight=0.2)
        # the method's own name still works until 0.2.0, with a warning pointing at the caller's line
        with pytest.warns(DeprecationWarning, match=f"{own}= at search time is deprecated: use weight=") as caught:
            by_own = searcher.search(queries, 5, **{own: 0.2})
        assert {w.filename for w in caught} == {__file__}
        np.testing.assert_array_equal(by_weight.ids, by_own.ids)
        np.testing.assert_array_equal(by_weight.scores, by_own.scores)
    assert not np.array_equal(corr.search(queries, 5, weight=0.0)[1], corr.search(queries, 5, weight=3.0)[1])
    with pytest.raises(InvalidType, match="accepts weight="):
        corr.search(queries, 5, weight=0.2, **{own: 0.2})
    with pytest.raises(ValueError, match="weight must be"):
        corr.search(queries, 5, weight=-1.0)


def test_a_method_without_a_weight_refuses_it(arrays):
    gallery, bank, queries = arrays
    corr = hubless.make_correction("is:beta=20").fit(gallery, bank)
    with pytest.raises(InvalidType, match="no query-time weight"):
        corr.search(queries, 5, weight=0.5)


def test_pipeline_fusion_weight_and_the_deprecated_lam(arrays):
    from hubless.rerank import CallableReranker, Pipeline

    gallery, bank, queries = arrays
    nnn = hubless.NNN(k=8).fit(gallery, bank)
    reranker = CallableReranker(lambda q, c: [float(len(str(x))) for x in c])
    items = [f"item {i}" for i in range(300)]
    new = Pipeline(nnn, reranker, k=10, fusion="add", fusion_weight=0.7, gallery_items=items).search(queries, ["q"] * 9, top_k=5)
    with pytest.warns(DeprecationWarning, match="fusion_weight"):
        old = Pipeline(nnn, reranker, k=10, fusion="add", lam=0.7, gallery_items=items)
    assert old.fusion_weight == 0.7
    np.testing.assert_array_equal(old.search(queries, ["q"] * 9, top_k=5).ids, new.ids)


def test_cli_weight_and_deprecated_alpha(tmp_path, arrays):
    gallery, bank, queries = arrays
    np.save(tmp_path / "q.npy", queries)
    hubless.Index.build(gallery, bank, "dn:lam=0.5", "Flat", gallery_bank=bank).save(tmp_path / "idx")
    new = runner.invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--weight", "0.1", "--json"])
    old = runner.invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--alpha", "0.1", "--json"])
    assert new.exit_code == 0 and old.exit_code == 0, new.output + old.output
    ids = hubless.Index.load(tmp_path / "idx").search(queries, 10, weight=0.1)[1]
    rows = lambda out: [[h["id"] for h in json.loads(line)["hits"]] for line in out.splitlines() if line.startswith("{")]  # noqa: E731
    assert rows(new.stdout) == rows(old.stdout) == ids.tolist()
    assert "--alpha is deprecated: use --weight" in old.output and "deprecated" not in new.output
    both = runner.invoke(app, ["search", str(tmp_path / "idx"), "--queries", str(tmp_path / "q.npy"), "--weight", "0.1", "--alpha", "0.1"])
    assert both.exit_code == 2 and "give only --weight" in both.output


def test_a_folder_is_the_same_rows_with_and_without_ray(tmp_path, arrays):
    from hubless.inputs import load_array
    from hubless.storage.sources import open_source

    gallery, _, _ = arrays
    shards = tmp_path / "shards"
    shards.mkdir()
    for i, part in enumerate(np.array_split(gallery, 11)):  # part-10 after part-9: natural order
        np.save(shards / f"part-{i}.npy", part)
    clip = tmp_path / "clip"
    (clip / "img_emb").mkdir(parents=True)
    (clip / "text_emb").mkdir()
    for i, part in enumerate(np.array_split(gallery, 3)):
        np.save(clip / "img_emb" / f"img_emb_{i}.npy", part)
        np.save(clip / "text_emb" / f"text_emb_{i}.npy", part[::-1])
    for folder, expected in (
        (str(shards), gallery),
        (str(clip), gallery),
        (f"{clip}:text", np.concatenate([p[::-1] for p in np.array_split(gallery, 3)])),
    ):
        one_machine = load_array(folder)
        source = open_source(folder)
        np.testing.assert_array_equal(one_machine, expected)
        np.testing.assert_array_equal(source.read(0, source.n_rows), expected)


def test_for_queries_gives_a_query_side_that_cannot_search(arrays):
    gallery, bank, queries = arrays
    fitted = hubless.make_correction("is:beta=20").fit(gallery, bank)
    side = hubless.make_correction("is:beta=20").for_queries(fitted.query_state(), 12, fitted.bias_columns_.shape[1])
    assert isinstance(side, QuerySide) and not hasattr(side, "search") and not hasattr(side, "is_fitted")
    batch, fitted_batch = side.queries(queries), fitted.queries(queries)
    np.testing.assert_array_equal(side.weights(batch), fitted.weights(fitted_batch))
    ranking = queries @ gallery.T - fitted.weights(fitted_batch) @ fitted.bias_columns_.T
    np.testing.assert_allclose(side.method_scores(batch, ranking), fitted.method_scores(fitted_batch, ranking), rtol=1e-6)
    unfitted = hubless.make_correction("nnn")
    unfitted.for_queries({}, 12, 1)
    with pytest.raises(NotFitted):
        unfitted.search(queries, 3)
