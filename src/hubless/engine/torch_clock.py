"""Seconds of a torch device's work, measured without making the host wait at each mark: the
ranking pass (:mod:`hubless.engine.torch_ranking`) charges each ranking its own seconds."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from hubless.engine.torch_arrays import torch_module

__all__ = ["Stopwatch"]


class Stopwatch:
    """Seconds of a device's work between marks, without waiting for the device at each mark
    (a wait per ranking and block would leave the GPU idle while the host queues the next
    work): on CUDA a mark is an event recorded on the device's stream and the seconds are read
    once the work is done (:meth:`seconds`); elsewhere a mark is the host clock, which the work
    is done by when it returns."""

    def __init__(self, dev) -> None:
        self.torch, self.dev = torch_module(), dev

    def mark(self) -> Any:
        if self.dev.type != "cuda":
            return time.perf_counter()
        event = self.torch.cuda.Event(enable_timing=True)
        event.record(self.torch.cuda.current_stream(self.dev))
        return event

    def seconds(self, intervals: Sequence[tuple[Any, Any, float]]) -> float:
        """The summed seconds of (start, end, share) marks, each interval's seconds times its
        share (waits for the device's work to end)."""
        if self.dev.type != "cuda":
            return float(sum((end - start) * share for start, end, share in intervals))
        self.torch.cuda.synchronize(self.dev)
        return sum(start.elapsed_time(end) * share for start, end, share in intervals) / 1000.0
