"""The suite leaves the checkout as it found it: ``tests/conftest.py`` compares ``git status``
at the start and the end of the run and fails the run naming any file git does not ignore that
appeared (``tests/checkout.py``). Tested on a real git repository cloned into ``tmp_path``, with
pytest run in it on a test that writes into the checkout and one that does not, and on a copy
that is no git checkout at all."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checkout import git_status, left_behind

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"

WRITES = """
from pathlib import Path

def test_writes_into_the_checkout():
    Path(__file__).resolve().parents[1].joinpath("planted.txt").write_text("left behind")
    Path(__file__).resolve().parents[1].joinpath("ignored.log").write_text("ignored by .gitignore")
"""
CLEAN = """
def test_writes_nothing(tmp_path):
    (tmp_path / "fine.txt").write_text("under tmp_path")
"""


def _git(*args, cwd):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env=env)


def _checkout(root: Path) -> Path:
    """A small project with this suite's conftest, committed in a git repository."""
    (root / "tests").mkdir(parents=True)
    for name in ("__init__.py", "conftest.py", "checkout.py"):
        shutil.copy(TESTS / name, root / "tests" / name)
    (root / "tests" / "test_writes.py").write_text(WRITES)
    (root / "tests" / "test_clean.py").write_text(CLEAN)
    (root / ".gitignore").write_text("*.log\n__pycache__/\n")
    return root


def _pytest(root: Path, test: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/{test}"],
        cwd=root,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.fixture
def clone(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    origin = _checkout(tmp_path / "origin")
    _git("init", "-q", cwd=origin)
    _git("add", "-A", cwd=origin)
    _git("commit", "-q", "-m", "init", cwd=origin)
    _git("clone", "-q", str(origin), str(tmp_path / "clone"), cwd=tmp_path)
    return tmp_path / "clone"


@pytest.mark.slow  # a pytest run in a subprocess: about 6 s
def test_a_run_that_writes_into_a_clone_fails_naming_the_file(clone):
    (clone / "there-before.txt").write_text("untracked before the run: not the run's doing")
    done = _pytest(clone, "test_writes.py")
    assert done.returncode != 0, done.stdout
    assert "left 1 file(s) in the checkout that git does not ignore" in done.stdout and "planted.txt" in done.stdout, done.stdout
    assert "ignored.log" not in done.stdout and "there-before.txt" not in done.stdout


@pytest.mark.slow  # a pytest run in a subprocess: about 6 s
def test_a_run_that_writes_under_tmp_path_passes(clone):
    done = _pytest(clone, "test_clean.py")
    assert done.returncode == 0, done.stdout


@pytest.mark.slow  # a pytest run in a subprocess: about 6 s
def test_outside_a_git_checkout_the_check_stands_aside(tmp_path):
    root = _checkout(tmp_path / "plain")  # as an unpacked sdist: no .git
    if git_status(root) is not None:
        pytest.skip("tmp_path lies inside a git checkout on this machine")
    done = _pytest(root, "test_writes.py")
    assert done.returncode == 0, done.stdout


def test_left_behind_names_new_and_changed_files(clone):
    before = git_status(clone)
    assert before == set()
    (clone / "new.txt").write_text("x")
    (clone / "tests" / "test_clean.py").write_text(CLEAN + "\n")
    (clone / "x.log").write_text("ignored")
    assert left_behind(before, git_status(clone)) == ["new.txt", "tests/test_clean.py"]
    assert left_behind(None, git_status(clone)) == []
