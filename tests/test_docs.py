"""The documentation runs as written: every code block of README.md, CONTRIBUTING.md and docs/,
in page order, and the site builds with ``mkdocs build --strict`` (no broken link or anchor).

Conventions a page follows (CONTRIBUTING.md, "Documentation"):

* ``bash`` blocks run in bash (``set -euo pipefail``), ``python`` blocks in one namespace per page;
  both in the page's working folder, which starts with the example files of ``hubless data
  synthetic`` and follows a block's ``cd``. ``hubless`` is the command of this checkout; ``python``
  the interpreter running the tests.
* ``text``, ``json`` and the like show output or formats: not run.
* ``<!-- not-run: REASON -->`` on the line before a block: not run here, for the reason given (the
  ``hubless`` commands in it are still parsed: their options must exist).
* ``<!-- needs-data: FOLDER -->``: runs when the benchmark data folder (``../shared/data/FOLDER``
  or ``$HUBLESS_DATA_DIR/FOLDER``, what ``hubless data fetch`` writes) is present; otherwise the
  page's test says it skipped it.
* ``<!-- background -->`` before a one-command bash block: a server, started in the background,
  awaited on ``/health`` and stopped at the end of the page; the port it names (``--port 8000``)
  is replaced by a free one, in that block and in the page's later blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(p for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts)],
    key=lambda p: str(p.relative_to(ROOT)),
)
RUN = {"bash", "sh", "shell", "python", "py"}
SHOWN = {"text", "json", "console", "yaml", "toml", "csv", "html", "http", "output"}
MARK = re.compile(r"<!--\s*(not-run|background|needs-data)\s*(?::\s*(.*?))?\s*-->", re.S)


def _untab(text: str) -> str:
    """Content tabs (``=== "Python"`` with an indented body) as plain Markdown, so their blocks
    are fences too (line numbers unchanged)."""
    lines, inside = text.splitlines(), False
    for i, line in enumerate(lines):
        if line.startswith('=== "'):
            inside = True
        elif inside and line.strip() and not line.startswith("    "):
            inside = False
        elif inside:
            lines[i] = line[4:]
    return "\n".join(lines) + "\n"


def code_blocks(page: Path) -> list[dict]:
    """The fenced blocks of a page: language, code, first line, and the marker before it."""
    tokens = MarkdownIt("commonmark").parse(_untab(page.read_text(encoding="utf-8")))
    blocks = []
    for i, token in enumerate(tokens):
        if token.type != "fence":
            continue
        before = tokens[i - 1] if i else None
        mark = MARK.fullmatch(before.content.strip()) if before is not None and before.type == "html_block" else None
        lang = token.info.split()[0].lower() if token.info.strip() else ""
        blocks.append(
            {"lang": lang, "code": token.content, "line": token.map[0] + 1, "mark": mark and mark.group(1), "why": mark and mark.group(2)}
        )
    return blocks


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_block_is_runnable_or_says_why_not(page):
    for block in code_blocks(page):
        where = f"{_page_id(page)}:{block['line']}"
        assert block["lang"] in RUN | SHOWN, (
            f"{where}: say what the block is: bash or python (run), text or json (shown); got {block['lang']!r}"
        )
        if block["mark"] == "not-run":
            assert block["why"] and len(block["why"]) > 10, f"{where}: a not-run block says why"
        if block["mark"] == "needs-data":
            assert block["why"] in ("coco_karpathy", "flickr30k_karpathy", "visogender"), f"{where}: needs-data: FOLDER"
        if block["mark"] == "background":
            assert block["lang"] == "bash" and len(block["code"].strip().splitlines()) == 1, f"{where}: one server command"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_hubless_commands_of_not_run_blocks_parse(page):
    from tests.test_readme import parse  # imported here: test_readme imports this module

    for block in code_blocks(page):
        if block["mark"] != "not-run" or block["lang"] not in ("bash", "sh", "shell"):
            continue
        for command in _hubless_commands(block["code"]):
            try:
                parse(shlex.split(command)[1:])
            except Exception as exc:  # noqa: BLE001 - report which command of which page
                pytest.fail(f"{_page_id(page)}:{block['line']}: `{command}` does not parse: {exc}")


def _hubless_commands(code: str) -> list[str]:
    lines = code.replace("\\\n", " ").splitlines()
    commands = []
    for line in lines:
        line = re.sub(r"\s#.*$", "", line).strip()
        for part in re.split(r"\s*(?:&&|;|\|)\s*", line):
            part = part.strip()
            if re.match(r"^(\S+/)?hubless\s", part):
                commands.append(re.sub(r"^\S+/hubless", "hubless", part))
    return commands


# --- running a page ----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def example_files(tmp_path_factory):
    from hubless.data.synthetic import write_example_files

    folder = tmp_path_factory.mktemp("example-files")
    write_example_files(folder)
    return folder


@pytest.fixture(scope="session")
def shims(tmp_path_factory):
    """``hubless`` and ``python`` for the blocks: this checkout's code and the tests' interpreter."""
    folder = tmp_path_factory.mktemp("bin")
    (folder / "hubless").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m hubless "$@"\n')
    (folder / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in folder.iterdir():
        f.chmod(0o755)
    return folder


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The page's Python process: runs each block it is sent (a JSON line: code, cwd, name) in one
#: namespace, its prints swallowed, and answers a JSON line {"ok": ..., "error": traceback}.
WORKER = r"""
import contextlib, io, json, os, sys, traceback
answer = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # output of C libraries (Ray, FAISS) never mixes with the answers
namespace = {"__name__": "__main__"}
for line in sys.stdin:
    request = json.loads(line)
    os.chdir(request["cwd"])
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(request["code"], request["name"], "exec"), namespace)
        reply = {"ok": True}
    except BaseException:
        reply = {"ok": False, "error": traceback.format_exc()[-4000:]}
    answer.write(json.dumps(reply) + "\n")
    answer.flush()
