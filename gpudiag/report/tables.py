"""Tables shared by the HTML report and the dashboard (presentation only)."""

from __future__ import annotations

import pandas as pd

from gpudiag.analysis.whatif import Projection


def whatif_frame(projections: list[Projection]) -> pd.DataFrame:
    """One row per projected fix: the same numbers as `gpudiag whatif` and the JSON."""
    return pd.DataFrame(
        {
            "fix": [p.scenario for p in projections],
            "finding": [p.finding_kind for p in projections],
            "ranks": [", ".join(map(str, p.ranks)) or "all" for p in projections],
            "step ms": [round(p.step_ms, 2) for p in projections],
            "projected ms": [round(p.projected_step_ms, 2) for p in projections],
            "range ms": [
                f"{p.projected_low_ms:.2f}–{p.projected_high_ms:.2f}" for p in projections
            ],
            "saving ms": [round(p.saving_ms, 2) for p in projections],
            "saving %": [round(p.saving_pct, 1) for p in projections],
            "assumptions": ["; ".join(p.assumptions) for p in projections],
        }
    )


__all__ = ["whatif_frame"]
