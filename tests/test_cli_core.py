"""The command line: --version, --help and the demo."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

import hubless
from hubless.cli.main import app

runner = CliRunner()


def test_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"hubless {hubless.__version__}"


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "demo" in result.output


def test_console_script_is_installed():
    out = subprocess.run([sys.executable, "-m", "hubless.cli.main", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "hubless" in out.stdout


def test_demo_library_shows_every_correction_improving_on_the_baseline():
    from hubless.demo import run_demo

    rows = run_demo()
    assert [r.method for r in rows] == list(hubless.METHODS)
    base = rows[0]
    nnn = next(r for r in rows if r.method == "nnn")
    assert nnn.r_at_1 > base.r_at_1 + 3 and nnn.largest_hub < base.largest_hub
