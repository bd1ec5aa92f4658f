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

    label = region_label(name)
    start_ns = time.time_ns()
    try:
        with record_function(label):
            yield
    finally:
        tracker.record_region(label, start_ns, time.time_ns())


# The longest region name kept (the rest is cut): torch and the run's tables take any.
MAX_REGION_NAME = 200


def region_label(name: object) -> str:
    """The name as the profiler and the run's tables can take it, whatever the script
    passed: untraced, ``region`` ignores its argument, so traced it must not raise
    either (None, a number, a name with a lone surrogate: issue 28 probe)."""
    text = name if isinstance(name, str) else str(name)
    return text.encode("utf-8", "replace").decode("utf-8")[:MAX_REGION_NAME]
