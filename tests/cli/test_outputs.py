"""Outputs never destroy anything: not an input, not another output, not a folder, FIFO or
device, not a file hubless did not write (without --overwrite), not a directory that is not an
index; a re-run replaces hubless's own earlier results."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from hubless.cli.main import app
from tests.conftest import unit_rows

runner = CliRunner()


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(2)
    np.save(tmp_path / "g.npy", unit_rows(rng, 50, 8))
    np.save(tmp_path / "q.npy", unit_rows(rng, 50, 8))
    np.save(tmp_path / "b.npy", unit_rows(rng, 80, 8))
    return tmp_path


def run_eval(files, *extra):
    args = ["eval", "--gallery", str(files / "g.npy"), "--queries", str(files / "q.npy"), "--truth", str(files / "truth.json"),
            "--query-bank", str(files / "b.npy"), "-m", "nnn", "--bootstrap", "0", *extra]  # fmt: skip
    (files / "truth.json").write_text(json.dumps([[i] for i in range(50)]))
    return runner.invoke(app, args)


def test_an_output_that_is_an_input_is_refused(files):
    before = (files / "g.npy").read_bytes()
    result = run_eval(files, "--out", str(files / "g.npy"))
    assert result.exit_code == 2 and "also the input --gallery" in result.output
    assert (files / "g.npy").read_bytes() == before


def test_colliding_outputs_are_refused(files):
    result = run_eval(files, "--out", str(files / "r.html"), "--report", str(files / "r.html"))
    assert result.exit_code == 2 and "same file" in result.output and not (files / "r.html").exists()


def test_non_regular_outputs_are_refused(files):
    os.mkfifo(files / "pipe")
    result = run_eval(files, "--out", str(files / "pipe"))
    assert result.exit_code == 2 and "not a regular file" in result.output
    assert (files / "pipe").exists() and not (files / "pipe").is_file()
    (files / "folder").mkdir()
    assert run_eval(files, "--out", str(files / "folder")).exit_code == 2


def test_foreign_files_need_overwrite_and_our_own_are_replaced(files):
    (files / "notes.json").write_text('{"my": "notes"}')
    result = run_eval(files, "--out", str(files / "notes.json"))
    assert result.exit_code == 2 and "--overwrite" in result.output
    assert json.loads((files / "notes.json").read_text()) == {"my": "notes"}
    assert run_eval(files, "--out", str(files / "notes.json"), "--overwrite").exit_code == 0
    assert json.loads((files / "notes.json").read_text())["generator"].startswith("hubless")
    again = run_eval(files, "--out", str(files / "notes.json"))  # now ours: a re-run replaces it
    assert again.exit_code == 0, again.output


def test_report_reruns_replace_their_own_html(files):
    pytest.importorskip("matplotlib")
    assert run_eval(files, "--report", str(files / "r.html")).exit_code == 0
    assert "name='generator' content='hubless'" in (files / "r.html").read_text()
    assert run_eval(files, "--report", str(files / "r.html")).exit_code == 0
    (files / "mine.html").write_text("<html>my page</html>")
    assert run_eval(files, "--report", str(files / "mine.html")).exit_code == 2


def test_index_build_overwrite_never_deletes_a_foreign_directory(files):
    (files / "photos").mkdir()
    (files / "photos" / "a.jpg").write_bytes(b"family photo")
    result = runner.invoke(app, ["index", "build", "--gallery", str(files / "g.npy"), "--query-bank", str(files / "b.npy"),
                                 "--out", str(files / "photos"), "--overwrite"])  # fmt: skip
    assert result.exit_code == 2 and "not a hubless index" in result.output
    assert (files / "photos" / "a.jpg").read_bytes() == b"family photo"


def test_correct_reruns_replace_their_own_matrix_and_top_k(files):
    """`hubless correct --out C.npy` (and .npz) run twice: the second run replaces what the first
    wrote (its array files carry hubless's mark, read by numpy as before); a .npy or .npz of the
    user's is still refused without --overwrite."""
    from hubless._atomic import array_written_by_hubless
    from hubless.score_matrices import correct_scores

    g, q, b = (np.load(files / f"{n}.npy") for n in "gqb")
    np.save(files / "s.npy", q @ g.T)
    np.save(files / "sb.npy", b @ g.T)
    base = ["correct", "--scores", str(files / "s.npy"), "--query-bank-scores", str(files / "sb.npy"), "-m", "nnn"]
    expected = correct_scores(np.load(files / "s.npy"), np.load(files / "sb.npy"), "nnn")
    for out, extra in (("C.npy", []), ("top.npz", ["--top-k", "3"])):
        for _ in range(2):
            result = runner.invoke(app, [*base, "--out", str(files / out), *extra])
            assert result.exit_code == 0, result.output
        assert array_written_by_hubless(files / out)
    written = np.load(files / "C.npy")
    assert written.dtype == np.float32 and np.array_equal(written, expected)
    assert np.array_equal(np.load(files / "C.npy", mmap_mode="r"), expected)
    assert np.load(files / "top.npz").files == ["scores", "ids"]
    for mine, extra in (("mine.npy", []), ("mine.npz", ["--top-k", "3"])):
        np.save(files / "mine.npy", expected) if mine.endswith(".npy") else np.savez(files / mine, scores=expected)
        before = (files / mine).read_bytes()
        result = runner.invoke(app, [*base, "--out", str(files / mine), *extra])
        assert result.exit_code == 2 and "not written by hubless" in result.output and "--overwrite" in result.output
        assert (files / mine).read_bytes() == before
        assert not array_written_by_hubless(files / mine)
        assert runner.invoke(app, [*base, "--out", str(files / mine), *extra, "--overwrite"]).exit_code == 0
