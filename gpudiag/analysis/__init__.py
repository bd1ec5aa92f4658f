"""Analysis: pure functions over pandas DataFrames, one module per question.

Never imports torch, plotly, streamlit or rich. ``analyze(path)`` runs them all and
returns an :class:`~gpudiag.analysis.result.AnalysisResult`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the package import stays light: result.py pulls in pandas
    from gpudiag.analysis.ingest import RunTasks
    from gpudiag.analysis.result import AnalysisResult

__all__ = ["analyze"]


def analyze(
    path: str | Path | list[Path],
    *,
    workers: int | None = None,
    run_tasks: RunTasks | None = None,
) -> AnalysisResult:
    """Analyse a gpudiag run directory or any directory / file(s) of profiler traces; a
    list: the per-node directories of one multi-node job. ``run_tasks``
    (gpudiag.analysis.dask_tasks.connect) runs the per-rank part on a Dask cluster instead
    of the local process pool."""
    from gpudiag.analysis.pipeline import analyze as _analyze

    return _analyze(path, workers=workers, run_tasks=run_tasks)
