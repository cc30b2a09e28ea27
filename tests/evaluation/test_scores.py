"""Score-matrix mode against an independent float64 re-derivation of the QB-Norm authors' procedure.

The reference below is written here from the paper (Bogolin et al. 2022, eqs. 1-2 and section
3.4) and from what the authors' published script does (their ``qb_norm`` and the
collaborative-experts metric they evaluate with): the activation set is the union of every
bank query's top-k gallery items, a query is normalised when its raw top-1 is in it, and a
relevant item tied with others gets the mean of their positions. It works in float64 on whole
matrices; hubless streams float32 blocks in log space. The matrices come from a non-linear
two-expert scorer (no single embedding per item), quantised so that scores tie, with duplicate
gallery items so that whole columns tie.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hubless
from hubless.corrections.score_fit import correct_rows, fit_on_scores, fit_scores
from hubless.errors import InvalidInput, MissingInput
from hubless.score_matrices import correct_scores, evaluate_scores, load_scores, read_pickled_array, tune_scores
from tests.conftest import unit_rows

PER = 5  # captions per item


# ---------------------------------------------------------------- synthetic data: two experts
def _expert_inputs(rng, n, centres=None, noise=0.0):
    """Two feature sets per row: appearance (16-d) and motion (8-d), near ``centres`` if given."""
    a, m = unit_rows(rng, n, 16), unit_rows(rng, n, 8)
    if centres is not None:
        a = centres[0] + noise * a
        m = centres[1] + noise * m
    return a / np.linalg.norm(a, axis=1, keepdims=True), m / np.linalg.norm(m, axis=1, keepdims=True)


def two_expert_scores(queries, items, gate):
    """s(q, r) = g_q cos_a(q, r) + (1 - g_q) tanh(3 cos_m(q, r))^3, g_q = sigmoid(gate . a_q),
    quantised to 1/128 so that scores tie: a mixture of experts, not one dot product."""
    (qa, qm), (ra, rm) = queries, items
    g = 1.0 / (1.0 + np.exp(-(qa @ gate)))
    s = g[:, None] * (qa @ ra.T) + (1 - g[:, None]) * np.tanh(3.0 * (qm @ rm.T)) ** 3
    return (np.round(s * 128) / 128).astype(np.float32)


@pytest.fixture(scope="module")
def video_data():
    """S (test captions x items), SB (bank captions x items), SG (bank items x items), SBT (test
    captions x bank items: the video -> text bank, stored text x video), a query mask with two
    padded captions; items 0 and 1 are duplicates (whole columns tie)."""
    rng = np.random.default_rng(7)
    n_items = 120
    items = _expert_inputs(rng, n_items)
    items = (np.concatenate([items[0][:1], items[0][1:]]), items[1])
    items[0][1], items[1][1] = items[0][0], items[1][0]  # a duplicate item
    rep = lambda x: np.repeat(x, PER, axis=0)  # noqa: E731
    captions = _expert_inputs(rng, n_items * PER, (rep(items[0]), rep(items[1])), noise=1.1)
    bank_items = _expert_inputs(rng, 300)
    bank = _expert_inputs(rng, 900, (np.repeat(bank_items[0], 3, axis=0), np.repeat(bank_items[1], 3, axis=0)), noise=1.1)
    gate = rng.standard_normal(16)
    s = two_expert_scores(captions, items, gate)
    sb = two_expert_scores(bank, items, gate)
    sg = two_expert_scores((bank_items[0], bank_items[1]), items, gate)
    sbt = two_expert_scores(captions, (bank_items[0], bank_items[1]), gate)  # captions x bank items (video -> text bank)
    mask = np.ones(n_items * PER, bool)
    mask[[PER * 3 + 4, PER * 50 + 4]] = False  # two items with one caption fewer (padding rows)
    return {"S": s, "SB": sb, "SG": sg, "SBT": sbt, "mask": mask}


# ---------------------------------------------------------------- the reference (float64)
def ref_activation(sb, k):
    """Union over bank rows of their k best items (ties to the lower index)."""
    order = np.argsort(-sb.astype(np.float64), axis=1, kind="stable")[:, :k]
    return np.unique(order)


def ref_qbnorm(s, sb, beta, k=None):
    """IS (k None) or DIS: exp(beta s) / sum_b exp(beta s(b, r)) for the normalised rows, raw s
    for the others (their procedure, in float64)."""
    s64, sb64 = s.astype(np.float64), sb.astype(np.float64)
    normaliser = np.exp(beta * sb64).sum(axis=0)
    out = s64.copy()
    rows = np.arange(s.shape[0]) if k is None else np.flatnonzero(np.isin(np.argmax(s64, axis=1), ref_activation(sb, k)))
    out[rows] = np.exp(beta * s64[rows]) / normaliser
    return out


def ref_positions(row, target):
    """0-based position of a score among a row's, tied scores averaged (their metric)."""
    greater = np.sum(row > target)
    equal = np.sum(row == target)
    return greater + (equal - 1) / 2.0


