"""One pass per bank: evaluate, tune, the fairness audit and the CLI fit every correction from
one streamed gallery x bank product (counted here at the engine's block products), the bank's
coverage comes from that same product (checked against brute force), and the log-sum-exp's two
exact forms keep the documented accuracy against float64."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
import hubless.engine.stream as stream
from hubless.banks import bank_report
from hubless.cli.main import app
from hubless.engine.stream import ColumnNearest, LogSumExp, stream_reduce
from tests import reference as ref
from tests.conftest import unit_rows

runner = CliRunner()

SIX = ["nnn:alpha=0.75,k=4", "nnn:alpha=0.5,k=16", "csls:k=8", "dn:lam=0.5", "is:beta=20.0", "is:beta=50.0"]
N_GALLERY, N_BANK, N_QUERIES, DIM = 300, 700, 60, 16


@pytest.fixture
def products(monkeypatch):
    """Elements computed by the engine's block products, per (rows, columns) array sizes."""
    counts: dict[tuple[int, int], int] = {}
    real = stream.block_product

    def counting(cols, device=None, dtype=None):
        product = real(cols, device, dtype)

        def wrapped(rows, c0, c1, out):
            full = rows if rows.base is None else rows.base
            key = (full.shape[0], cols.shape[0])
            counts[key] = counts.get(key, 0) + rows.shape[0] * (c1 - c0)
            product(rows, c0, c1, out)

        return wrapped

    monkeypatch.setattr(stream, "block_product", counting)
    return counts


def bank_elements(counts) -> int:
    """Similarities computed between the gallery and the query bank, either way round."""
    return counts.get((N_GALLERY, N_BANK), 0) + counts.get((N_BANK, N_GALLERY), 0)


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    gallery, bank = unit_rows(rng, N_GALLERY, DIM), unit_rows(rng, N_BANK, DIM)
    truth = rng.integers(0, N_GALLERY, N_QUERIES)
    queries = gallery[truth] + 0.5 * unit_rows(rng, N_QUERIES, DIM)
    return gallery, bank, (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32), truth


def test_evaluate_of_six_methods_computes_each_bank_product_once(arrays, products):
    gallery, bank, queries, truth = arrays
    ev = hubless.evaluate(gallery, queries, truth, bank, SIX, bootstrap=0, coverage=True)
    assert bank_elements(products) == N_GALLERY * N_BANK  # six methods and the coverage: one product
    assert [r.spec for r in ev.results[1:]] == SIX
    report = bank_report(gallery, bank, queries=queries)  # coverage, N_1 and the shift from the queries
    assert ev.bank == report and ev.to_dict()["query_bank_coverage"]["distinct_items"] == report.distinct_items


def test_shared_fits_equal_separate_fits(arrays):
    gallery, bank, queries, truth = arrays
    ev = hubless.evaluate(gallery, queries, truth, bank, SIX, bootstrap=0)
    for spec, result in zip(SIX, ev.results[1:]):
        alone = hubless.make_correction(spec).fit(gallery, bank)
        np.testing.assert_array_equal(result.correction.bias_, alone.bias_)  # bitwise: the same blocks and reducers
        one = hubless.evaluate(gallery, queries, truth, bank, [spec], bootstrap=0)
        assert one.results[1].metrics == result.metrics


def test_tune_fits_every_grid_point_of_every_method_in_one_pass(arrays, products):
    gallery, bank, queries, truth = arrays
    val, val_truth = queries[:30], truth[:30]
    grids = {"nnn": {"alpha": (0.5, 1.0), "k": (2, 8, 32)}, "is": {"beta": (5.0, 20.0)}, "csls": {"k": (4, 8)}}
    tuned = hubless.tune(gallery, val, val_truth, bank, ["nnn", "is", "csls", "dn"], grids=grids, coverage=True)
    assert bank_elements(products) == N_GALLERY * N_BANK
    assert set(tuned.best) == {"nnn", "is", "csls", "dn"} and tuned.bank == bank_report(gallery, bank)
    base = hubless.evaluate(gallery, val, val_truth, None, ["baseline"], bootstrap=0).results[0].metrics
    assert tuned.baseline == base  # the uncorrected ranking, from the same validation pass
    for method, best in tuned.best.items():  # the chosen, fitted corrections score what the table says
        again = hubless.evaluate(gallery, val, val_truth, bank, [best["spec"]], bootstrap=0).results[1].metrics
        assert tuned.fitted[method].spec == best["spec"] and again["R@1"] == best["R@1"]


