"""Progress bars: shown on long runs when asked, silenced by HUBLESS_PROGRESS=0."""

from __future__ import annotations

import time

import pytest

from hubless.engine.parallel import run_blocks


def _slow(start, stop):
    time.sleep(0.3)


def test_bar_appears_on_long_runs_when_asked(capsys):
    run_blocks(_slow, [(i, i + 10) for i in range(0, 100, 10)], progress=True, desc="work")
    assert "work" in capsys.readouterr().err


def test_bar_can_be_turned_off(capsys, monkeypatch):
    run_blocks(_slow, [(0, 10)] * 5, progress=False, desc="work")
    monkeypatch.setenv("HUBLESS_PROGRESS", "0")
    run_blocks(_slow, [(0, 10)] * 5, progress=True, desc="work")
    assert "work" not in capsys.readouterr().err


def test_short_runs_stay_quiet(capsys):
    run_blocks(lambda a, b: None, [(0, 10)], progress=True, desc="work")
    assert "work" not in capsys.readouterr().err


def _on_a_terminal(code: str, env: dict | None = None, timeout: float = 300, stdout: bool = False) -> str:
    """What ``python -c code`` writes to its stderr (and with ``stdout`` its stdout) when that
    is a terminal (a pseudo-terminal)."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # 40 x 120: a terminal's size
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "COLUMNS": "120", **(env or {})}
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.DEVNULL,
        stdout=secondary if stdout else subprocess.DEVNULL,
        stderr=secondary,
        env=env,
    )
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=timeout)
    os.close(primary)
    return b"".join(chunks).decode("utf-8", "replace")


STAGE = "import time\nfrom hubless.progress import stage\nwith stage('writing the report', None):\n    time.sleep({seconds})\n"


def test_a_stage_shows_a_spinner_on_a_terminal_once_it_takes_a_second():
    assert "writing the report" in _on_a_terminal(STAGE.format(seconds=1.8))
    assert "writing the report" not in _on_a_terminal(STAGE.format(seconds=0.2))  # short: quiet


def test_a_stage_is_quiet_off_a_terminal_and_when_turned_off(capfd, monkeypatch):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", STAGE.format(seconds=1.5)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == ""  # a pipe, a log: nothing
    assert "writing the report" not in _on_a_terminal(STAGE.format(seconds=1.5), env={"HUBLESS_PROGRESS": "0"})


def test_evaluate_counts_the_metrics_of_each_method(monkeypatch):
    """The metrics and bootstrap intervals, seconds on large sets, had no bar: now one step per method."""
    import importlib

    import numpy as np

    import hubless
    from tests.conftest import unit_rows

    module = importlib.import_module("hubless.evaluation.evaluate")  # the module (the package exports its function by that name)

    bars = []

    class Recorder:
        def __init__(self, iterable, progress, **kwargs):
            self.kwargs, self.n, self.closed = kwargs, 0, False
            bars.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(module, "progress_bar", Recorder)
    rng = np.random.default_rng(0)
    gallery = unit_rows(rng, 40, 8)
    hubless.evaluate(gallery, unit_rows(rng, 40, 8), np.arange(40), unit_rows(rng, 60, 8), ["nnn:k=3", "is"], bootstrap=10)
    (bar,) = bars
    assert bar.kwargs["total"] == 3 and bar.n == 3 and bar.closed and bar.kwargs["desc"] == "metrics and intervals"


@pytest.mark.slow  # the demo's own 15 s
def test_the_demo_shows_its_progress_on_a_terminal(tmp_path):
    """Issue 53: ``hubless demo`` (15 s) printed nothing until the end."""
    # Bars and spinners appear after hubless.progress.DELAY; zero here, so that a machine fast
    # enough to finish every stage within a second still shows them.
    code = (
        "import hubless.progress\nhubless.progress.DELAY = 0.0\n"
        f"from hubless.cli.main import app\napp(['demo', '--report', {str(tmp_path / 'r.html')!r}])"
    )
    shown = _on_a_terminal(code, stdout=True)
    table = shown.find("R@1 before -> after")
    assert table > 0, shown[-2000:]
    before = shown[:table]
    assert any(word in before for word in ("metrics and intervals", "making the synthetic benchmark", "query bank", "rank 9 methods")), (
        before[-2000:]
    )
    assert "writing the report" in shown[table:], shown[-2000:]
