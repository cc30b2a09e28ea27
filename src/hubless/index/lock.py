"""One writer at a time per saved index: an advisory file lock inside the directory it guards.

Every command or service that changes a saved index (``hubless index add/remove``, the HTTP
service's writes, a re-save) holds :func:`write_lock` from reading the index it updates until
its new version is in place, so two writers never both start from the same version and one
batch is never silently lost. Readers take no lock: a save is one atomic switch, so they always
see a complete version. An attached collection's sidecar and a store kept in a local directory
are guarded the same way.

The lock is ``fcntl.flock`` on the file :data:`LOCK_FILE` inside the directory, found through
the directory's resolved path (``Path.resolve()``), so a writer that names the directory
through a symlink takes the same lock. Nothing is ever written beside the directory, and the
lock file is there only while a writer holds it: the holder removes it before releasing it,
and a writer that was waiting on the removed file takes the one made after it (the file it
locked is checked to be the one at the path). A writer that creates the directory
(``create=True``) makes it and, when its write leaves nothing in it, removes it again. The
kernel releases the lock when the holder exits, also on ``kill -9`` (which leaves an empty,
unlocked file behind, taken by the next writer): there are no stale locks. A second writer waits up to ``timeout`` seconds (``HUBLESS_LOCK_TIMEOUT``, default
60) and then fails with :class:`IndexLockedError`. Callers validate their input before taking
the lock, so a refused call makes no lock file. POSIX only; on other systems the lock is a
no-op.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hubless.errors import Busy, InvalidInput, MissingFile

__all__ = ["LOCK_FILE", "IndexLockedError", "lock_path", "lock_timeout", "wait_for_lock", "write_lock"]

fcntl: Any
try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None

DEFAULT_TIMEOUT = 60.0
#: The lock file's name inside the directory it guards (empty; there while a writer holds it).
LOCK_FILE = ".hubless-lock"


class IndexLockedError(Busy):
    """Another writer held the lock of an index (or of an exported store) for longer than the timeout."""


def lock_path(directory: str | os.PathLike, name: str = LOCK_FILE) -> Path:
    """The lock file of ``directory``: ``name`` inside it, the directory's path resolved."""
    return Path(directory).resolve() / name


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
def write_lock(
    directory: str | os.PathLike, *, timeout: float | None = None, create: bool = False, name: str = LOCK_FILE
) -> Iterator[Path]:
    """Hold the exclusive write lock of ``directory`` (waits up to ``timeout`` s): the file
    ``name`` inside it, removed on leaving. A missing directory is made with ``create`` (and
    removed again on leaving, with the folders made for it, if the write left it empty), else a
    :class:`~hubless.errors.MissingFile`. Yields the lock file's path."""
    file = lock_path(directory, name)
    wait = lock_timeout(timeout)
    if fcntl is None:  # pragma: no cover - not POSIX
        yield file
        return
    deadline, left = time.monotonic() + wait, wait
    held = f"{Path(directory)} is being written by another process (lock {file} held"
    while True:
        made = _make_directory(file.parent, create)
        try:
            fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o666)
        except FileNotFoundError:  # the directory was removed meanwhile (by a creator whose write failed)
            continue
        try:
            wait_for_lock(functools.partial(_try_lock, fd), held, left)
        except BaseException:
            os.close(fd)
            raise
        if _is_file(fd, file):
            break
        os.close(fd)  # locked a file removed since it was opened: take the one there now
        left = max(deadline - time.monotonic(), 0.0)
    try:
        yield file
    finally:
        with contextlib.suppress(OSError):
            file.unlink()  # held: a writer waiting on this file takes the next one (_is_file)
            for folder in made:
                folder.rmdir()  # the folders made for the lock, unless the write filled them
        os.close(fd)  # closing the descriptor releases the lock


def _make_directory(folder: Path, create: bool) -> list[Path]:
    """Make ``folder`` if missing (``create``; else MissingFile); the folders made, deepest first."""
    if folder.is_dir():
        return []
    if folder.exists():
        raise InvalidInput(f"{folder} is not a directory")
    if not create:
        raise MissingFile(f"no such directory: {folder}")
    missing = [folder, *(p for p in folder.parents if not p.exists())]
    made = []
    for path in reversed(missing):
        try:
            path.mkdir()
            made.append(path)
        except FileExistsError:
            pass
    return made[::-1]


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _is_file(fd: int, file: Path) -> bool:
    """Whether the open descriptor ``fd`` is the file at ``file`` now (not one removed since)."""
    try:
        now = os.stat(file)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


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
