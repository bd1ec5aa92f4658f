"""Analysis: pure functions over pandas DataFrames, one module per question.

Never imports torch, plotly, streamlit or rich. ``analyze(path)`` runs them all and
returns an :class:`~gpudiag.analysis.result.AnalysisResult`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["analyze"]


def analyze(path: str | Path, *, workers: int | None = None) -> Any:
    """Analyse a gpudiag run directory or any directory / file(s) of profiler traces."""
    from gpudiag.analysis.pipeline import analyze as _analyze

    return _analyze(path, workers=workers)
