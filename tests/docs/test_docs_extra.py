"""The ``docs`` extra builds the site (issue 51): ``pip install -e ".[docs]" && mkdocs build
--strict``, as CONTRIBUTING.md documents it, in a new virtual environment that holds nothing
but hubless and that extra (no system site packages, no PYTHONPATH), from a copy of the
project. The HTTP reference is generated from the service (``docs/_hooks/generate.py``), which
needs the ``serve`` extra: the ``docs`` extra pulls it in. Real installs from the package index
pip is set up with (about a minute here), hence slow."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: What the site is built from: the docs, the package they document, the files they include.
PROJECT = ("pyproject.toml", "mkdocs.yml", "README.md", "LICENSE", "CHANGELOG.md", "CONTRIBUTING.md", "docs", "src")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.mark.slow
def test_the_docs_extra_alone_builds_the_site(tmp_path):
    project = tmp_path / "hubless"
    project.mkdir()
    for name in PROJECT:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(source, project / name)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "VIRTUAL_ENV"))}
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path, env, 120)
    python = venv / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--quiet", "-e", f"{project}[docs]"], tmp_path, env, 900)
    # nothing of the test environment is importable there: only what the extra installed
    probe = "import importlib.util as u; print(all(u.find_spec(m) is None for m in ('pytest', 'torch', 'hypothesis')))"
    assert _run([str(python), "-c", probe], tmp_path, env, 60).stdout.strip() == "True"
    site = tmp_path / "site"
    env_bin = {**env, "PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", "NO_MKDOCS_2_WARNING": "1"}
    _run([str(venv / "bin" / "mkdocs"), "build", "--strict", "--site-dir", str(site)], project, env_bin, 600)
    http = (site / "reference" / "http" / "index.html").read_text()
    assert "POST /search" in http and (site / "openapi.json").is_file()  # generated from the service
    assert "hubless.engine.device" in (site / "reference" / "python" / "engine" / "index.html").read_text()  # mkdocstrings
