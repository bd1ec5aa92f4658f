"""Two analyses side by side: step time and each breakdown component, with deltas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from gpudiag.analysis.jsonable import records
from gpudiag.analysis.result import BREAKDOWN_KEYS

COMPARE_METRICS = ("step_ms_mean", "step_ms_median", "step_ms_p90", *BREAKDOWN_KEYS)


@dataclass
class Comparison:
    a: str
    b: str
    table: pd.DataFrame  # metric, a, b, delta, delta_pct
    findings_a: list[str]
    findings_b: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "metrics": records(self.table),
            "findings": {"a": self.findings_a, "b": self.findings_b},
        }


def _means(result: Any) -> dict[str, float]:
    ranks = result.ranks
    if ranks is None or ranks.empty:
        return dict.fromkeys(COMPARE_METRICS, float("nan"))
    return {m: float(ranks[m].astype(float).mean()) for m in COMPARE_METRICS if m in ranks}


def compare(a: Any, b: Any) -> Comparison:
    """Mean over ranks of each metric (ms per step) for A and B, B - A and its percentage."""
    ma, mb = _means(a), _means(b)
    rows = []
    for metric in COMPARE_METRICS:
        va, vb = ma.get(metric, float("nan")), mb.get(metric, float("nan"))
        delta = vb - va
        rows.append(
            {
                "metric": metric,
                "a": va,
                "b": vb,
                "delta": delta,
                "delta_pct": 100 * delta / va if va else float("nan"),
            }
        )
    return Comparison(
        a=str(a.source),
        b=str(b.source),
        table=pd.DataFrame(rows),
        findings_a=[f"{f.kind}:{f.severity}" for f in a.findings],
        findings_b=[f"{f.kind}:{f.severity}" for f in b.findings],
    )


__all__ = ["COMPARE_METRICS", "Comparison", "compare"]
