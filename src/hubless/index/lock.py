"""One writer at a time per saved index: an advisory file lock beside the index directory.

Every command or service that changes a saved index (``hubless index add/remove``, the HTTP
service's writes, a re-save) holds :func:`write_lock` from reading the index it updates until
its new version is in place, so two writers never both start from the same version and one
batch is never silently lost. Readers take no lock: a save is one atomic switch, so they always
see a complete version.

The lock is ``fcntl.flock`` on ``.<name>.lock`` in the index's parent directory (a sibling,
so it survives the index directory being replaced). The kernel releases it when the holder
exits, also on ``kill -9``: there are no stale locks. A second writer waits up to ``timeout``
seconds (``HUBLESS_LOCK_TIMEOUT``, default 60) and then fails with :class:`IndexLockedError`.
POSIX only; on other systems the lock is a no-op.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hubless.errors import Busy, InvalidInput

__all__ = ["IndexLockedError", "lock_path", "lock_timeout", "wait_for_lock", "write_lock"]

fcntl: Any
try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

DEFAULT_TIMEOUT = 60.0


class IndexLockedError(Busy):
    """Another writer held the lock of an index (or of an exported store) for longer than the timeout."""


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file of the index directory ``path``: ``.<name>.lock`` beside it."""
    path = Path(path).absolute()
    return path.with_name(f".{path.name}.lock")


def lock_timeout(timeout: float | None = None) -> float:
    """Seconds a writer waits for a lock: ``timeout``, else ``HUBLESS_LOCK_TIMEOUT``, else 60."""
    if timeout is not None:
        return float(timeout)
    value = os.environ.get("HUBLESS_LOCK_TIMEOUT")
    if value is None:
        return DEFAULT_TIMEOUT
    try:
        return float(value)
    except ValueError:
        raise InvalidInput(f"HUBLESS_LOCK_TIMEOUT must be a number of seconds, got {value!r}") from None


@contextlib.contextmanager
def write_lock(path: str | os.PathLike, *, timeout: float | None = None) -> Iterator[Path]:
    """Hold the exclusive write lock of the index directory ``path`` (waits up to ``timeout`` s)."""
    file = lock_path(path)
    if fcntl is None:  # pragma: no cover - not POSIX
        yield file
        return
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o666)

    def try_lock() -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    try:
        wait_for_lock(try_lock, f"{Path(path)} is being written by another process (lock {file} held", timeout)
        yield file
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def wait_for_lock(try_lock: Callable[[], bool], held: str, timeout: float | None = None) -> None:
    """Call ``try_lock()`` (True once the lock is taken) every 50 ms until it succeeds, for at
    most ``timeout`` s (:func:`lock_timeout`); then raise :class:`IndexLockedError` saying
    ``held`` "for more than N s"."""
    wait = lock_timeout(timeout)
    deadline = time.monotonic() + wait
    while not try_lock():
        if time.monotonic() >= deadline:
            raise IndexLockedError(f"{held} for more than {wait:g} s); retry later or raise HUBLESS_LOCK_TIMEOUT")
        time.sleep(0.05)