"""


class PageRun:
    """Runs a page's blocks in order in one working folder (and one Python namespace)."""

    def __init__(self, page: Path, cwd: Path, shims: Path):
        self.page, self.cwd = page, cwd
        self.env = {**os.environ, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "HUBLESS_PROGRESS": "0", "COLUMNS": "160"}
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")]))
        self.worker: subprocess.Popen | None = None
        self.ports: dict[int, int] = {}  # the port a page's server names -> the free port it runs on
        self.servers: list[subprocess.Popen] = []
        self.state = cwd / ".docs-cwd"

    def where(self, block) -> str:
        return f"{_page_id(self.page)}:{block['line']}"

    def substitute(self, code: str) -> str:
        for port, free in self.ports.items():
            code = re.sub(rf"\b{port}\b", str(free), code)
        return code

    def bash(self, block) -> None:
        code = self.substitute(block["code"])
        script = f'set -euo pipefail\ncd "{self.cwd}"\n{code}\npwd > "{self.state}"\n'
        result = subprocess.run(["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, (
            f"{self.where(block)} failed ({result.returncode}):\n{code}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
        assert "Traceback" not in result.stderr, f"{self.where(block)}:\n{result.stderr[-3000:]}"
        self.cwd = Path(self.state.read_text().strip())

    def python(self, block) -> None:
        """Run in the page's own Python process (one namespace for the page; started at its first
        block), so a page's imports, Ray or working folder never leak into the tests."""
        if self.worker is None:
            self.worker = subprocess.Popen(
                [sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, text=True
            )
        request = {"code": self.substitute(block["code"]), "cwd": str(self.cwd), "name": self.where(block)}
        self.worker.stdin.write(json.dumps(request) + "\n")
        self.worker.stdin.flush()
        answer = self.worker.stdout.readline()
        assert answer, f"{self.where(block)}: the page's Python process died"
        reply = json.loads(answer)
        assert reply["ok"], f"{self.where(block)} failed:\n{request['code']}\n{reply['error']}"

    def background(self, block) -> None:
        named = re.search(r"--port (\d+)", block["code"])
        assert named, f"{self.where(block)}: a background server names its --port"
        port = self.ports.setdefault(int(named.group(1)), _free_port())
        command = self.substitute(block["code"]).strip()
        log = open(self.cwd / f".server-{len(self.servers)}.log", "w")  # noqa: SIM115 - kept open while it runs
        server = subprocess.Popen(
            ["bash", "-c", f"exec {command}"], cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.servers.append(server)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert server.poll() is None, f"{self.where(block)}: the server stopped:\n{(self.cwd / log.name).read_text()[-3000:]}"
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).read()
                return
            time.sleep(0.3)
        raise AssertionError(f"{self.where(block)}: the server did not answer /health within 120 s")

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stdin.close()
            self.worker.wait(timeout=60)
        for server in self.servers:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()


def run_page(page: Path, workdir: Path, shims: Path) -> tuple[int, list[str]]:
    """Run every runnable block of ``page``; returns how many ran and the data folders of the
    blocks skipped for want of them."""
    from hubless.data.karpathy import data_dir

    run = PageRun(page, workdir, shims)
    ran, missing = 0, []
    try:
        for block in code_blocks(page):
            if block["mark"] == "not-run" or block["lang"] not in RUN:
                continue
            if block["mark"] == "needs-data" and not (data_dir() / block["why"]).is_dir():
                missing.append(block["why"])
                continue
            if block["mark"] == "background":
                run.background(block)
            elif block["lang"] in ("python", "py"):
                run.python(block)
            else:
                run.bash(block)
            ran += 1
    finally:
        run.stop()
    return ran, missing


RUNNABLE = [p for p in PAGES if any(b["mark"] != "not-run" and b["lang"] in RUN for b in code_blocks(p))]


@pytest.mark.slow
@pytest.mark.parametrize("page", RUNNABLE, ids=_page_id)
def test_page_runs_as_written(page, example_files, shims, tmp_path):
    workdir = tmp_path / "work"
    shutil.copytree(example_files, workdir)
    ran, missing = run_page(page, workdir, shims)
    if missing:
        pytest.skip(f"ran {ran} blocks; {len(missing)} need {', '.join(sorted(set(missing)))} (../shared/data, or `hubless data fetch`)")
    assert ran >= 1


# --- the site ----------------------------------------------------------------------------------


ARTIFACTS = Path(os.environ.get("HUBLESS_TEST_ARTIFACTS", ROOT / ".artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """``mkdocs build --strict``: every page in the nav, no broken link or anchor, no warning from
    mkdocstrings (the API pages) or the hooks that generate the CLI and HTTP references."""
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    out = tmp_path_factory.mktemp("site")
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    hint = "\nA new page under docs/? Add it to the nav in mkdocs.yml." if "not included in the" in result.stderr else ""
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:] + hint
    return out


@pytest.mark.slow
def test_the_site_builds_strictly(site):
    for page in ("index.html", "tutorial/index.html", "reference/cli/index.html", "reference/http/index.html", "openapi.json"):
        assert (site / page).is_file(), page
    cli = (site / "reference/cli/index.html").read_text()
    assert "hubless index build" in cli and "--query-bank" in cli and "hubless data synthetic" in cli
    assert "/search" in (site / "reference/http/index.html").read_text()
    assert (
        "class</code>" in (site / "reference/python/corrections/index.html").read_text()
        or "NNN" in (site / "reference/python/corrections/index.html").read_text()
    )


@pytest.mark.slow
@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (.ci/run installs it)")
def test_the_site_in_chromium(site):
    """The home page and a how-to page as a reader sees them: served over HTTP, no console error,
    every image loaded, the navigation and the code blocks shown; screenshots kept in .artifacts/."""
    import functools
    import http.server
    import threading

    playwright = pytest.importorskip("playwright.sync_api")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        with playwright.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            for path, shot in (("", "docs-home.png"), ("how-to/evaluate-and-tune/", "docs-how-to.png")):
                response = page.goto(f"http://127.0.0.1:{server.server_address[1]}/{path}")
                assert response.ok
                page.wait_for_load_state("networkidle")
                broken = page.eval_on_selector_all("img", "imgs => imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
                assert not broken, broken
                assert page.locator("nav.md-nav--primary").first.is_visible()
                assert page.locator("pre code").count() >= 1
                page.screenshot(path=str(ARTIFACTS / shot))
            assert page.locator("h1").first.inner_text().startswith("Evaluate and tune without leakage")
            browser.close()
        assert not errors, errors
    finally:
        server.shutdown()


def test_every_environment_variable_is_documented():
    """docs/reference/environment.md names every HUBLESS_* variable the code reads."""
    used = set()
    for path in (ROOT / "src").rglob("*.py"):
        used |= set(re.findall(r"\bHUBLESS_[A-Z_]+\b", path.read_text(encoding="utf-8")))
    internal = {"HUBLESS_SERVE_CONFIG"}  # hubless serve -> its worker processes
    page = (ROOT / "docs" / "reference" / "environment.md").read_text(encoding="utf-8")
    missing = sorted(v for v in used - internal if f"`{v}`" not in page)
    assert not missing, f"document these in docs/reference/environment.md: {missing}"
