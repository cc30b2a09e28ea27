"""Item images served only from the image root given at start (``hubless serve --image-root``):
a metadata ``path`` is taken relative to it; the resolved file (symlinks followed) must lie
inside it, be a regular file with an image suffix, and start with that image type's magic
bytes. Anything else is "no image" (a 404 that says nothing about the disk)."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

__all__ = ["IMAGE_TYPES", "image_file"]

#: Suffix -> (content type, magic bytes at the start of the file).
IMAGE_TYPES = {
    ".jpg": ("image/jpeg", (b"\xff\xd8\xff",)),
    ".jpeg": ("image/jpeg", (b"\xff\xd8\xff",)),
    ".png": ("image/png", (b"\x89PNG\r\n\x1a\n",)),
    ".gif": ("image/gif", (b"GIF87a", b"GIF89a")),
    ".webp": ("image/webp", (b"RIFF",)),
    ".bmp": ("image/bmp", (b"BM",)),
}


def image_file(root: Path | None, name) -> tuple[Path, str] | None:
    """(the file, its content type) for the metadata path ``name`` under ``root``, or None."""
    if root is None or not isinstance(name, str) or not name or "\x00" in name:
        return None
    parts = PurePosixPath(name.replace("\\", "/"))
    if parts.is_absolute() or PureWindowsPath(name).drive or ".." in parts.parts:
        return None
    suffix = parts.suffix.lower()
    if suffix not in IMAGE_TYPES:
        return None
    try:
        real = Path(os.path.realpath(root / parts))
    except (OSError, ValueError):
        return None
    if not real.is_relative_to(root) or real.suffix.lower() != suffix:  # a symlink may not leave the root nor change type
        return None
    media_type, magics = IMAGE_TYPES[suffix]
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            head = os.read(fd, 16)
        finally:
            os.close(fd)
    except OSError:
        return None
    if not any(head.startswith(m) for m in magics) or (suffix == ".webp" and head[8:12] != b"WEBP"):
        return None
    return real, media_type
