"""Item images served only from the image root given at start (``hubless serve --image-root``):
a metadata ``path`` is taken relative to it; the resolved file (symlinks followed) must lie
inside it, be a regular file with an image suffix, and start with that image type's magic
bytes. Anything else is "no image" (a 404 that says nothing about the disk). The file is opened
once, without blocking (a FIFO answers 404 at once), and that descriptor is what is served."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath, PureWindowsPath

from starlette.responses import Response

__all__ = ["IMAGE_TYPES", "OpenFileResponse", "open_image"]

#: Suffix -> (content type, magic bytes at the start of the file).
IMAGE_TYPES = {
    ".jpg": ("image/jpeg", (b"\xff\xd8\xff",)),
    ".jpeg": ("image/jpeg", (b"\xff\xd8\xff",)),
    ".png": ("image/png", (b"\x89PNG\r\n\x1a\n",)),
    ".gif": ("image/gif", (b"GIF87a", b"GIF89a")),
    ".webp": ("image/webp", (b"RIFF",)),
    ".bmp": ("image/bmp", (b"BM",)),
}


def open_image(root: Path | None, name) -> tuple[int, str] | None:
    """(an open descriptor of the file, its content type) for the metadata path ``name`` under
    ``root``, or None. The caller serves that descriptor (:class:`OpenFileResponse`) and closes it.

    The path is resolved once (symlinks inside the root are followed), the resolved file opened
    with ``O_NONBLOCK | O_NOFOLLOW`` (a FIFO or device cannot block the open, a last-moment
    symlink cannot be followed), and everything is checked on the opened descriptor, so nothing
    is opened twice: a regular file (fstat), still inside the root (``/proc/self/fd`` where it
    exists), starting with the suffix's magic bytes."""
    if root is None or not isinstance(name, str) or not name or "\x00" in name or len(name) > 4096:
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
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        opened = f"/proc/self/fd/{fd}"
        if os.path.exists(opened) and not Path(os.readlink(opened)).is_relative_to(root):  # a folder swapped meanwhile
            raise OSError("outside the root")
        head = os.pread(fd, 16, 0)
        if not any(head.startswith(m) for m in magics) or (suffix == ".webp" and head[8:12] != b"WEBP"):
            raise OSError("not that image type")
    except OSError:
        os.close(fd)
        return None
    return fd, media_type


class OpenFileResponse(Response):
    """An ASGI response sending the regular file open as ``fd`` (read in a worker thread, in
    chunks, ``Content-Length`` from fstat at the start) and closing it, whatever happens."""

    chunk_size = 256 * 1024

    def __init__(self, fd: int, media_type: str, headers: dict[str, str] | None = None) -> None:
        self.fd = fd
        self.size = os.fstat(fd).st_size
        super().__init__(None, media_type=media_type, headers={**(headers or {}), "content-length": str(self.size)})

    async def __call__(self, scope, receive, send) -> None:
        from starlette.concurrency import run_in_threadpool

        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            if scope.get("method") == "HEAD" or self.size == 0:
                await send({"type": "http.response.body", "body": b""})
                return
            offset = 0
            while offset < self.size:
                data = await run_in_threadpool(os.pread, self.fd, min(self.chunk_size, self.size - offset), offset)
                offset = self.size if not data else offset + len(data)  # a file cut short ends the answer
                await send({"type": "http.response.body", "body": data, "more_body": offset < self.size})
        finally:
            os.close(self.fd)
