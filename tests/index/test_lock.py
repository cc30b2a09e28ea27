"""The write lock: one writer at a time across processes (also through a symlink), inside the
directory it guards, taken after the input is checked, released on exit and on kill, nothing
left beside a user's path, a clear timeout error."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from typer.testing import CliRunner

from hubless.errors import MissingFile
from hubless.index.lock import LOCK_FILE, IndexLockedError, lock_path, write_lock
from tests.conftest import unit_rows

HOLD = """
import sys, time
from hubless.index.lock import write_lock
with write_lock(sys.argv[1], create=True):
    print('held', flush=True)
    sys.stdin.readline()  # held until the test writes a line (or closes stdin)
"""


def _holder(path):
    """A second process holding the lock of ``path`` until its stdin gets a line."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_the_lock_file_is_inside_the_directory_on_its_resolved_path(tmp_path):
    (tmp_path / "idx").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "idx")
    assert lock_path(tmp_path / "link") == lock_path(tmp_path / "idx") == (tmp_path / "idx").resolve() / LOCK_FILE
    with write_lock(tmp_path / "link"):
        assert (tmp_path / "idx" / LOCK_FILE).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx", "link"]  # nothing beside it
    assert list((tmp_path / "idx").iterdir()) == []  # and the lock file is there only while held


def test_a_second_process_is_excluded_also_through_a_symlink(tmp_path):
    (tmp_path / "idx").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "idx")
    for held, tried in (("idx", "link"), ("link", "idx")):
        proc = _holder(tmp_path / held)
        try:
            with pytest.raises(IndexLockedError, match="another process"):
                with write_lock(tmp_path / tried, timeout=0.2):
                    pass
            proc.stdin.write("release\n")
            proc.stdin.flush()
            assert proc.wait(timeout=30) == 0
            with write_lock(tmp_path / tried, timeout=5):  # released
                pass
        finally:
            proc.kill()


WRITER = """
import sys, time
from hubless.index.lock import write_lock
path, log, name = sys.argv[1:]
for _ in range(20):
    with write_lock(path, timeout=60):
        with open(log, "a") as fh:
            fh.write(f"in {name}\\n")
            fh.flush()
            time.sleep(0.005)
            fh.write(f"out {name}\\n")
"""


def test_writers_in_processes_take_turns(tmp_path):
    """Two processes, one naming the directory through a symlink, each write "in"/"out" 20 times
    under the lock: the log never interleaves them."""
    (tmp_path / "idx").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "idx")
    log = tmp_path / "log.txt"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path / p), str(log), p]) for p in ("idx", "link")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lines = log.read_text().splitlines()
    turns = list(zip(lines[::2], lines[1::2]))
    assert len(turns) == 40 and all(a.startswith("in ") and b == "out " + a[3:] for a, b in turns), lines
    assert {a for a, _ in turns} == {"in idx", "in link"}


def test_writers_in_threads_take_turns(tmp_path):
    (tmp_path / "idx").mkdir()
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


def test_a_missing_directory_is_made_only_when_asked_and_removed_when_nothing_was_written(tmp_path):
    with pytest.raises(MissingFile, match="no such directory"):
        with write_lock(tmp_path / "missing"):
            pass
    with write_lock(tmp_path / "a" / "b" / "c", create=True):
        assert (tmp_path / "a" / "b" / "c" / LOCK_FILE).is_file()
    assert list(tmp_path.iterdir()) == []  # the folders made for it went too
    with write_lock(tmp_path / "kept", create=True):
        (tmp_path / "kept" / "data").write_text("x")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["data"]
    with pytest.raises(ValueError, match="not a directory"):
        with write_lock(tmp_path / "kept" / "data", create=True):
            pass


def test_a_writer_that_waited_on_a_removed_lock_takes_the_new_one(tmp_path):
    """A creator whose write failed removes the directory it made, lock file included; a writer
    that waited on that file holds the lock of the directory made again, which excludes."""
    target = tmp_path / "new"
    inside = threading.Event()
    first = threading.Event()
    result = []

    def second():
        first.wait()
        with write_lock(target, timeout=10, create=True):
            inside.set()
            result.append(os.stat(target / LOCK_FILE).st_ino)
            time.sleep(0.5)

    thread = threading.Thread(target=second)
    thread.start()
    with write_lock(target, create=True):
        first.set()
        time.sleep(0.2)  # the second writer opened the lock file and waits on it
    assert inside.wait(10)
    with pytest.raises(IndexLockedError):
        with write_lock(target, timeout=0.1):
            pass
    thread.join()
    assert result and not target.exists()


def test_lock_of_a_killed_holder_is_released(tmp_path):
    proc = _holder(tmp_path / "idx")
    try:
        with pytest.raises(IndexLockedError):
            with write_lock(tmp_path / "idx", timeout=0.1):
                pass
        proc.kill()
        proc.wait()
        with write_lock(tmp_path / "idx", timeout=5):
            pass
    finally:
        proc.kill()


def test_bad_timeout_environment_makes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("HUBLESS_LOCK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HUBLESS_LOCK_TIMEOUT"):
        with write_lock(tmp_path / "idx", create=True):
            pass
    assert list(tmp_path.iterdir()) == []


def test_refused_commands_leave_no_lock_file(tmp_path, monkeypatch):
    """Issue 53: ``hubless attach f.faiss ... -m bogus --out 'R@1'`` exited 2 and left ``.R@1.lock``;
    the locks are taken after the input is checked, inside what they guard."""
    faiss = pytest.importorskip("faiss")
    from hubless.cli.main import app

    rng = np.random.default_rng(0)
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(8))
    index.add_with_ids(unit_rows(rng, 30, 8), np.arange(30, dtype=np.int64))
    faiss.write_index(index, str(tmp_path / "f.faiss"))
    np.save(tmp_path / "b.npy", unit_rows(rng, 40, 8))
    np.save(tmp_path / "g.npy", unit_rows(rng, 30, 8))
    (tmp_path / "notes").mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for args in (
        ["attach", "f.faiss", "--query-bank", "b.npy", "-m", "bogus", "--out", "R@1"],
        ["attach", "f.faiss", "--query-bank", "missing.npy", "-m", "nnn", "--out", "side"],
        ["index", "build", "--gallery", "g.npy", "--query-bank", "b.npy", "--factory", "Bogus", "--out", "idx"],
        ["index", "build", "--gallery", "g.npy", "--query-bank", "nope.npy", "--out", "idx"],
        ["index", "add", "notes", "--embeddings", "g.npy"],
        ["index", "add", "missing-idx", "--embeddings", "g.npy"],
        ["index", "restore", "notes", "--version", "1"],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert sorted(p.name for p in tmp_path.iterdir()) == before, args
        assert list((tmp_path / "notes").iterdir()) == [], args
    result = runner.invoke(app, ["attach", "f.faiss", "--query-bank", "b.npy", "-m", "nnn:k=3", "--out", "side"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*before, "side"])  # the sidecar's lock is inside it
