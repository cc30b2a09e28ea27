"""The index write lock: one writer at a time, released on exit and on kill, clear timeout error."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from hubless.index.lock import IndexLockedError, lock_path, write_lock


def test_lock_file_is_a_sibling(tmp_path):
    assert lock_path(tmp_path / "idx") == (tmp_path / ".idx.lock").absolute()


def test_second_writer_times_out_with_a_clear_error(tmp_path):
    with write_lock(tmp_path / "idx"):
        with pytest.raises(IndexLockedError, match="another process"):
            with write_lock(tmp_path / "idx", timeout=0.2):
                pass
    with write_lock(tmp_path / "idx", timeout=0.2):  # released
        pass


def test_writers_are_serialised(tmp_path):
    events = []

    def writer(name):
        with write_lock(tmp_path / "idx", timeout=10):
            events.append(("in", name))
            time.sleep(0.1)
            events.append(("out", name))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e[0] for e in events] == ["in", "out"] * 4
    assert all(events[i][1] == events[i + 1][1] for i in range(0, 8, 2))


def test_lock_of_a_killed_holder_is_released(tmp_path):
    code = f"from hubless.index.lock import write_lock\nwith write_lock({str(tmp_path / 'idx')!r}):\n    print('held', flush=True)\n    import time; time.sleep(60)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(IndexLockedError):
            with write_lock(tmp_path / "idx", timeout=0.1):
                pass
        proc.kill()
        proc.wait()
        with write_lock(tmp_path / "idx", timeout=5):
            pass
    finally:
        proc.kill()


def test_bad_timeout_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBLESS_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HUBLESS_LOCK_TIMEOUT"):
        with write_lock(tmp_path / "idx"):
            pass
