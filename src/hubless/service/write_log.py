"""The service's write log (an append-only audit log of writes): one JSON line per successful write (time, key,
endpoint, index, ids, status 200, client address, request id) and per refused one (status 401
or 403, no ids), appended with ``O_APPEND`` and synced before the answer is sent (``hubless
serve --audit-log FILE``). The request id is the answer's ``X-Request-ID`` header."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

__all__ = ["WriteLog"]


class WriteLog:
    """Appends write records to ``path`` (created if missing, never truncated or rewritten)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.lock = threading.Lock()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # fail at start, not at the first write
        os.close(fd)

    def record(
        self,
        *,
        key: str | None,
        method: str,
        endpoint: str,
        index: str | None,
        ids,
        status: int = 200,
        client: str | None = None,
        request_id: str | None = None,
    ) -> None:
        line = json.dumps(
            {
                "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "key": key,
                "method": method,
                "endpoint": endpoint,
                "index": index,
                "ids": ids,
                "status": status,
                "client": client,
                "request_id": request_id,
            },
            default=str,
        )
        data = (line + "\n").encode()
        with self.lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
