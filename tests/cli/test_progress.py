"""Progress bars: shown on long runs when asked, silenced by HUBLESS_PROGRESS=0."""

from __future__ import annotations

import time

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