def test_evaluate_reuses_corrections_fitted_on_the_same_gallery(arrays, products):
    gallery, bank, queries, truth = arrays
    fitted = hubless.fit_many(SIX[:2], gallery, bank)
    products.clear()
    ev = hubless.evaluate(gallery, queries, truth, bank, fitted, bootstrap=0, refit=False)
    assert bank_elements(products) == 0 and ev.results[1].correction is fitted[0]
    again = hubless.evaluate(gallery, queries, truth, bank, SIX[:2], bootstrap=0)
    assert [r.metrics for r in ev.results] == [r.metrics for r in again.results]


def test_audit_fits_every_method_in_one_pass(arrays, products):
    gallery, bank, queries, truth = arrays
    attributes = {"gender": np.where(np.arange(N_GALLERY) % 2, "man", "woman")}
    hubless.fairness.audit(gallery, queries, truth, attributes, bank, SIX)
    assert bank_elements(products) == N_GALLERY * N_BANK


@pytest.fixture
def files(arrays, tmp_path):
    gallery, bank, queries, truth = arrays
    for name, value in {
        "g": gallery,
        "b": bank,
        "q": queries,
        "t": truth,
        "vq": queries[:30],
        "vt": truth[:30],
        "tq": queries[30:],
        "tt": truth[30:],
    }.items():
        np.save(tmp_path / f"{name}.npy", value)
    return tmp_path


def test_cli_eval_reads_the_bank_once(files, products):
    args = ["eval", "--gallery", str(files / "g.npy"), "--queries", str(files / "q.npy"), "--truth", str(files / "t.npy"),
            "--query-bank", str(files / "b.npy"), "--bootstrap", "0", "--out", str(files / "r.json")]  # fmt: skip
    for spec in SIX:
        args += ["-m", spec]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert bank_elements(products) == N_GALLERY * N_BANK  # the coverage figure included
    saved = json.loads((files / "r.json").read_text())["query_bank_coverage"]
    assert saved == bank_report(np.load(files / "g.npy"), np.load(files / "b.npy"), queries=np.load(files / "q.npy")).to_dict()


