"""The package's annotations are checked: mypy (configured in pyproject.toml: every function
body, no implicit Optional, strict equality, unused ignores flagged) finds no error in src/, and
py.typed ships so that users' type checkers read them. Method names have a Literal type."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mypy_finds_no_error_in_src():
    pytest.importorskip("mypy", reason="the test extra installs mypy")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".cache" / "mypy")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0 and "Success: no issues found" in done.stdout, done.stdout + done.stderr


def test_the_package_ships_py_typed_and_the_config_is_strict():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads pyproject.toml")
    assert (ROOT / "src" / "hubless" / "py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["hubless"]
    mypy = config["tool"]["mypy"]
    assert mypy["check_untyped_defs"] and mypy["no_implicit_optional"] and mypy["warn_unused_ignores"]
    assert not [o for o in config["tool"]["mypy"].get("overrides", []) if o.get("ignore_errors")]  # no module is exempt


def test_method_names_have_a_literal_type_listing_every_builtin():
    from hubless.corrections import METHODS, MethodName

    builtin = {name for name, cls in METHODS.items() if cls.__module__.startswith("hubless.corrections.")}
    assert set(typing.get_args(MethodName)) == builtin
