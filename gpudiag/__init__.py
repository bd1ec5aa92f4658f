"""gpudiag: where each step's time goes in multi-GPU PyTorch training.

Public API (imports are lazy so `import gpudiag` stays cheap and torch-free):

- ``gpudiag.load_run(path)``: a run directory as pandas DataFrames and the manifest.
- ``gpudiag.analyze(path)``: the full analysis (breakdown, comms, stragglers, findings).
- ``gpudiag.step()`` / ``with gpudiag.region(name):``: mark steps and regions in loops
  without an optimizer (no-ops when not running under ``gpudiag trace``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpudiag._version import __version__

if TYPE_CHECKING:
    from gpudiag.analysis.result import AnalysisResult

__all__ = ["__version__", "analyze", "load_run", "region", "step"]


def load_run(path: Any) -> Any:
    from gpudiag.rundir import load_run as _load_run

    return _load_run(path)


def analyze(path: str | Path, *, workers: int | None = None) -> AnalysisResult:
    from gpudiag.analysis import analyze as _analyze

    return _analyze(path, workers=workers)


def step() -> None:
    """Mark the end of a training step (for loops that do not call optimizer.step())."""
    from gpudiag.capture import api

    api.step()


def region(name: str) -> Any:
    """Context manager timing a named region of the step (recorded in regions.jsonl and
    as a profiler annotation inside the profiled window)."""
    from gpudiag.capture import api

    return api.region(name)
