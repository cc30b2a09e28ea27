"""Progress bars for long work, one convention everywhere.

``progress=True`` / ``False`` force a bar on or off; ``None`` (the default of every public
function) shows one only on a terminal and only once the work has taken a second, so short runs
and logs stay quiet. ``HUBLESS_PROGRESS=0`` turns bars off everywhere. Work with steps to count
gets a bar (:func:`progress_bar`, tqdm on stderr); a stage with none (writing a report, loading
a model) a one-line spinner saying what it does (:func:`stage`, rich on stderr).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

__all__ = ["progress_bar", "progress_enabled", "stage"]

#: Seconds a piece of work runs before its bar or spinner appears.
DELAY = 1.0


def progress_enabled(progress: bool | None) -> bool | None:
    """Resolve a ``progress`` argument: True/False force it; None means "only on a terminal".

    ``HUBLESS_PROGRESS=0`` turns bars off everywhere. The returned value is tqdm's ``disable``
    convention inverted: None lets tqdm disable itself when stderr is not a TTY.
    """
    if os.environ.get("HUBLESS_PROGRESS", "").strip() in {"0", "false", "no", "off"}:
        return False
    return progress


def progress_bar(iterable, progress: bool | None, **tqdm_kwargs):
    """Wrap ``iterable`` in a tqdm bar per the ``progress`` convention of :func:`progress_enabled`
    (None: only on a terminal, and only once the work has taken a second). With ``iterable``
    None, a bar to ``update`` by hand (give ``total``)."""
    from tqdm.auto import tqdm  # imported only when work starts: keeps start-up fast

    show = progress_enabled(progress)
    disable = True if show is False else (None if show is None else False)
    return tqdm(iterable, disable=disable, delay=DELAY, leave=False, **tqdm_kwargs)


@contextlib.contextmanager
def stage(description: str, progress: bool | None) -> Iterator[None]:
    """While the block runs, a spinner on stderr saying ``description``, by the convention of :func:`progress_enabled` (None: only on a terminal, and only once the block
    has taken a second); gone when the block ends."""
    show = progress_enabled(progress)
    if show is False:
        yield
        return
    from rich.console import Console

    console = Console(stderr=True)
    if show is None and not console.is_terminal:
        yield
        return
    status = console.status(f"{description} ...", spinner="line")
    timer = threading.Timer(DELAY, status.start)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # started or not: stop() below is the last word
        status.stop()
