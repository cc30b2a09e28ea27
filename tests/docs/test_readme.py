"""The README's commands, as written: every `hubless ...` command of its bash blocks parses (its
options exist, its required ones are given), and every one in a block not marked
``<!-- not-run: why -->`` (nor a background server) runs, in order, on the files `hubless data
synthetic` writes (the names the README uses), with the virtual environment's own `hubless`
as a user has it after the quick start. tests/docs/test_docs.py runs the README's blocks whole
(bash, python, the server and curl) like every page of the documentation."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from hubless.cli.main import app
from hubless.data.synthetic import write_example_files
from tests.docs.test_docs import _hubless_commands, code_blocks, venv_bin

README = Path(__file__).resolve().parents[2] / "README.md"
runner = CliRunner()


def readme_commands() -> list[tuple[str, str | None]]:
    """Every `hubless ...` command of the README's bash blocks, with its block's mark (None,
    "not-run" or "background")."""
    return [(c, b["mark"]) for b in code_blocks(README) if b["lang"] == "bash" for c in _hubless_commands(b["code"])]


def parse(args: list[str]) -> None:
    """Parse ``hubless args`` as the CLI would, down to the sub-command, without running it."""
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("hubless", list(args))
    while hasattr(cmd, "commands"):  # a group (typer vendors its own click)
        protected = getattr(ctx, "_protected_args", None) or getattr(ctx, "protected_args", [])
        name, cmd, rest = cmd.resolve_command(ctx, [*protected, *ctx.args])
        ctx = cmd.make_context(name, rest, parent=ctx)


def test_readme_has_commands():
    commands = readme_commands()
    assert len(commands) >= 8
    assert any(c.startswith("hubless demo") for c, _ in commands)  # the first of the two commands


@pytest.mark.parametrize("command", [c for c, _ in readme_commands()])
def test_readme_command_parses(command):
    parse(shlex.split(command)[1:])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The README's input files, as `hubless data synthetic` writes them."""
    root = tmp_path_factory.mktemp("readme")
    write_example_files(root)
    return root


@pytest.mark.slow
def test_readme_commands_run_as_written(workdir):
    """Each command as a user runs it after the quick start: a shell whose PATH starts with the
    virtual environment's bin (what `source .venv/bin/activate` does), the real `hubless`."""
    root = README.parent
    env = {**os.environ, "PATH": f"{venv_bin()}{os.pathsep}{os.environ['PATH']}", "HUBLESS_PROGRESS": "0"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")]))
    ran = []
    for command, mark in readme_commands():
        if mark is not None:  # not-run (says why) or a server (tests/docs/test_docs.py runs it)
            continue
        result = subprocess.run(["bash", "-c", command], cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"README command failed: {command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        assert "Traceback" not in result.stderr
        ran.append(command)
    assert len(ran) >= 6, ran
    assert json.loads((workdir / "tuned.json").read_text())["best"]["nnn"]["spec"].startswith("nnn:")
    assert (workdir / "report.html").stat().st_size > 1000
    assert (workdir / "example" / "images.npy").is_file() and (workdir / "idx" / "CURRENT").is_file()


def test_cli_errors_name_cli_flags(workdir, monkeypatch):
    """A correction that needs a bank says which flag gives it (not a Python signature)."""
    monkeypatch.chdir(workdir)
    args = ["tune", "--gallery", "images.npy", "--query-bank", "bank_captions.npy", "--validation-queries", "val_captions.npy",
            "--validation-truth", "val_truth.npy", "--validation-gallery", "val_images.npy", "--method", "dualis"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "pass --gallery-bank" in result.output and "fit(" not in result.output
    result = runner.invoke(app, ["eval", "--gallery", "images.npy", "--queries", "captions.npy", "--truth", "t2i:5", "-m", "nnn"])
    assert result.exit_code == 2 and "pass --query-bank" in result.output


def _requirements(extras: list[str]) -> set[str]:
    """The distributions pyproject.toml's core dependencies and ``extras`` name."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((README.parent / "pyproject.toml").read_text())["project"]
    names = list(project["dependencies"])
    for extra in extras:
        names += project["optional-dependencies"][extra]
    return {re.split(r"[\[<>=!~ ;]", n, maxsplit=1)[0].lower() for n in names}


def test_the_quick_start_installs_what_the_readme_uses():
    """A user who runs the first command can run the README's next ones: it activates the virtual
    environment (so the bare `hubless` of later blocks is found), and its extras bring what those
    commands import (not torch: the models are not used here); the no-clone pip line installs the
    same; the test command stays the second, as .ci/run runs it."""
    blocks = [b for b in code_blocks(README) if b["lang"] == "bash"]
    first, second = blocks[0]["code"].strip(), blocks[1]["code"].strip()
    steps = [s.strip() for s in first.split("&&")]
    assert steps[0] == "python3 -m venv .venv" and "source .venv/bin/activate" in steps
    activated = steps.index("source .venv/bin/activate")
    install = next(i for i, s in enumerate(steps) if s.startswith("pip install -e "))
    assert activated < install < steps.index("hubless demo"), first
    extras = re.search(r'"\.\[([a-z,-]+)\]"', steps[install]).group(1).split(",")
    later = " ".join(b["code"] for b in blocks[2:])
    needs = {"matplotlib": "--report" in later, "pyarrow": "--metadata" in later, "fastapi": "hubless serve" in later}
    needs["uvicorn"] = needs["fastapi"]
    assert all(needs.values()), needs  # the README still uses all three: keep this test honest
    installed = _requirements(extras)
    assert {name for name, used in needs.items() if used} <= installed, (extras, installed)
    assert "torch" not in installed
    text = README.read_text()
    assert f'pip install "hubless[{",".join(extras)}] @ git+' in text  # the line for those who do not clone
    assert "source .venv/bin/activate" in text.split("## Example data")[0]  # said before the first bare `hubless`
    ci = (README.parent / ".ci" / "run").read_text()
    assert second in ci.splitlines(), "the README's test command is the one .ci/run runs"


def test_ci_runs_the_readme_command_as_a_newcomer_then_the_data_tests_then_other_kernels():
    """.ci/run (issue 51): (a) the README's test command first, with the benchmark data out of
    reach (an empty HUBLESS_DATA_DIR), (b) the needs_shared tests with ../shared/data, required
    to run, (c) tests/engine and tests/evaluation under OpenBLAS's Haswell and Sandybridge
    kernels (and Zen); the script parses as bash."""
    ci_file = README.parent / ".ci" / "run"
    lines = [line.strip() for line in ci_file.read_text().splitlines()]
    command = [b for b in code_blocks(README) if b["lang"] == "bash"][1]["code"].strip()
    runs = [i for i, line in enumerate(lines) if "-m pytest" in line and not line.startswith("#")]
    assert lines[runs[0]] == command  # the README's command is the first test run
    newcomer = next(i for i, line in enumerate(lines) if line.startswith('export HUBLESS_DATA_DIR="$'))
    assert newcomer < runs[0] < lines.index("unset HUBLESS_DATA_DIR") < runs[1]
    assert lines[runs[1]] == "HUBLESS_REQUIRE_SHARED=1 .venv/bin/python -m pytest -m needs_shared"
    loop = next(line for line in lines if line.startswith("for core in "))
    assert {"Haswell", "Sandybridge", "Zen"} <= set(loop.removesuffix("; do").split()[3:])
    assert lines[runs[2]] == "OPENBLAS_CORETYPE=$core .venv/bin/python -m pytest -q tests/engine tests/evaluation"
    checked = subprocess.run(["bash", "-n", str(ci_file)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
