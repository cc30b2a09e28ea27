"""The code passes the project's linter and formatter (configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ["src", "tests", "benchmarks"]


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return [exe]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff(command):
    done = subprocess.run([*_ruff(), *command, *TARGETS], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_formatter_decides_the_layout_of_the_library():
    """No ``# fmt: skip`` / ``# fmt: off`` in src: a layout the formatter would change is a line
    to write another way (a named part, a shorter call), not one to exempt."""
    exempted = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sorted((ROOT / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "# fmt: skip" in line or "# fmt: off" in line
    ]
    assert exempted == [], exempted
