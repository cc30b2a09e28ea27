"""The command line: --version, --help and the demo."""

from __future__ import annotations

import os
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


def test_python_dash_m_runs_the_cli():
    for module in ("hubless", "hubless.cli.main"):
        out = subprocess.run([sys.executable, "-m", module, "--version"], capture_output=True, text=True)
        assert out.returncode == 0 and "hubless" in out.stdout, out.stderr


def test_demo_library_shows_every_correction_improving_on_the_baseline():
    from hubless.demo import run_demo

    ev = run_demo(bootstrap=0)
    assert [r.method for r in ev.results] == list(hubless.METHODS)
    base, nnn = ev["baseline"], ev["nnn"]
    assert nnn.metrics["R@1"] > base.metrics["R@1"] + 3
    assert nnn.hubness["N1_max"] < base.hubness["N1_max"]


def test_demo_command_prints_the_table_and_writes_the_report(tmp_path):
    report = tmp_path / "demo.html"
    result = runner.invoke(app, ["demo", "--n-items", "300", "--report", str(report), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "nnn" in result.output and "largest hub" in result.output
    text = report.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.count("<img") == 2
    mask = os.umask(0o022)
    os.umask(mask)
    assert report.stat().st_mode & 0o777 == 0o666 & ~mask  # readable like any file, not 0600
