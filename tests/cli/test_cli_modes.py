"""``hubless eval`` and ``hubless tune``: one options object per mode (embeddings, score
matrices, an attached collection, several named banks), the exclusions declared once by the
objects' fields. Every option belongs to a mode; an option of another mode is refused in one line
naming where it belongs, before any file is read; a missing one is asked for. (What each mode
computes is tested end to end in test_cli_eval.py, tests/evaluation/test_scores.py,
tests/attached/test_attach_eval.py and tests/corrections/test_banks.py.)"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap

import pytest
import typer
from typer.testing import CliRunner

from hubless.cli.eval import EVAL_MODES, eval_command
from hubless.cli.main import app
from hubless.cli.tune import TUNE_MODES, tune_command

runner = CliRunner()
COMMANDS = {"eval": (eval_command, EVAL_MODES), "tune": (tune_command, TUNE_MODES)}


def _params(name: str) -> dict[str, list[str]]:
    command = typer.main.get_command(app).commands[name]
    return {p.name: p.opts for p in command.params if p.name != "help"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_belongs_to_a_mode_and_the_modes_share_the_general_ones(name):
    _, modes = COMMANDS[name]
    fields = [{f.name for f in dataclasses.fields(m)} for m in modes]
    assert set().union(*fields) == set(_params(name))
    for shared in ("ks", "out", "progress", "overwrite"):
        assert all(shared in f for f in fields), shared


#: (command line, what the message says): the mode the values select, an option of another.
REFUSED = [
    (["eval", "--attached", "side", "--queries", "q.npy", "--truth", "t2i:5"], "--truth does not apply to an attached collection"),
    (["eval", "--attached", "side", "--queries", "q.npy", "-m", "nnn", "--bootstrap", "5"], "--method and --bootstrap do not apply"),
    (
        ["eval", "--gallery", "g.npy", "--queries", "q.npy", "--truth", "t2i:5", "--nprobe", "4"],
        "--nprobe does not apply to embeddings; it belongs to an attached collection (--attached)",
    ),
    (
        ["eval", "--scores", "s.npy", "--truth", "t2i:5", "--gallery-bank", "b.npy"],
        "--gallery-bank does not apply to score matrices; it belongs to several named query banks (--query-bank NAME=PATH) or embeddings",
    ),
    (["eval", "--gallery", "g.npy", "--queries", "q.npy", "--truth", "t2i:5", "--transpose"], "--transpose does not apply to embeddings"),
    (
        [
            "eval",
            "--gallery",
            "g.npy",
            "--queries",
            "q.npy",
            "--truth",
            "t2i:5",
            "--query-bank",
            "a=a.npy",
            "--query-bank",
            "b=b.npy",
            "--report",
            "r.html",
        ],
        "--report does not apply to several named query banks",
    ),
    (
        ["tune", "--validation-scores", "v.npy", "--validation-truth", "t.npy", "--gallery", "g.npy"],
        "--gallery does not apply to score matrices; it belongs to several named query banks (--query-bank NAME=PATH) or embeddings",
    ),
    (
        ["tune", "--gallery", "g.npy", "--validation-queries", "v.npy", "--validation-truth", "t.npy", "--query-mask", "m.npy"],
        "--query-mask does not apply to embeddings; it belongs to score matrices (--validation-scores)",
    ),
]


@pytest.mark.parametrize(("args", "message"), REFUSED)
def test_an_option_of_another_mode_is_refused_naming_where_it_belongs(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)  # none of the files exists: refused before any is read
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


#: (command line, what the message asks for).
MISSING = [
    (
        ["eval"],
        "give --gallery, --queries and --truth (embeddings), --attached and --queries (an attached collection) or --scores and --truth (score matrices)",
    ),
    (["eval", "--attached", "side"], "an attached collection: give --queries too"),
    (["eval", "--scores", "s.npy"], "score matrices: give --truth too"),
    (["eval", "--gallery", "g.npy", "--truth", "t2i:5"], "embeddings: give --queries too"),
    (
        ["eval", "--gallery", "g.npy", "--truth", "t2i:5", "--query-bank", "a=a.npy", "--query-bank", "b=b.npy"],
        "several named query banks: give --queries too",
    ),
    (
        ["tune", "--validation-truth", "t.npy"],
        "give --gallery and --validation-queries (embeddings) or --validation-scores and --validation-truth (score matrices)",
    ),
    (
        [
            "tune",
            "--gallery",
            "g.npy",
            "--validation-queries",
            "v.npy",
            "--validation-truth",
            "t.npy",
            "--query-bank",
            "a=a.npy",
            "--query-bank",
            "b=b.npy",
        ],
        "several named query banks: give --queries and --truth too",
    ),
]


@pytest.mark.parametrize(("args", "message"), MISSING)
def test_a_missing_option_is_asked_for(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and message in " ".join(result.output.replace("│", " ").split()), result.output


def test_the_general_options_are_taken_in_every_mode(tmp_path, monkeypatch):
    """--no-progress, --ks, --out and --overwrite pass the mode check everywhere (the files are
    missing, so each run stops at the first read: not at the options)."""
    monkeypatch.chdir(tmp_path)
    general = ["--no-progress", "--ks", "1,5", "--overwrite"]
    for args in (
        ["eval", "--attached", "side", "--queries", "q.npy"],
        ["eval", "--scores", "s.npy", "--truth", "t2i:5"],
        ["eval", "--gallery", "g.npy", "--queries", "q.npy", "--truth", "t2i:5"],
        ["tune", "--validation-scores", "v.npy", "--validation-truth", "t.npy"],
    ):
        result = runner.invoke(app, [*args, *general])
        assert result.exit_code == 2 and "does not apply" not in result.output and "error:" in result.output, (args, result.output)


def _lines(function) -> int:
    source = textwrap.dedent(inspect.getsource(function))
    node = ast.parse(source).body[0]
    return node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_and_mode_is_short(name):
    """Issue 53: the commands folded four modes into 183 and 137 lines; each is now under 80, and
    so is each mode's work."""
    command, modes = COMMANDS[name]
    assert _lines(inspect.unwrap(command)) < 80
    for mode in modes:
        assert _lines(mode.run) < 80, mode.__name__
