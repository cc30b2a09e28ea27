"""The package's annotations are checked: mypy (configured in pyproject.toml: every function
body, no implicit Optional, strict equality, unused ignores flagged) finds no error in src/, and
py.typed ships so that users' type checkers read them. Method names have a Literal type."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


def test_every_lazy_public_name_is_visible_to_type_checkers():
    """`hubless.X` is imported lazily (PEP 562); a TYPE_CHECKING block re-exports the same names,
    from the same modules, so a type checker sees each one's real type instead of Any."""
    import ast

    import hubless

    tree = ast.parse((ROOT / "src" / "hubless" / "__init__.py").read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {a.name: node.module for node in guarded.body if isinstance(node, ast.ImportFrom) for a in node.names if a.asname == a.name}
    assert seen == hubless._EXPORTS


@pytest.mark.slow
def test_a_type_checker_reads_the_real_type_of_a_lazy_name(tmp_path):
    pytest.importorskip("mypy", reason="the test extra installs mypy")
    snippet = tmp_path / "use.py"
    snippet.write_text(
        "import hubless\nreveal_type(hubless.Index)\nreveal_type(hubless.NNN(k=4).fit)\n"
        "reveal_type(hubless.evaluate([[1.0]], [[1.0]], [0]).results[0].ci95)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(ROOT / ".cache" / "mypy"), "--config-file", "", str(snippet)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    revealed = [line for line in done.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 3 and revealed[0].endswith('-> hubless.index.index.Index"'), done.stdout  # not Any
    assert revealed[1].endswith('-> hubless.corrections.nnn.NNN"'), done.stdout
    assert revealed[2].endswith('"dict[str, tuple[float, float]]"'), done.stdout  # typed results, not Any


#: The public modules held to ``mypy --strict`` (issue 40 item 5): the package's face, the typed
#: settings, answers, index description, evaluate / tune and their results, and the export
#: functions. Add a module here once it is strict-clean.
STRICT = [
    "src/hubless/__init__.py",
    "src/hubless/index/__init__.py",
    "src/hubless/index/info.py",
    "src/hubless/service/__init__.py",
    "src/hubless/service/settings.py",
    "src/hubless/service/answers.py",
    "src/hubless/cli/serve.py",
    "src/hubless/export/info.py",
    "src/hubless/export/api.py",
    "src/hubless/evaluation/__init__.py",
    "src/hubless/evaluation/evaluate.py",
    "src/hubless/evaluation/eccv.py",
    "src/hubless/evaluation/results.py",
    "src/hubless/evaluation/robustness.py",
    "src/hubless/fairness/audit.py",
    "src/hubless/rerank/evaluate.py",
    "src/hubless/tuning.py",
]


@pytest.mark.slow
def test_the_public_face_is_mypy_strict_clean():
    pytest.importorskip("mypy", reason="the test extra installs mypy")
    pytest.importorskip("pydantic_settings", reason="the serve extra installs pydantic-settings")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--cache-dir", str(ROOT / ".cache" / "mypy-strict"), *STRICT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0 and "Success: no issues found" in done.stdout, done.stdout + done.stderr
