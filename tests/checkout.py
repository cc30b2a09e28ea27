"""What the test run leaves in the checkout: ``git status`` before and after the suite (see
``tests/conftest.py``), so a test that writes into the checkout instead of ``tmp_path`` fails the
run, naming the files."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_status(root: Path) -> set[str] | None:
    """The entries of ``git status --porcelain --untracked-files=all`` of the checkout holding
    ``root`` (changed tracked files and every file git does not ignore), or None outside a git
    checkout (an unpacked sdist) or without git."""
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(root), "status", "--porcelain", "--untracked-files=all", "-z"],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return {entry for entry in done.stdout.decode("utf-8", "surrogateescape").split("\0") if entry}


def left_behind(before: set[str] | None, after: set[str] | None) -> list[str]:
    """The paths of ``after``'s entries that ``before`` did not have (none when either is None):
    files the run created or changed in the checkout."""
    if before is None or after is None:
        return []
    return sorted(entry[3:] if entry[2:3] == " " else entry for entry in after - before)