def test_cli_tune_and_test_read_the_bank_once(files, products):
    result = runner.invoke(app, ["tune", "--gallery", str(files / "g.npy"), "--validation-queries", str(files / "vq.npy"),
                                 "--validation-truth", str(files / "vt.npy"), "--query-bank", str(files / "b.npy"), "-m", "nnn",
                                 "-m", "is", "--queries", str(files / "tq.npy"), "--truth", str(files / "tt.npy"), "--bootstrap", "0"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert bank_elements(products) == N_GALLERY * N_BANK  # tuning, coverage and the test evaluation


def test_cli_index_build_reads_the_bank_once(files, products):
    result = runner.invoke(app, ["index", "build", "--gallery", str(files / "g.npy"), "--query-bank", str(files / "b.npy"),
                                 "--method", "is:beta=20", "--factory", "Flat", "--out", str(files / "idx")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert bank_elements(products) == N_GALLERY * N_BANK
    index = hubless.Index.load(files / "idx")
    np.testing.assert_array_equal(
        index.correction.bias_, hubless.InvertedSoftmax(20.0).fit(np.load(files / "g.npy"), np.load(files / "b.npy")).bias_
    )


# ---------------------------------------------------------------------- the column reducer
@pytest.mark.parametrize("seed", range(4))
def test_column_nearest_is_the_first_maximum_of_each_column(seed, monkeypatch):
    """Small integer vectors tie often: the nearest row must be the lowest of the tied ones,
    whatever the blocks, the groups and the number of threads."""
    rng = np.random.default_rng(seed)
    monkeypatch.setenv("HUBLESS_NUM_THREADS", str(1 + seed % 3))
    for _ in range(10):
        n, m = int(rng.integers(1, 400)), int(rng.integers(1, 150))
        rows, cols = rng.integers(-2, 3, (n, 3)).astype(np.float32), rng.integers(-2, 3, (m, 3)).astype(np.float32)
        nearest = ColumnNearest(m)
        stream_reduce(rows, cols, [nearest], row_block=int(rng.integers(1, 100)), col_block=int(rng.integers(1, 60)))
        s = rows @ cols.T
        np.testing.assert_array_equal(nearest.ids, s.argmax(axis=0))
        np.testing.assert_array_equal(nearest.values, s.max(axis=0))


def test_coverage_from_the_pass_matches_its_definition():
    rng = np.random.default_rng(1)
    gallery, bank = unit_rows(rng, 1100, 8), unit_rows(rng, 900, 8)  # several row blocks of 512
    report = bank_report(gallery, bank)
    nearest = np.argmax(ref.cos(bank, gallery), axis=1)
    assert report.distinct_items == len(set(nearest)) and report.n1_max == np.bincount(nearest).max()


# ---------------------------------------------------------------------- the log-sum-exp
def _lse(rows, cols, beta, monkeypatch, exp_from):
    monkeypatch.setattr(stream, "EXP_MIN_BETA", exp_from)
    lse = LogSumExp(rows.shape[0], [beta])
    stream_reduce(rows, cols, [lse], fixed_blocks=True)
    return lse.values[:, 0]


def test_the_exp_function_is_chosen_from_numpys_dispatch_table():
    """exp2 only where numpy runs it with SIMD code on this CPU (a fixed answer per machine)."""
    np_info = pytest.importorskip("numpy.lib.introspect").opt_func_info(func_name="^exp2$", signature="float32")["exp2"]
    simd = not any(t["current"].startswith("baseline") for t in np_info.values())
    assert stream.exp2_is_vectorised() is simd


@pytest.mark.parametrize("base2", [True, False], ids=["exp2", "exp"])
@pytest.mark.parametrize("beta", [2.0, 5.0, 20.0, 100.0, 1e4])
def test_exp_form_keeps_the_documented_accuracy(beta, base2, monkeypatch):
    """From EXP_MIN_BETA on, the exp form's log-mean-exp bias is within 1e-7 / beta (plus the
    float32 rounding of the similarities themselves) of float64 on the same float32 similarities,
    and at beta = 20 closer to it than the expm1 form, which cancels at large beta (c + D with D
    near -c); whichever of exp2 and exp the CPU makes faster."""
    monkeypatch.setattr(stream, "exp2_is_vectorised", lambda: base2)
    rng = np.random.default_rng(2)
    rows, cols = unit_rows(rng, 40, 32), unit_rows(rng, 30_000, 32)
    s = (rows @ cols.T).astype(np.float64) * beta  # the float32 similarities the engine sees, scaled in float64
    peak = s.max(axis=1)
    want = peak + np.log(np.exp(s - peak[:, None]).sum(axis=1))
    got_exp = _lse(rows, cols, beta, monkeypatch, exp_from=stream.EXP_MIN_BETA)
    got_expm1 = _lse(rows, cols, beta, monkeypatch, exp_from=np.inf)
    assert np.abs(got_exp - want).max() / beta < 1e-7 + 1e-7 * np.abs(want / beta).max()
    if beta == 20.0:  # where the expm1 form cancels most (c + D with D near -c)
        assert np.abs(got_exp - want).max() <= np.abs(got_expm1 - want).max()


def test_expm1_form_is_needed_for_tiny_betas(monkeypatch):
    """Why the threshold: at beta = 1e-6 the exp form loses the bias (every exp rounds to 1),
    the expm1 form keeps it."""
    rng = np.random.default_rng(3)
    rows, cols = unit_rows(rng, 20, 16), unit_rows(rng, 5000, 16)
    beta = 1e-6
    s = (rows @ cols.T).astype(np.float64)
    want = np.log(np.exp(beta * s).mean(axis=1)) / beta  # ~ mean similarity
    bias = {name: (_lse(rows, cols, beta, monkeypatch, exp_from=f) - np.log(5000)) / beta for name, f in (("exp", 0.0), ("expm1", np.inf))}
    assert np.abs(bias["expm1"] - want).max() < 1e-6
    assert np.abs(bias["exp"] - want).max() > 1e-2
    assert beta < stream.EXP_MIN_BETA  # the engine's choice at this beta is the expm1 form
    np.testing.assert_allclose(bias["expm1"], hubless.InvertedSoftmax(beta=beta).fit(rows, cols).bias_, atol=2e-6)


@pytest.mark.parametrize("base2", [True, False], ids=["exp2", "exp"])
def test_exponents_below_float32_range_are_clamped_exactly(base2, monkeypatch):
    """Raw vectors with a large beta: most exponents far below -87 (exp's slow path); the clamp
    keeps the value (those terms are far below the largest)."""
    monkeypatch.setattr(stream, "exp2_is_vectorised", lambda: base2)
    rows = np.array([[1.0, 0.0]], np.float32)
    cols = np.concatenate([np.array([[1.0, 0.0]]), -np.linspace(0.1, 1.0, 999)[:, None] * np.array([[1.0, 0.0]])]).astype(np.float32)
    lse = LogSumExp(1, [500.0, 30.0])
    stream_reduce(rows, cols, [lse])
    s = (rows @ cols.T).astype(np.float64)[0]
    for t, beta in enumerate((500.0, 30.0)):
        want = beta * s.max() + np.log(np.exp(beta * (s - s.max())).sum())
        assert lse.values[0, t] == pytest.approx(want, abs=1e-9)
