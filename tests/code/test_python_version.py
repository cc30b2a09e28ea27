"""``requires-python`` is true to the code: the oldest Python it names (3.10) is the one mypy
checks ``src/`` against (its standard library stubs know which names came later) and ruff
targets, every source, test and benchmark file parses as that Python's grammar, and the tests and
benchmarks use no standard-library name added after it (the code under test could not be run
there; ``contextlib.chdir``, 3.11, was one). Checked against a real 3.10.13 interpreter when
this was written: the quick tests of src's layers, engine, index, CLI, evaluation and
corrections pass on it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OLDEST = (3, 10)

#: Standard-library names added after 3.10, with the Python that added them (a test that needs
#: one skips without it, as the tomllib checks do with ``pytest.importorskip``).
NEWER = {
    r"\bcontextlib\.chdir\b|from contextlib import [^\n]*\bchdir\b": "3.11",
    r"\bdatetime\.UTC\b|from datetime import [^\n]*\bUTC\b": "3.11",
    r"\bStrEnum\b": "3.11",
    r"\bExceptionGroup\b|\bexcept\*": "3.11",
    r"\bTaskGroup\b|\basyncio\.timeout\(": "3.11",
    r"\bhashlib\.file_digest\b": "3.11",
    r"from typing import [^\n]*\b(Self|Never|LiteralString|assert_never|reveal_type)\b": "3.11",
    r"^\s*import tomllib|^\s*from tomllib": "3.11",
    r"\bitertools\.batched\b|from itertools import [^\n]*\bbatched\b": "3.12",
}


def _python_files() -> list[Path]:
    return [p for folder in ("src", "tests", "benchmarks", "docs") for p in (ROOT / folder).rglob("*.py")]


def test_requires_python_is_the_version_mypy_and_ruff_check():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^requires-python = ">=3\.10"$', text, re.M)
    assert re.search(r'^python_version = "3\.10"$', text, re.M)  # mypy: src/ against 3.10's standard library
    assert re.search(r'^target-version = "py310"$', text, re.M)  # ruff


def test_every_file_parses_as_the_oldest_python():
    failed = []
    for path in _python_files():
        try:
            ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=OLDEST)
        except SyntaxError as exc:
            failed.append(f"{path.relative_to(ROOT)}:{exc.lineno}: {exc.msg}")
    assert not failed, "\n".join(failed)


def test_tests_and_benchmarks_use_no_newer_standard_library_name():
    found = []
    for path in _python_files():
        if path == Path(__file__).resolve():
            continue
        text = path.read_text(encoding="utf-8")
        for pattern, version in NEWER.items():
            for match in re.finditer(pattern, text, re.M):
                line = text.count("\n", 0, match.start()) + 1
                if "importorskip" not in text.splitlines()[line - 1]:
                    found.append(f"{path.relative_to(ROOT)}:{line}: {match.group(0).strip()} (Python {version})")
    assert not found, "\n".join(found)
