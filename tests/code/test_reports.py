"""What a failed test's report shows: the failure, not torch's DEBUG records (issue 51).

torch keeps its trace logger ``torch.__trace`` at DEBUG and not propagating; pytest (9) attaches
its capture handlers to every logger that does not propagate, so a failing test that compiled a
kernel reported about 1,500 lines of DEBUG records under "Captured log call". ``log_level =
"WARNING"`` in pyproject.toml's pytest options keeps them out; this runs pytest with that
configuration on a failing test that logs through torch's logger and checks the report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAILING = """
import logging

import torch  # noqa: F401 - sets up torch.__trace (DEBUG, not propagating) before the test runs


def test_fails_after_torch_logged():
    trace = logging.getLogger("torch.__trace")
    assert trace.level == logging.DEBUG and not trace.propagate
    trace.debug("a torch %s record", "trace")
    logging.getLogger("hubless.test").warning("a warning record")
    assert False, "the failure itself"
"""


@pytest.mark.slow
def test_a_failed_test_reports_no_torch_debug_records(tmp_path):
    pytest.importorskip("torch")
    (tmp_path / "test_failing.py").write_text(FAILING)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-c",
        str(ROOT / "pyproject.toml"),
        "--rootdir",
        str(tmp_path),
        "-p",
        "no:cacheprovider",
        str(tmp_path),
    ]
    result = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "the failure itself" in result.stdout and "a warning record" in result.stdout  # the report works
    assert "a torch trace record" not in result.stdout and "DEBUG    torch" not in result.stdout, result.stdout[-2000:]
