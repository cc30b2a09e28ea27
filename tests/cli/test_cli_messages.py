"""What a new user meets: messages keep their advice, missing extras and models fail before the
work in one line, warnings come once per input, every embeddings input form is accepted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.data.synthetic import make_retrieval_data

runner = CliRunner()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    data = make_retrieval_data(n_items=200, dim=16, n_query_bank=400, n_gallery_bank=200, n_val_items=5, seed=2)
    for name in ("gallery", "queries", "query_bank", "gallery_bank"):
        np.save(d / f"{name}.npy", getattr(data, name))
    return d


def _eval_args(d, *extra):
    return ["eval", "--gallery", str(d / "gallery.npy"), "--queries", str(d / "queries.npy"), "--truth", "t2i:5",
            "--query-bank", str(d / "query_bank.npy"), "--bootstrap", "0", "--no-progress", *extra]  # fmt: skip


def test_missing_extra_is_one_line_with_the_exact_pip_command_before_any_work(files, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on a base install
    import hubless.evaluation

    monkeypatch.setattr(hubless.evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated before checking extras"))
    result = runner.invoke(app, _eval_args(files, "--report", str(tmp_path / "r.html")))
    assert result.exit_code == 2
    assert result.output.strip() == "error: --report needs matplotlib: pip install 'hubless[report]'"


def test_demo_on_a_base_install_prints_its_table_and_skips_the_report(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = runner.invoke(app, ["demo", "--n-items", "100", "--report", str(tmp_path / "demo.html"), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "pip install 'hubless[report]'" in result.output and "Traceback" not in result.output
    assert "baseline" in result.output and not (tmp_path / "demo.html").exists()


def test_markup_like_text_in_messages_is_printed_as_it_is(tmp_path):
    bad = tmp_path / "[bold]x[report].npy"
    result = runner.invoke(app, ["eval", "--gallery", str(bad), "--queries", str(bad), "--truth", "t2i:5"])
    assert result.exit_code == 2 and "[bold]x[report].npy" in result.output


def test_unavailable_model_fails_in_one_line_before_the_evaluation(files, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import hubless.evaluation

    monkeypatch.setattr(hubless.evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated before loading the model"))
    items = files / "items.txt"
    items.write_text("\n".join(f"item {i}" for i in range(1000)))
    result = runner.invoke(
        app, _eval_args(files, "--rerank", "someone/not-a-cached-model", "--gallery-items", str(items), "--query-items", str(items))
    )
    assert result.exit_code == 2
    assert "not a local folder and not in the Hugging Face cache" in result.output and "HF_HUB_OFFLINE" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_no_normalize_warns_once_per_input_in_one_clean_line(files, tmp_path):
    scaled = tmp_path / "scaled.npy"
    np.save(scaled, 3 * np.load(files / "gallery.npy"))
    cmd = [sys.executable, "-m", "hubless", *_eval_args(files, "--no-normalize")]
    cmd[cmd.index(str(files / "gallery.npy"))] = str(scaled)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: gallery") and "not L2-normalised" in warnings[0]


def test_eval_accepts_clip_retrieval_folders_like_every_other_command(files, tmp_path):
    folder = tmp_path / "cr"
    (folder / "img_emb").mkdir(parents=True)
    (folder / "text_emb").mkdir()
    gallery, queries = np.load(files / "gallery.npy"), np.load(files / "queries.npy")
    np.save(folder / "img_emb" / "img_emb_0.npy", gallery[:120])
    np.save(folder / "img_emb" / "img_emb_1.npy", gallery[120:])
    np.save(folder / "text_emb" / "text_emb_0.npy", queries)
    out = tmp_path / "r.json"
    args = _eval_args(files, "--out", str(out))
    args[args.index(str(files / "gallery.npy"))] = str(folder)
    args[args.index(str(files / "queries.npy"))] = f"{folder}:text"
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())["inputs"]["files"]
    assert saved["gallery"]["shape"] == [200, 16] and len(saved["gallery"]["sha256"]) == 64
    direct = hubless.evaluate(gallery, queries, "t2i:5", np.load(files / "query_bank.npy"), ["baseline", "nnn"], bootstrap=0)
    assert json.loads(out.read_text())["results"][1]["metrics"] == pytest.approx(direct["nnn"].metrics)


def test_fairness_audit_takes_truth_in_every_form_evaluate_takes():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((30, 8)).astype(np.float32)
    q = rng.standard_normal((3, 8)).astype(np.float32)
    lists = [[0, 1, 2], [3, 4], [5, 6, 7, 8]]
    genders = ["masculine", "feminine"] * 15
    a = hubless.fairness.audit(g, q, lists, {"gender": genders}, methods=["baseline"])
    b = hubless.fairness.audit(g, q, hubless.metrics.Truth.from_lists(lists, 30), {"gender": genders}, methods=["baseline"])
    assert a.results[0].metrics == b.results[0].metrics


def test_small_ones(files, tmp_path):
    # spec round trip: real-valued parameters always print as floats
    assert hubless.make_correction("is:beta=20").spec == "is:beta=20.0" == hubless.InvertedSoftmax(beta=20).spec
    assert hubless.make_correction(hubless.make_correction("dis:beta=20").spec).spec == "dis:beta=20.0,k_activation=1"
    # `hubless data --help` names every data command
    assert "visogender" in runner.invoke(app, ["data", "--help"]).output
    # a wrong .npz key: the message names the keys, with no stray quotes around it
    np.savez(tmp_path / "x.npz", a=np.ones((2, 3), np.float32))
    result = runner.invoke(
        app, ["eval", "--gallery", f"{tmp_path / 'x.npz'}:b", "--queries", str(files / "queries.npy"), "--truth", "t2i:5"]
    )
    assert (
        result.exit_code == 2
        and result.output.startswith("error: ")
        and "'b'" in result.output
        and not result.output.startswith('error: "')
    )
    # counts are integers in tables
    ev = hubless.evaluate(np.load(files / "gallery.npy"), np.load(files / "queries.npy"), "t2i:5", None, ["baseline"], bootstrap=0)
    largest = ev.results[0].hubness["N1_max"]
    assert isinstance(largest, int)
    from hubless.reports.evaluation import _hubness_tables

    assert f"<td>{largest}</td>" in _hubness_tables(ev)[0] and f"<td>{largest}.00</td>" not in _hubness_tables(ev)[0]


def test_methods_command_lists_every_method():
    result = runner.invoke(app, ["methods"])
    assert result.exit_code == 0
    for name in hubless.METHODS:
        assert name in result.output


def test_help_is_fast_to_import():
    """`hubless --help` does not import numpy, faiss or the library (start-up; see benchmarks/startup.py)."""
    code = "import sys; import hubless.cli.main; print(sorted(m for m in ('numpy', 'faiss', 'scipy', 'torch', 'hubless.corrections') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_methods_never_wraps_a_spec(tmp_path):
    """Every spec is printed whole on one line (it is copied into --method): in the table on a
    wide console, and one entry per method where the table would have to break the widest spec."""
    import io

    from rich.console import Console

    from hubless.cli.methods import render_methods

    specs = [cls().spec for cls in hubless.METHODS.values()]
    assert max(map(len, specs)) > 60  # dualdis's: the one a narrow table would break
    for width in (72, 80, 100, 140, 160, 200):
        out = io.StringIO()
        render_methods(Console(file=out, width=width, markup=False, color_system=None))
        lines = out.getvalue().splitlines()
        for spec in specs:
            assert any(spec in line for line in lines), (width, spec, out.getvalue())
        assert all(len(line.rstrip()) <= width for line in lines), width
    result = runner.invoke(app, ["methods"])
    assert result.exit_code == 0 and all(spec in result.output for spec in specs)


def test_a_closed_pipe_ends_a_command_quietly(tmp_path):
    """`hubless search ... --json | head -1`: the reader closes the pipe after one line; hubless
    stops without a message (no "error: [Errno 32] Broken pipe", no traceback), with the status of
    a Unix tool killed by SIGPIPE (141)."""
    data = make_retrieval_data(n_items=100, dim=8, n_query_bank=200, n_val_items=2, seed=3)
    hubless.Index.build(data.gallery, data.query_bank, "nnn:alpha=0.75,k=16", "Flat").save(tmp_path / "idx")
    queries = np.repeat(data.queries, 30, axis=0)[:3000]  # ~1 MB of JSON Lines: far more than a pipe holds
    np.save(tmp_path / "q.npy", queries)
    env = {**os.environ, "PYTHONPATH": str(Path(hubless.__file__).parents[1])}
    cmd = [
        sys.executable,
        "-m",
        "hubless",
        "search",
        str(tmp_path / "idx"),
        "--queries",
        str(tmp_path / "q.npy"),
        "--top-k",
        "10",
        "--json",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, stderr
    assert json.loads(first)["query"] == 0 and len(json.loads(first)["hits"]) == 10
    assert stderr == "", stderr
