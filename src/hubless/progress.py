"""Progress bars for long work, one convention everywhere.

``progress=True`` / ``False`` force a bar on or off; ``None`` (the default of every public
function) shows one only on a terminal and only once the work has taken a second, so short runs
and logs stay quiet. ``HUBLESS_PROGRESS=0`` turns bars off everywhere.
"""

from __future__ import annotations

import os

__all__ = ["progress_bar", "progress_enabled"]


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
    return tqdm(iterable, disable=disable, delay=1.0, leave=False, **tqdm_kwargs)
