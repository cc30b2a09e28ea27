"""The documentation runs as written: every code block of README.md, CONTRIBUTING.md and docs/,
in page order, and the site builds with ``mkdocs build --strict`` (no broken link or anchor).

Conventions a page follows (CONTRIBUTING.md, "Documentation"):

* ``bash`` blocks run in bash (``set -euo pipefail``), ``python`` blocks in one namespace per page;
  both in the page's working folder, which starts with the example files of ``hubless data
  synthetic`` and follows a block's ``cd``. They run as in the activated virtual environment the
  docs install into: the ``bin`` folder of the tests' interpreter first on PATH (``hubless`` is its
  real entry point, ``python`` its interpreter; no stand-in), ``VIRTUAL_ENV`` set.
* ``text``, ``json`` and the like show output or formats: not run. A ``text`` (``console``,
  ``output``) block right after a run block, nothing between them, is what that block prints
  (stdout and stderr of a bash block, stdout of a python block) and is compared with it: line by
  line, runs of spaces taken as one; ``...`` on a line of its own stands for any lines (none or
  more), ``...`` within a line for any text on that line (a time, a path, a varying number).
* ``curl`` in a run block fails on an HTTP error (``--fail-with-body``, or ``-f``/``--fail``):
  its exit code is what the test sees.
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

from tests.conftest import needs_shared

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *(p for p in (ROOT / "docs").rglob("*.md") if "_hooks" not in p.parts)],
    key=lambda p: str(p.relative_to(ROOT)),
)
RUN = {"bash", "sh", "shell", "python", "py"}
SHOWN = {"text", "json", "console", "yaml", "toml", "csv", "html", "http", "output"}
OUTPUT = {"text", "console", "output"}  # right after a run block: what it prints
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
        after = tokens[i + 1] if i + 1 < len(tokens) else None
        if blocks[-1]["lang"] in RUN and after is not None and after.type == "fence" and after.info.strip().lower() in OUTPUT:
            blocks[-1]["output"] = (after.content, after.map[0] + 1)
    return blocks


def output_matches(shown: str, printed: str) -> bool:
    """Whether ``printed`` is what ``shown`` says (the module docstring's rules): line by line,
    each line stripped and its runs of spaces taken as one; ``...`` alone on a line is any lines
    (none or more), ``...`` within a line any text on that line; blank lines at either end ignored."""

    def norm(text: str) -> list[str]:
        lines = [re.sub(r"[ \t]+", " ", line).strip() for line in text.replace("\r\n", "\n").split("\n")]
        while lines and not lines[0]:
            lines.pop(0)
        while lines and not lines[-1]:
            lines.pop()
        return lines

    pattern = ""
    for line in norm(shown):
        if line == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += "[^\n]*?".join(re.escape(part) for part in line.split("...")) + "\n"
    return re.fullmatch(pattern, "".join(f"{line}\n" for line in norm(printed))) is not None


def curl_without_fail(code: str) -> list[str]:
    """The ``curl`` commands of ``code`` that would exit 0 on an HTTP error (no ``--fail-with-body``,
    ``--fail`` or a short ``-f``)."""
    found = []
    for command in re.split(r"&&|\|\||[|;\n]", code.replace("\\\n", " ")):
        words = command.split()
        while words and re.fullmatch(r"\w+=\S*", words[0]):  # VAR=value curl ...
            words.pop(0)
        if not words or words[0] != "curl":
            continue
        words = words[1:]
        if not any(w in ("--fail", "--fail-with-body") or re.fullmatch(r"-[a-zA-Z]*f[a-zA-Z]*", w) for w in words):
            found.append(command.strip())
    return found


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


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
        if block["mark"] != "not-run" and block["lang"] in ("bash", "sh", "shell"):
            loose = curl_without_fail(block["code"])
            assert not loose, f"{where}: curl exits 0 on an HTTP error (a 404 would pass): add --fail-with-body to {loose}"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_hubless_commands_of_not_run_blocks_parse(page):
    from tests.docs.test_readme import parse  # imported here: test_readme imports this module

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


def venv_bin() -> Path:
    """The virtual environment's ``bin`` the docs' blocks run with, as ``source .venv/bin/activate``
    would put it on PATH: the tests' own (``.ci/run`` installs the project there, so ``hubless`` is
    its real entry point). Not resolved: a venv's python is a link to the base interpreter."""
    folder = Path(sys.executable).parent
    missing = [name for name in ("hubless", "python") if not (folder / name).is_file()]
    assert not missing, (
        f"{folder} has no {missing}: run the tests from the virtual environment the project is installed in (pip install -e .)"
    )
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
        with contextlib.redirect_stdout(io.StringIO()) as printed:
            exec(compile(request["code"], request["name"], "exec"), namespace)
        reply = {"ok": True, "printed": printed.getvalue()[-100000:]}
    except BaseException:
        reply = {"ok": False, "error": traceback.format_exc()[-4000:]}
    answer.write(json.dumps(reply) + "\n")
    answer.flush()
