"""Download the VisoGender metadata (Hall et al. 2023) from its public repository, verified.

VisoGender is distributed as two tab-separated files in github.com/oxai/visogender: the
occupation-participant (OP) and occupation-object (OO) tables with each image's occupation,
perceived gender and URL. hubless reads them with :func:`hubless.data.fairness.visogender_table`.
The files are fetched at pinned commits and checked against pinned sha256 digests, so a fetch
gives exactly the tables hubless was tested with. Licence: CC BY 4.0, for benchmarking only,
never for training (the repository's LICENCE). The images themselves are URLs only.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hubless._atomic import atomic_open
from hubless.data.fetch import download
from hubless.errors import InvalidInput, MissingFile

__all__ = ["VISOGENDER_FILES", "fetch_visogender"]

_RAW = "https://raw.githubusercontent.com/oxai/visogender"
#: file name -> (pinned raw URL, sha256 of its content)
VISOGENDER_FILES = {
    "OP_Visogender_11012024.tsv": (
        f"{_RAW}/885dc3fc985c10751b144c8c03b2e15b906aaa72/data/visogender_data/OP/OP_Visogender_11012024.tsv",
        "81019344e682f00e58b5ee3a7c7eaafbd9cd4dde22ef8cf03f952380b03f5e60",
    ),
    "OO_Visogender_10052025.tsv": (
        f"{_RAW}/ecf224b2d5c6dd9b113fef2a44ec1967c4cdaf1e/data/visogender_data/OO/OO_Visogender_10052025.tsv",
        "d5fcb91c6188ca9da147891912e5b60f5dfd07f155194fe49f9e455e7a9be003",
    ),
}


def fetch_visogender(
    dest: str | os.PathLike, *, source: str | os.PathLike | None = None, verify: bool = True, timeout: float = 60.0
) -> list[Path]:
    """Write the VisoGender TSVs to ``dest/visogender/`` and return their paths.

    ``source``: a local folder holding the two files (e.g. a clone of the repository, searched
    recursively) instead of downloading them. With ``verify`` (default), a file whose sha256
    differs from the pinned one is refused and nothing is written.
    """
    contents = {}
    for name, (url, digest) in VISOGENDER_FILES.items():
        if source is not None:
            found = sorted(Path(source).rglob(name)) if Path(source).is_dir() else []
            if not found:
                raise MissingFile(f"{name} not found under {source}")
            data = found[0].read_bytes()
        else:
            hint = f"Download {', '.join(VISOGENDER_FILES)} from github.com/oxai/visogender by hand and pass their folder with --archive"
            data = download(url, timeout, hint)
        if verify and hashlib.sha256(data).hexdigest() != digest:
            raise InvalidInput(f"{name} does not match the pinned VisoGender release (sha256 differs); pass --no-verify to use it anyway")
        contents[name] = data
    folder = Path(dest) / "visogender"
    written = []
    for name, data in contents.items():  # all verified before anything is written
        with atomic_open(folder / name, "wb") as fh:
            fh.write(data)
        written.append(folder / name)
    return written
