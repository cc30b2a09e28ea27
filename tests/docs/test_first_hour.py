"""A newcomer's first hour: the example files every doc example starts from, and the rough edges
a new user met (a failed build's leftovers, a late missing-package error, FAISS's own stderr lines,
an unreachable Qdrant server, ``<bool>`` in help texts, encoding queries without a model)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

import hubless
from hubless.cli.main import app
from hubless.data.synthetic import EXAMPLE_FILES, make_retrieval_data
from hubless.demo import run_demo
from hubless.errors import AlreadyExists, InvalidInput, MissingDependency

runner = CliRunner()
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    out = tmp_path_factory.mktemp("example")
    result = runner.invoke(app, ["data", "synthetic", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_data_synthetic_writes_every_documented_file_with_the_demos_arrays(example):
    assert sorted(p.name for p in example.iterdir()) == sorted(EXAMPLE_FILES)
    demo = make_retrieval_data()  # the demo's data: same defaults, same seed
    for name, array in {"images.npy": demo.gallery, "captions.npy": demo.queries, "bank_captions.npy": demo.query_bank,
                        "bank_images.npy": demo.gallery_bank, "val_images.npy": demo.val_gallery,
                        "val_captions.npy": demo.val_queries, "val_truth.npy": demo.val_query_item,
                        "truth.npy": demo.query_item}.items():  # fmt: skip
        np.testing.assert_array_equal(np.load(example / name), array, err_msg=name)
    new, distractors, more = (np.load(example / n) for n in ("new_images.npy", "distractors.npy", "more_captions.npy"))
    assert new.shape == (100, 64) and distractors.shape == (500, 64) and more.shape == (1000, 64)
    everything = np.concatenate([demo.gallery, demo.gallery_bank, demo.val_gallery, new, distractors])
    assert len(np.unique(everything, axis=0)) == len(everything)  # new items are new, distractors never relevant
    assert np.allclose(np.linalg.norm(more, axis=1), 1, atol=1e-5)
    meta = json.loads((example / "images.meta.json").read_text())
    assert len(meta["items"]) == 1000 and meta["items"][7]["index"] == 7
    assert len(json.loads((example / "new.meta.json").read_text())["items"]) == 100


def test_extra_items_leave_the_other_arrays_unchanged():
    a, b = make_retrieval_data(n_items=50, dim=8, seed=4), make_retrieval_data(n_items=50, dim=8, seed=4, n_extra_items=7)
    for name in ("gallery", "queries", "query_bank", "gallery_bank", "val_gallery", "val_queries"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert a.extra_gallery is None and b.extra_gallery.shape == (7, 8) and b.extra_queries.shape == (35, 8)


def test_eval_on_the_example_files_reproduces_the_demo(example, tmp_path):
    out = tmp_path / "results.json"
    args = ["eval", "--gallery", "images.npy", "--queries", "captions.npy", "--truth", "t2i:5", "--query-bank",
            "bank_captions.npy", "--method", "nnn", "--bootstrap", "0", "--out", str(out), "--no-progress"]  # fmt: skip
    cwd = os.getcwd()
    os.chdir(example)
    try:
        result = runner.invoke(app, args)
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    got = {r["method"]: r["metrics"]["R@1"] for r in json.loads(out.read_text())["results"]}
    demo = run_demo(methods=("nnn",), bootstrap=0, progress=False)
    assert got == {r.method: r.metrics["R@1"] for r in demo.results}
    assert got["nnn"] > got["baseline"] + 3  # the correction the docs show, on these files


def test_data_synthetic_refuses_foreign_files_and_replaces_its_own(example, tmp_path):
    before = (example / "images.npy").stat().st_mtime_ns
    result = runner.invoke(app, ["data", "synthetic", "--out", str(example)])  # its own files: a rerun replaces them
    assert result.exit_code == 0, result.output
    assert (example / "images.npy").stat().st_mtime_ns >= before
    (tmp_path / "captions.npy").write_bytes(b"mine")
    result = runner.invoke(app, ["data", "synthetic", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "captions.npy exists" in result.output and "--overwrite" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["captions.npy"]  # nothing written
    with pytest.raises(AlreadyExists):
        hubless.data.synthetic.write_example_files(tmp_path)
    assert runner.invoke(app, ["data", "synthetic", "--out", str(tmp_path), "--overwrite", "--n-items", "20"]).exit_code == 0
    assert np.load(tmp_path / "images.npy").shape == (20, 64)


def test_demo_data_writes_the_files_it_evaluates(tmp_path):
    result = runner.invoke(app, ["demo", "--n-items", "100", "--report", "", "--data", str(tmp_path / "d"), "--no-progress"])
    assert result.exit_code == 0, result.output
    np.testing.assert_array_equal(np.load(tmp_path / "d" / "images.npy"), make_retrieval_data(n_items=100).gallery)
    assert "wrote the demo's data" in result.output


def test_encoding_queries_without_a_model_names_the_fix(example):
    index = hubless.Index.build(np.load(example / "images.npy"), np.load(example / "bank_captions.npy"), "nnn", "Flat")
    assert index.model is None
    with pytest.raises(InvalidInput, match="no model to encode the queries with"):
        hubless.encoders.encode_queries(index.model, texts=["a dog on a beach"])


def test_a_missing_pyarrow_is_reported_before_the_build_and_leaves_nothing(example, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # as on an install without the index extra
    monkeypatch.setattr(hubless.Index, "build", lambda *a, **k: pytest.fail("built before checking pyarrow"))
    out = tmp_path / "idx"
    args = ["index", "build", "--gallery", str(example / "images.npy"), "--query-bank", str(example / "bank_captions.npy"),
            "--metadata", str(example / "images.meta.json"), "--out", str(out), "--no-progress"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "needs pyarrow: pip install 'hubless[index]'" in result.output and not out.exists()


def test_a_failed_first_save_leaves_no_directory_and_an_empty_one_is_used(example, tmp_path, monkeypatch):
    g, b = np.load(example / "images.npy"), np.load(example / "bank_captions.npy")
    index = hubless.Index.build(g, b, "nnn", "Flat", metadata=[{"caption": str(i)} for i in range(len(g))])
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(MissingDependency):
        index.save(tmp_path / "idx")
    assert not (tmp_path / "idx").exists()  # the rerun is not blocked by an empty directory
    monkeypatch.delitem(sys.modules, "pyarrow")
    (tmp_path / "made").mkdir()  # an empty directory made beforehand is fine for the CLI too
    args = ["index", "build", "--gallery", str(example / "images.npy"), "--query-bank", str(example / "bank_captions.npy"),
            "--out", str(tmp_path / "made"), "--no-progress"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert hubless.Index.load(tmp_path / "made").ntotal == 1000


def test_few_ivf_training_items_is_one_hubless_warning_not_faiss_stderr(example, tmp_path):
    """FAISS prints 'WARNING clustering ...' from C++ straight to stderr; the user sees hubless's line."""
    cmd = [sys.executable, "-m", "hubless", "index", "build", "--gallery", str(example / "images.npy"), "--query-bank",
           str(example / "bank_captions.npy"), "--factory", "IVF64,Flat", "--out", str(tmp_path / "idx"), "--no-progress"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "WARNING clustering" not in result.stderr
    assert "warning: IVF64,Flat: 1000 training items for 64 lists" in result.stderr
    assert result.stderr.count("warning:") == 1


def _help_texts():
    """(command path, help text) of every command and group of the CLI."""
    root = typer.main.get_command(app)
    todo = [((), root)]
    while todo:
        path, cmd = todo.pop()
        yield " ".join(path), runner.invoke(app, [*path, "--help"], terminal_width=200).output
        if hasattr(cmd, "commands"):  # a group (typer vendors its own click)
            todo.extend(((*path, name), sub) for name, sub in cmd.commands.items())


def test_flags_show_no_bool_type_in_help():
    texts = dict(_help_texts())
    assert len(texts) >= 20
    for path, text in texts.items():
        assert "--help" in text, path
        assert "<bool>" not in text, f"hubless {path} --help shows <bool>"
    assert "<path>" in texts["index build"]  # options that take a value keep their type


def test_an_unreachable_qdrant_server_is_a_clean_error(example, tmp_path):
    pytest.importorskip("qdrant_client")
    idx = tmp_path / "idx"
    hubless.Index.build(np.load(example / "images.npy")[:100], np.load(example / "bank_captions.npy"), "nnn", "Flat").save(idx)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for args in (["export", str(idx), "--to", f"qdrant+http://127.0.0.1:{port}/gallery"],
                 ["search", f"qdrant+http://127.0.0.1:{port}/gallery", "--queries", str(example / "captions.npy")]):  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        assert f"cannot reach the Qdrant server at http://127.0.0.1:{port}" in result.output
        assert "bug" not in result.output


@pytest.mark.slow
def test_the_readme_tests_pass_without_the_shared_data(tmp_path):
    """A fresh clone has no ../shared/data: the README's tests pass there, and the docs' examples
    that need the benchmark data skip, saying why."""
    root = SRC.parent
    env = {**os.environ, "HUBLESS_DATA_DIR": str(tmp_path / "nothing-here"), "PYTHONPATH": str(SRC)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/docs/test_readme.py", "tests/docs/test_docs.py", "-k",
           "readme or benchmark-data and runs_as_written"]  # fmt: skip
    result = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "skipped, and why" in result.stdout
    assert "needs ../shared/data/coco_karpathy (or `hubless data fetch coco`)" in result.stdout