"""


class PageRun:
    """Runs a page's blocks in order in one working folder (and one Python namespace)."""

    def __init__(self, page: Path, cwd: Path):
        self.page, self.cwd = page, cwd
        venv = venv_bin()
        self.env = {**os.environ, "PATH": f"{venv}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv.parent)}
        self.env.pop("PYTHONHOME", None)
        self.env |= {"HUBLESS_PROGRESS": "0", "COLUMNS": "160"}
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
        result = subprocess.run(
            ["bash", "-c", script], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200
        )
        assert result.returncode == 0, f"{self.where(block)} failed ({result.returncode}):\n{code}\n{result.stdout[-6000:]}"
        assert "Traceback" not in result.stdout, f"{self.where(block)}:\n{result.stdout[-3000:]}"
        self.cwd = Path(self.state.read_text().strip())
        self.check_output(block, result.stdout)

    def check_output(self, block, printed: str) -> None:
        if "output" not in block:
            return
        shown, line = block["output"]
        assert output_matches(self.substitute(shown), printed), (
            f"{_page_id(self.page)}:{line}: the page shows an output the block at line {block['line']} does not print "
            f"('...' marks what varies).\nshown:\n{shown}\nprinted:\n{printed[-6000:]}"
        )

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
        self.check_output(block, reply["printed"])

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


def run_page(page: Path, workdir: Path) -> tuple[int, list[str]]:
    """Run every runnable block of ``page``; returns how many ran and the data folders of the
    blocks skipped for want of them."""
    from hubless.data.karpathy import data_dir

    run = PageRun(page, workdir)
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


def _with_data_marks(page: Path):
    """``page`` as a parameter, marked ``needs_shared`` with the data folders its blocks need."""
    folders = sorted({b["why"] for b in code_blocks(page) if b["mark"] == "needs-data"})
    return pytest.param(page, marks=needs_shared(*folders)) if folders else page


@pytest.mark.slow
@pytest.mark.parametrize("page", [_with_data_marks(p) for p in RUNNABLE], ids=_page_id)
def test_page_runs_as_written(page, example_files, tmp_path):
    workdir = tmp_path / "work"
    shutil.copytree(example_files, workdir)
    ran, missing = run_page(page, workdir)
    assert not missing, f"blocks need {missing}: the page's needs_shared mark lists them"
    assert ran >= 1


# --- the harness itself: what it runs with and what it catches ---------------------------------


def test_shown_output_rules():
    printed = "5000 queries over 1000 items\n┃ method   ┃   R@1 ┃\n│ baseline │ 38.66 │\nresults: /tmp/x1/results.json\n"
    assert output_matches("5000 queries over 1000 items\n┃ method ┃ R@1 ┃\n│ baseline │ 38.66 │\nresults: .../results.json", printed)
    assert output_matches("\n5000 queries over ... items\n...\n", printed)  # "..." lines: any lines; within a line: any text
    assert output_matches("...\nresults: ...", printed) and output_matches("...", printed)
    assert not output_matches("│ baseline │ 38.67 │", printed)  # another number
    assert not output_matches("5000 queries over 1000 items\n│ baseline │ 38.66 │\n...", printed)  # a line left out without "..."
    assert not output_matches("5000 queries over 1000 items", printed)  # the rest is not shown: say "..."


def test_curl_must_fail_on_http_errors():
    assert curl_without_fail("curl -s localhost:8000/indexes/coco") == ["curl -s localhost:8000/indexes/coco"]
    assert curl_without_fail("x=1 && curl -s -X POST localhost/items -H 'a: b' \\\n  -d @new.json | python -m json.tool") != []
    for ok in ("curl --fail-with-body -s localhost:8000/x", "curl -sf localhost/x", "curl --fail localhost/x", "echo curl"):
        assert curl_without_fail(ok) == [], ok


def _page(tmp_path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_blocks_run_with_the_environments_own_hubless(tmp_path):
    """No stand-in on PATH: ``hubless`` and ``python`` are those of the virtual environment the
    tests run in, as ``source .venv/bin/activate`` gives a user; what a block prints is compared
    with the text block after it."""
    venv = venv_bin()
    page = _page(
        tmp_path,
        f"```bash\ncommand -v hubless python\necho $VIRTUAL_ENV\nhubless --version\n```\n\n"
        f"```text\n{venv}/hubless\n{venv}/python\n{venv.parent}\nhubless ...\n```\n\n"
        "```python\nprint(1 + 1)\n```\n\n```text\n2\n```\n",
    )
    assert run_page(page, tmp_path) == (2, [])
    wrong = _page(tmp_path, "```python\nprint(1 + 1)\n```\n\n```text\n3\n```\n")
    with pytest.raises(AssertionError, match="does not print"):
        run_page(wrong, tmp_path)


def test_an_http_error_fails_the_block(tmp_path):
    """``curl --fail-with-body`` on a 404 fails its block (``curl -s`` alone would exit 0)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "there.txt").write_text("here\n")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert (
            run_page(_page(tmp_path, f"```bash\ncurl --fail-with-body -s {url}/there.txt\n```\n\n```text\nhere\n```\n"), tmp_path)[0] == 1
        )
        with pytest.raises(AssertionError, match="failed"):
            run_page(_page(tmp_path, f"```bash\ncurl --fail-with-body -s {url}/items/42\n```\n"), tmp_path)
    finally:
        server.shutdown()


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
