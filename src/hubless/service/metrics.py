"""Request counts and latency per endpoint, in Prometheus text format (``GET /metrics``)."""

from __future__ import annotations

import threading
from collections import defaultdict

__all__ = ["Metrics"]


class Metrics:
    """Request counts and latency per endpoint and status, in Prometheus text format."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count: dict[tuple[str, int], int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def add(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            self.count[(endpoint, status)] += 1
            self.seconds[endpoint] += seconds

    def text(self) -> str:
        with self.lock:
            lines = ["# HELP hubless_requests_total Requests served.", "# TYPE hubless_requests_total counter"]
            lines += [f'hubless_requests_total{{endpoint="{e}",status="{s}"}} {n}' for (e, s), n in sorted(self.count.items())]
            lines += ["# HELP hubless_request_seconds_total Time spent serving requests.", "# TYPE hubless_request_seconds_total counter"]
            lines += [f'hubless_request_seconds_total{{endpoint="{e}"}} {t:.6f}' for e, t in sorted(self.seconds.items())]
        return "\n".join(lines) + "\n"
