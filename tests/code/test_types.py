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
        # the project's own options and cache: after test_mypy_finds_no_error_in_src only the snippet is new
        [
            sys.executable,
            "-m",
            "mypy",
            "--cache-dir",
            str(ROOT / ".cache" / "mypy"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            str(snippet),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    revealed = [line for line in done.stdout.splitlines() if "Revealed type" in line]
    assert len(revealed) == 3 and revealed[0].endswith('-> hubless.index.index.Index"'), done.stdout  # not Any
    assert revealed[1].endswith('-> hubless.corrections.nnn.NNN"'), done.stdout
    assert revealed[2].endswith('"dict[str, tuple[float, float]]"'), done.stdout  # typed results, not Any


#: The public face held to ``mypy --strict`` (issue 40 item 5): the package's face, the typed
#: settings, answers, index description, evaluate / tune and their results, and the export
#: functions. pyproject.toml turns on, for these modules, every flag of --strict that mypy lets a
#: module set (the rest are set for the whole package), so the one mypy run of
#: :func:`test_mypy_finds_no_error_in_src` holds them to it.
STRICT_FACE = {
    "hubless",
    "hubless.index",
    "hubless.index.info",
    "hubless.service.settings",
    "hubless.service.answers",
    "hubless.export.api",
    "hubless.evaluation",
    "hubless.evaluation.results",
    "hubless.tuning",
}
STRICT_PER_MODULE = {
    "disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls", "disallow_untyped_defs",
    "disallow_incomplete_defs", "disallow_untyped_decorators", "warn_return_any", "no_implicit_reexport", "extra_checks",
}  # fmt: skip
STRICT_GLOBAL = {"warn_redundant_casts", "warn_unused_ignores", "strict_equality", "check_untyped_defs", "no_implicit_optional"}


def test_the_public_face_is_held_to_mypy_strict():
    tomllib = pytest.importorskip("tomllib", reason="Python 3.11 reads pyproject.toml")

    mypy = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert all(mypy.get(flag) is True for flag in STRICT_GLOBAL), "the package-wide strict flags"
    strict = [o for o in mypy["overrides"] if all(o.get(flag) is True for flag in STRICT_PER_MODULE)]
    held = {m for o in strict for m in ([o["module"]] if isinstance(o["module"], str) else o["module"])}
    assert STRICT_FACE <= held, f"not held to --strict: {sorted(STRICT_FACE - held)}"
    for module in held:  # every module named exists (a renamed module would silently drop out)
        path = ROOT / "src" / Path(*module.split("."))
        assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), module
