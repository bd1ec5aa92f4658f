"""``gpudiag.step()`` and ``gpudiag.region(name)`` for loops without an optimizer.

Both are no-ops outside ``gpudiag trace`` (no tracker installed), so a script can keep
the calls when it runs bare.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpudiag.capture.steps import StepTracker

_tracker: StepTracker | None = None


def install(tracker: StepTracker | None) -> None:
    global _tracker
    _tracker = tracker


def step() -> None:
    """End the current step now. The first call switches this rank to API-driven steps:
    optimizer.step() no longer marks step boundaries."""
    if _tracker is not None:
        _tracker.api_step()


@contextlib.contextmanager
def region(name: str) -> Iterator[None]:
    """Time a named region: one regions.jsonl row, plus a profiler annotation."""
    tracker = _tracker
    if tracker is None:
        yield
        return
    from torch.autograd.profiler import record_function

    start_ns = time.time_ns()
    try:
        with record_function(name):
            yield
    finally:
        tracker.record_region(name, start_ns, time.time_ns())