def ref_metrics(cols):
    return {
        "R@1": 100 * np.mean(cols == 0), "R@5": 100 * np.mean(cols < 5), "R@10": 100 * np.mean(cols < 10),
        "MdR": np.median(cols) + 1, "MnR": np.mean(cols) + 1,
    }  # fmt: skip


def ref_t2v(sims, mask, per=PER):
    cols = np.array([ref_positions(sims[q], sims[q, q // per]) for q in range(sims.shape[0])])
    return ref_metrics(cols[mask])


def ref_v2t(sims, mask):
    """Each item ranks the captions; its rank is its best caption's; padding captions removed.
    Returns the metrics, the 0-based ranks and whether two of an item's captions tie at its best
    score (where hubless departs: see :func:`test_video_to_text_from_the_same_matrix_matches_the_reference`)."""
    t = np.where(mask[:, None], sims, -np.inf).T
    cols, tied = [], []
    for v in range(t.shape[0]):
        mine = [c for c in range(v * PER, (v + 1) * PER) if mask[c]]
        cols.append(min(ref_positions(t[v], t[v, c]) for c in mine))
        tied.append(sum(t[v, c] == max(t[v, mine]) for c in mine) > 1)
    return ref_metrics(np.array(cols)), np.array(cols), np.array(tied)


def expected_first_place(e: int, t: int) -> float:
    """The mean place (1-based) of the first of ``t`` relevant items in a tie group of ``e``
    when every order of the group is equally likely: P(first at i) = C(e - i, t - 1) / C(e, t)."""
    from math import comb

    return sum(i * comb(e - i, t - 1) for i in range(1, e - t + 2)) / comb(e, t)


def _close(metrics, ref):
    for name, value in ref.items():
        assert metrics[name] == pytest.approx(value, abs=1e-9), (name, metrics[name], value)


# ---------------------------------------------------------------- tests
@pytest.mark.parametrize("spec,k", [("is:beta=20", None), ("dis:beta=20,k_activation=1", 1), ("dis:beta=20,k_activation=3", 3)])
def test_average_ties_match_the_reference_procedure(video_data, spec, k):
    d = video_data
    assert len(np.unique(d["S"])) < d["S"].size / 10  # the quantised scores tie a lot
    ev = evaluate_scores(d["S"], "t2i:5", d["SB"], [spec], ties="average", query_mask=d["mask"], bootstrap=0)
    _close(ev.results[0].metrics, ref_t2v(d["S"], d["mask"]))
    _close(ev.results[1].metrics, ref_t2v(ref_qbnorm(d["S"], d["SB"], 20.0, k), d["mask"]))
    assert ev.inputs["n_queries"] == d["mask"].sum()


def test_average_ties_differ_from_index_ties_on_tied_scores(video_data):
    d = video_data
    avg = evaluate_scores(d["S"], "t2i:5", methods=["baseline"], ties="average", bootstrap=0).results[0].metrics
    index = evaluate_scores(d["S"], "t2i:5", methods=["baseline"], ties="index", bootstrap=0).results[0].metrics
    optimistic = evaluate_scores(d["S"], "t2i:5", methods=["baseline"], ties="optimistic", bootstrap=0).results[0].metrics
    assert optimistic["R@1"] >= index["R@1"] and optimistic["MnR"] < avg["MnR"]
    assert avg["MnR"] != index["MnR"]


def test_video_to_text_from_the_same_matrix_matches_the_reference(video_data):
    """Video -> text (several relevant captions per item) under ties="average" against the QB-Norm
    authors' procedure (their ``v2t_metrics``, break_ties="averaging"): the same rank for every
    item whose best-scoring captions do not tie with each other; where two or more of them tie
    (quantised scores here; duplicate captions in real sets), the authors give the first hit the
    mean position of the whole tie group, which can turn a hit into a miss, while hubless gives
    the expected position of the first relevant item of the group (McSherry & Najork), never
    worse: R@1 counts a group of relevant captions alone at the top."""
    d = video_data
    kept = d["mask"]
    for spec in ("baseline", "is:beta=20"):
        # every matrix stored text x video: S (captions x items), the bank (captions x bank items)
        ev = evaluate_scores(d["S"], "i2t:5", d["SBT"], [spec], ties="average", query_mask=kept, transpose=True, bootstrap=0)
        sims = d["S"]
        if spec != "baseline":  # normalised over the bank of items; padding captions are no candidates
            sims = np.full(d["S"].shape, -np.inf)
            sims[kept] = ref_qbnorm(d["S"][kept].T, d["SBT"][kept].T, 20.0).T
        metrics, cols, tied = ref_v2t(sims, kept)
        ours = ev.results[-1].per_query["MnR"]  # each item's first rank
        if spec == "baseline":  # the quantised raw scores tie: both cases are met
            assert tied.sum() >= 5 and (~tied).sum() >= 50
        else:  # normalised per caption, no two captions tie: the authors' numbers
            assert not tied.any()
            _close(ev.results[-1].metrics, metrics)
        np.testing.assert_array_equal(ours[~tied], cols[~tied] + 1)  # the authors' rank, bitwise
        t = np.where(kept[:, None], sims, -np.inf).T
        for v in np.flatnonzero(tied):
            best = t[v, v * PER : (v + 1) * PER].max()
            above, group = int((t[v] > best).sum()), int((t[v] == best).sum())
            relevant = int((t[v, v * PER : (v + 1) * PER] == best).sum())
            assert ours[v] == pytest.approx(above + expected_first_place(group, relevant), rel=1e-12)
            assert ours[v] < cols[v] + 1  # the authors' mean of the group's positions
        assert ev.inputs["n_queries"] == d["S"].shape[1] and ev.inputs["n_gallery"] == kept.sum()


def test_corrected_matrices_rank_as_the_reference(video_data, tmp_path):
    d = video_data
    for spec, k in (("is:beta=20", None), ("dis:beta=20", 1)):
        ref = ref_qbnorm(d["S"], d["SB"], 20.0, k)
        ranking = correct_scores(d["S"], d["SB"], spec, ranking=True)
        order = np.argsort(-ranking, axis=1, kind="stable")
        ref_order = np.argsort(-ref, axis=1, kind="stable")
        assert (order == ref_order).mean() > 0.999  # only float32-vs-float64 near-ties may swap
        np.testing.assert_array_equal(order[:, :10], ref_order[:, :10])
        shown = correct_scores(d["S"], d["SB"], spec)  # the method's own values: the reference's
        np.testing.assert_allclose(shown, ref, rtol=2e-5, atol=1e-30)
        # the file path: streamed into a .npy; top-k into an .npz
        out = correct_scores(d["S"], d["SB"], spec, out=tmp_path / f"{spec[:3]}.npy")
        np.testing.assert_array_equal(np.load(out), shown)
        top = np.load(correct_scores(d["S"], d["SB"], spec, top_k=7, out=tmp_path / f"{spec[:3]}.npz"))
        np.testing.assert_array_equal(top["ids"], np.argsort(-shown, axis=1, kind="stable")[:, :7])


def test_top_k_of_method_scores_follows_the_ranking_where_they_underflow():
    """With ``top_k`` the best items are those the method ranks first (by its ranking scores),
    and their values the method's own scores: where exp(beta s) underflows to 0 (DualIS at beta
    20 on scores far below the banks'), the ids are still the ranking's, not the lowest ids of a
    row of tied zeros."""
    rng = np.random.default_rng(0)
    g, q, qb, gb = (unit_rows(rng, n, 16) for n in (300, 80, 400, 200))
    S, SB, SG = q @ g.T - 3.0, qb @ g.T, gb @ g.T  # test scores far below the banks'
    ranked = correct_scores(S, SB, "dualis", gallery_bank_scores=SG, top_k=7, ranking=True)
    shown = correct_scores(S, SB, "dualis", gallery_bank_scores=SG, top_k=7)
    assert (shown[0] == 0).all()  # every method score underflows
    np.testing.assert_array_equal(shown[1], ranked[1])
    whole = correct_scores(S, SB, "dualis", gallery_bank_scores=SG)
    np.testing.assert_array_equal(shown[0], np.take_along_axis(whole, shown[1], axis=1))


METHODS = ["baseline", "nnn:alpha=0.75,k=8", "csls:k=4", "is:beta=20", "dis:beta=20", "dualis", "dualdis", "gc"]


def test_score_path_equals_the_embedding_path_when_scores_are_dot_products():
    rng = np.random.default_rng(11)
    gallery, bank, gbank = unit_rows(rng, 150, 24), unit_rows(rng, 700, 24), unit_rows(rng, 200, 24)
    queries = np.repeat(gallery, PER, axis=0) + 0.8 * unit_rows(rng, 150 * PER, 24)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    for ties in ("index", "average"):
        emb = hubless.evaluate(gallery, queries, "t2i:5", bank, METHODS, gallery_bank=gbank, bootstrap=50, ties=ties)
        sco = evaluate_scores(queries @ gallery.T, "t2i:5", bank @ gallery.T, METHODS, gallery_bank_scores=gbank @ gallery.T,
                              bootstrap=50, ties=ties)  # fmt: skip
        for a, b in zip(emb.results, sco.results):
            assert a.spec == b.spec
            assert a.metrics == b.metrics and a.ci95 == b.ci95 and a.delta == b.delta, a.spec
            assert a.hubness == b.hubness, a.spec
    for spec in METHODS:
        on_embeddings = hubless.make_correction(spec).fit(gallery, bank, gbank)
        on_scores = fit_scores(hubless.make_correction(spec), bank @ gallery.T, gbank @ gallery.T)
        # the two paths form s in differently blocked float32 products (1 ulp apart, ~6e-8), and
        # exp(beta s) with beta = 20 magnifies that to ~1e-6 relative (measured 3.6e-6 at most)
        np.testing.assert_allclose(correct_rows(on_scores, queries @ gallery.T), on_embeddings.score(queries), rtol=1e-5, atol=1e-6)


def test_score_statistics_do_not_depend_on_threads(video_data, monkeypatch):
    d = video_data
    fitted = {}
    for threads in ("1", "3"):
        monkeypatch.setenv("HUBLESS_NUM_THREADS", threads)
        fitted[threads] = fit_on_scores(["nnn:k=8", "dis", "dualdis", "gc"], d["SB"], d["SG"])
    for a, b in zip(fitted["1"], fitted["3"]):
        for name in ("bias_columns_", "activation_mask_", "activation_masks_", "probes_"):
            if hasattr(a, name):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


def test_one_fit_on_scores_for_specs_instances_and_one_correction(video_data):
    """One definition (hubless.corrections.score_fit.fit_on_scores): fit_scores is it with
    [correction]; specs and instances fit alike."""
    d = video_data
    from_specs = fit_on_scores(["nnn:k=8", hubless.make_correction("dualdis")], d["SB"], d["SG"])
    alone = [
        fit_scores(hubless.make_correction("nnn:k=8"), d["SB"], d["SG"]),
        fit_scores(hubless.make_correction("dualdis"), d["SB"], d["SG"]),
    ]
    for a, b in zip(from_specs, alone):
        assert a.spec == b.spec
        np.testing.assert_array_equal(a.bias_columns_, b.bias_columns_)


def test_bank_pass_in_small_blocks_and_bad_bank_rows(video_data, monkeypatch):
    import hubless.engine.score_statistics as engine

    d = video_data
    whole = fit_on_scores(["nnn:k=8", "dis:k_activation=2", "dualdis", "gc"], d["SB"], d["SG"])
    monkeypatch.setattr(engine, "SCORE_BLOCK_ELEMENTS", 7 * d["SB"].shape[1])  # 7 rows per block
    blocks = fit_on_scores(["nnn:k=8", "dis:k_activation=2", "dualdis", "gc"], d["SB"], d["SG"])
    for a, b in zip(whole, blocks):
        np.testing.assert_allclose(a.bias_columns_, b.bias_columns_, rtol=1e-6, atol=1e-7) if hasattr(a, "bias_columns_") else None
        for name in ("activation_mask_", "activation_masks_", "probes_"):
            if hasattr(a, name):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    bad = d["SB"].copy()
    bad[123, 4] = np.inf
    with pytest.raises(InvalidInput, match=r"query_bank_scores holds NaN or infinite scores \(row 123\)"):
        fit_on_scores(["is"], bad)


def test_methods_that_need_embeddings_are_refused(video_data, tmp_path):
    d = video_data
    with pytest.raises(InvalidInput, match="embeddings"):
        evaluate_scores(d["S"], "t2i:5", d["SB"], ["is", "dn"])
    with pytest.raises(InvalidInput, match="mean of the query bank's embeddings"):
        fit_scores(hubless.DN(), d["SB"])
    with pytest.raises(MissingInput, match="query_bank_scores"):
        evaluate_scores(d["S"], "t2i:5", None, ["nnn"])
    with pytest.raises(MissingInput, match="gallery_bank_scores"):
        evaluate_scores(d["S"], "t2i:5", d["SB"], ["dualis"])
    with pytest.raises(InvalidInput, match="must score the same items"):
        evaluate_scores(d["S"], "t2i:5", d["SB"][:, :-1], ["is"])
    fitted = fit_scores(hubless.InvertedSoftmax(), d["SB"])
    with pytest.raises(InvalidInput, match="fitted on score matrices"):
        fitted.search(unit_rows(np.random.default_rng(0), 2, 16))
    bad = d["S"].copy()
    bad[3, 2] = np.nan
    with pytest.raises(InvalidInput, match="row 3"):
        evaluate_scores(bad, "t2i:5", d["SB"], ["is"])
    np.save(tmp_path / "S.npy", d["S"])
    np.save(tmp_path / "SB.npy", d["SB"])
    run = _cli("eval", "--scores", tmp_path / "S.npy", "--query-bank-scores", tmp_path / "SB.npy", "--truth", "t2i:5", "-m", "dn")
    assert run.returncode == 2 and "cannot be computed from score matrices" in run.stderr and "Traceback" not in run.stderr


class _Hostile:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_hostile_pickle_is_refused_without_running_anything(tmp_path):
    marker = tmp_path / "pwned"
    payloads = {
        "system": pickle.dumps(_Hostile(marker)),
        "in_array": pickle.dumps([np.zeros(3), _Hostile(marker)]),
        "eval": b"cbuiltins\neval\n(V__import__('os').system('touch " + str(marker).encode() + b"')\ntR.",
    }
    for name, payload in payloads.items():
        path = tmp_path / f"{name}.pkl"
        path.write_bytes(payload)
        with pytest.raises(InvalidInput, match="only numpy arrays"):
            read_pickled_array(path)
        assert not marker.exists(), name
    (tmp_path / "dict.pkl").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(InvalidInput, match="not a numpy array"):
        read_pickled_array(tmp_path / "dict.pkl")
    (tmp_path / "objects.pkl").write_bytes(pickle.dumps(np.array([1, "a"], dtype=object)))
    with pytest.raises(InvalidInput, match="Python objects"):
        read_pickled_array(tmp_path / "objects.pkl")
    run = _cli("eval", "--scores", tmp_path / "system.pkl", "--truth", "t2i:5")
    assert run.returncode == 2 and "only numpy arrays" in run.stderr and not marker.exists()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_pickled_arrays_are_read_at_every_protocol(tmp_path, protocol, dtype):
    array = np.random.default_rng(protocol).standard_normal((7, 5)).astype(dtype)
    path = tmp_path / "m.pkl"
    path.write_bytes(pickle.dumps(array, protocol=protocol))
    np.testing.assert_array_equal(load_scores(path), array)
    path.write_bytes(pickle.dumps(np.asfortranarray(array), protocol=protocol))
    np.testing.assert_array_equal(read_pickled_array(path), array)


def test_npy_is_memory_mapped_and_stored_npz_entries_too(tmp_path, video_data):
    d = video_data
    np.save(tmp_path / "S.npy", d["S"])
    np.savez(tmp_path / "both.npz", S=d["S"], SB=d["SB"])
    np.savez_compressed(tmp_path / "packed.npz", S=d["S"])
    assert isinstance(load_scores(tmp_path / "S.npy"), np.memmap)
    entry = load_scores(f"{tmp_path / 'both.npz'}:SB")
    assert isinstance(entry, np.memmap)
    np.testing.assert_array_equal(entry, d["SB"])
    np.testing.assert_array_equal(load_scores(tmp_path / "packed.npz"), d["S"])
    with pytest.raises(InvalidInput, match="holds 2 arrays"):
        load_scores(tmp_path / "both.npz")


def test_cli_eval_correct_and_tune_on_score_files(tmp_path, video_data):
    import json

    d = video_data
    paths = {}
    for name in ("S", "SB", "SG"):
        paths[name] = tmp_path / f"{name}.npy"
        np.save(paths[name], d[name])
    (tmp_path / "SB.pkl").write_bytes(pickle.dumps(d["SB"]))
    (tmp_path / "mask.pkl").write_bytes(pickle.dumps(d["mask"].reshape(-1, PER).astype(np.float32)))
    run = _cli("eval", "--scores", paths["S"], "--query-bank-scores", tmp_path / "SB.pkl", "--gallery-bank-scores", paths["SG"],
               "--truth", "t2i:5", "-m", "dis", "-m", "dualis", "--ties", "average", "--query-mask", tmp_path / "mask.pkl",
               "--bootstrap", "20", "--out", tmp_path / "ev.json")  # fmt: skip
    assert run.returncode == 0, run.stderr
    saved = json.loads((tmp_path / "ev.json").read_text())
    expected = evaluate_scores(d["S"], "t2i:5", d["SB"], ["dis", "dualis"], gallery_bank_scores=d["SG"], ties="average",
                               query_mask=d["mask"], bootstrap=20)  # fmt: skip
    assert [r["metrics"] for r in saved["results"]] == [r.metrics for r in expected.results]
    from_files = evaluate_scores(paths["S"], "t2i:5", tmp_path / "SB.pkl", ["dis", "dualis"], gallery_bank_scores=str(paths["SG"]),
                                 ties="average", query_mask=tmp_path / "mask.pkl", bootstrap=20)  # fmt: skip
    assert [r.metrics for r in from_files.results] == [r.metrics for r in expected.results]
    assert saved["inputs"]["ties"] == "average" and saved["inputs"]["n_masked"] == 2
    run = _cli("correct", "--scores", paths["S"], "--query-bank-scores", paths["SB"], "-m", "dis:beta=20", "--out", tmp_path / "C.npy")
    assert run.returncode == 0, run.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "C.npy"), correct_scores(d["S"], d["SB"], "dis:beta=20"))
    run = _cli("correct", "--scores", paths["S"], "--query-bank-scores", paths["SB"], "-m", "dis:beta=20", "--out", tmp_path / "C.npy")
    assert run.returncode == 0, run.stderr  # its own earlier output is replaced, as eval's --out is
    np.save(tmp_path / "mine.npy", d["S"])
    run = _cli("correct", "--scores", paths["S"], "--query-bank-scores", paths["SB"], "-m", "dis:beta=20", "--out", tmp_path / "mine.npy")
    assert run.returncode == 2 and "--overwrite" in run.stderr  # a matrix hubless did not write is not replaced silently
    # tune: validation rows are the first 40 items' captions, the test rows the others
    val, test = d["S"][: 40 * PER], d["S"][40 * PER :]
    np.save(tmp_path / "V.npy", val)
    np.save(tmp_path / "T.npy", test)
    np.save(tmp_path / "truth.npy", np.arange(test.shape[0]) // PER + 40)
    np.save(tmp_path / "vtruth.npy", np.arange(val.shape[0]) // PER)
    run = _cli("tune", "--validation-scores", tmp_path / "V.npy", "--validation-truth", tmp_path / "vtruth.npy", "--query-bank-scores", paths["SB"],
               "-m", "nnn", "--scores", tmp_path / "T.npy", "--truth", tmp_path / "truth.npy", "--bootstrap", "0",
               "--out", tmp_path / "tune.json")  # fmt: skip
    assert run.returncode == 0, run.stderr
    tuned = tune_scores(val, np.arange(val.shape[0]) // PER, d["SB"], ["nnn"], test_scores=test)
    assert json.loads((tmp_path / "tune.json").read_text())["best"]["nnn"]["spec"] == tuned.best["nnn"]["spec"]
    with pytest.raises(InvalidInput, match="identical score row"):
        tune_scores(val, np.arange(val.shape[0]) // PER, np.concatenate([d["SB"], val[:3]]), ["nnn"])
    with pytest.raises(InvalidInput, match="identical score row"):
        tune_scores(val, np.arange(val.shape[0]) // PER, d["SB"], ["nnn"], test_scores=d["S"])


def _cli(*args):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src"), "HUBLESS_PROGRESS": "0"}
    return subprocess.run([sys.executable, "-m", "hubless", *map(str, args)], capture_output=True, text=True, env=env, timeout=300)


DOC = Path(__file__).resolve().parents[2] / "docs" / "score-matrices.md"


def doc_commands() -> list[str]:
    """The `hubless ...` commands of docs/score-matrices.md, continuation lines joined."""
    import re

    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    lines = [" ".join(line.split()) for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    return [line for line in lines if line.startswith("hubless ")]


def test_the_docs_commands_run_as_written(tmp_path, monkeypatch):
    """Every command of the how-to page runs on small synthetic files under its own file names
    (the authors' .pkl names for MSR-VTT: 20 caption slots per video, two of them padding)."""
    import shlex

    from typer.testing import CliRunner

    from hubless.cli.main import app

    commands = doc_commands()
    assert len(commands) >= 5
    rng = np.random.default_rng(5)
    n_videos, per = 120, 20
    videos = _expert_inputs(rng, n_videos)
    rep = lambda x, n: np.repeat(x, n, axis=0)  # noqa: E731
    gate = rng.standard_normal(16)

    def captions(centre_ids):
        return _expert_inputs(rng, centre_ids.size, (videos[0][centre_ids], videos[1][centre_ids]), noise=1.0)

    test = two_expert_scores(captions(np.arange(n_videos * per) // per), videos, gate)
    train = two_expert_scores(captions(rng.integers(0, n_videos, 600)), videos, gate)
    val = two_expert_scores(captions(rep(np.arange(n_videos), 3)), videos, gate)
    mask = np.ones((n_videos, per), np.float32)
    mask[[4, 17], per - 1] = 0
    (tmp_path / "msrvtt").mkdir()
    for name, array in (("tt-ce-test-captions-test-videos-seed0", test), ("tt-ce-train-captions-test-videos-seed0", train),
                        ("tt-ce-test-query_masks", mask)):  # fmt: skip
        (tmp_path / "msrvtt" / f"{name}.pkl").write_bytes(pickle.dumps(array))
    for name, array in (("S", test), ("SB", train), ("val-captions-test-videos", val), ("train-captions-test-videos", train),
                        ("test-captions-test-videos", test), ("val-truth", rep(np.arange(n_videos), 3))):  # fmt: skip
        np.save(tmp_path / f"{name}.npy", array)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HUBLESS_PROGRESS", "0")
    for command in commands:
        result = CliRunner().invoke(app, shlex.split(command)[1:])
        assert result.exit_code == 0, f"{command}\n{result.output}"
    # the first command's numbers: the reference procedure's, with the padding captions masked
    expected = ref_t2v(ref_qbnorm(test, train, 20.0, 1), mask.reshape(-1) != 0, per)
    import json

    saved = json.loads((tmp_path / "msrvtt-tt-ce.json").read_text())
    _close(saved["results"][1]["metrics"], {k: v for k, v in expected.items()})


def brute_force_ranks(row: np.ndarray, relevant: list[int]) -> dict[str, list[float]]:
    """Each relevant item's rank under each tie rule, read off orderings of ``row``: "index" the
    stable sort; "optimistic" the sort that puts a tie group's relevant items first (by index);
    "average" the mean, over every order of each tie group, of the item's position, the group's
    relevant items taking their places by index (enumerated, not a formula)."""
    import itertools

    stable = sorted(range(len(row)), key=lambda j: (-row[j], j))
    optimistic = sorted(range(len(row)), key=lambda j: (-row[j], j not in relevant, j))
    out: dict[str, list[float]] = {"index": [], "optimistic": [], "average": []}
    for j in relevant:
        out["index"].append(stable.index(j) + 1)
        out["optimistic"].append(optimistic.index(j) + 1)
        group = [i for i in range(len(row)) if row[i] == row[j]]
        above = sum(1 for i in range(len(row)) if row[i] > row[j])
        mine = sorted(i for i in group if i in relevant).index(j)  # j is the mine-th relevant item of its group
        positions = []
        for order in itertools.permutations(group):
            places = [p for p, i in enumerate(order, start=1) if i in relevant]
            positions.append(above + places[mine])
        out["average"].append(float(np.mean(positions)))
    return out


@settings(max_examples=80, deadline=None)
@given(
    n_queries=st.integers(1, 5),
    n_gallery=st.integers(1, 7),
    levels=st.integers(1, 4),
    per=st.integers(1, 4),
    seed=st.integers(0, 10_000),
)
def test_tie_conventions_against_orderings(n_queries, n_gallery, levels, per, seed):
    """relevant_ranks under each tie rule, with one to four relevant items per query and many
    ties, equals the rank read off the orderings the rule describes (:func:`brute_force_ranks`)."""
    from hubless.metrics import Truth, relevant_ranks

    rng = np.random.default_rng(seed)
    scores = rng.integers(0, levels, (n_queries, n_gallery)).astype(np.float32)  # few values: many ties
    lists = [sorted(rng.choice(n_gallery, min(per, n_gallery), replace=False).tolist()) for _ in range(n_queries)]
    truth = Truth.from_lists(lists, n_gallery)
    expected: dict[str, list[float]] = {"index": [], "average": [], "optimistic": []}
    for q, items in enumerate(lists):
        for ties, values in brute_force_ranks(scores[q], items).items():
            expected[ties] += values
    for ties, values in expected.items():
        np.testing.assert_allclose(relevant_ranks(scores, truth, ties), values, rtol=1e-12, err_msg=ties)
