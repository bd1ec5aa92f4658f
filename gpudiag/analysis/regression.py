"""Is NEW's step time slower than BASE's by more than a threshold, with confidence?

The samples are per-step job times: for each step, the slowest rank's duration (a
synchronous job waits for it). They come from the run tables, which hold every step of the
run, when both inputs have them; otherwise from the analysed (profiled) steps of the
breakdown. The first steps of a run (start-up, allocator and bucket rebuilds) are left out.

The statistic is the change of the median step time, NEW / BASE − 1, with a percentile
bootstrap confidence interval; a one-sided Mann-Whitney test of NEW against BASE scaled by
the threshold is reported beside it. A regression is declared only when the interval's
lower bound is above the threshold: on a noisy machine the gate says less rather than fail
a build that did not get slower.

Host load: where both run tables carry the training threads' run-queue wait (runq_ns:
runnable, waiting for a CPU that other processes held), the same statistic is also taken
on each step net of the largest such wait of any rank in it. A change the host's load
explains (raw interval above the threshold, net one not) is not declared a regression, and
the verdict says how much longer NEW's ranks waited for a CPU (``load_explains``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpudiag.analysis.result import AnalysisResult

MIN_STEPS = 5
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 4000


class NotEnoughSteps(ValueError):
    """One input has too few steps to judge a change (one-line message)."""


@dataclass(frozen=True)
class StepSample:
    """Per-step job times in ms, and where they came from (for the report)."""

    ms: np.ndarray
    source: str
    # per step (aligned with ms): the largest run-queue wait of any rank's training
    # thread in that step, ms; None where the run tables have no scheduler counters
    cpu_wait_ms: np.ndarray | None = None


@dataclass(frozen=True)
class RegressionVerdict:
    threshold_pct: float
    confidence: float
    base_median_ms: float
    new_median_ms: float
    change_pct: float
    ci_low_pct: float
    ci_high_pct: float
    mann_whitney_p: float
    base_steps: int
    new_steps: int
    base_source: str
    new_source: str
    # the same statistic net of each step's CPU wait (module docstring); None without
    # scheduler counters in both inputs
    net_change_pct: float | None = None
    net_ci_low_pct: float | None = None
    # NEW's median per-step CPU wait minus BASE's, ms
    cpu_wait_change_ms: float | None = None

    @property
    def regressed(self) -> bool:
        if self.ci_low_pct <= self.threshold_pct:
            return False
        return self.net_ci_low_pct is None or self.net_ci_low_pct > self.threshold_pct

    @property
    def load_explains(self) -> bool:
        """Slower beyond the threshold, but not once the CPU wait is set apart."""
        return self.ci_low_pct > self.threshold_pct and not self.regressed

    def to_json(self) -> dict[str, object]:
        return {
            "regressed": self.regressed,
            "threshold_pct": self.threshold_pct,
            "confidence": self.confidence,
            "base_median_ms": self.base_median_ms,
            "new_median_ms": self.new_median_ms,
            "change_pct": self.change_pct,
            "ci_low_pct": self.ci_low_pct,
            "ci_high_pct": self.ci_high_pct,
            "mann_whitney_p": self.mann_whitney_p,
            "base_steps": self.base_steps,
            "new_steps": self.new_steps,
            "base_source": self.base_source,
            "new_source": self.new_source,
            "net_change_pct": self.net_change_pct,
            "net_ci_low_pct": self.net_ci_low_pct,
            "cpu_wait_change_ms": self.cpu_wait_change_ms,
            "load_explains": self.load_explains,
        }


def warmup_steps(n_steps: int) -> int:
    """Steps left out at the start: the first one always (start-up), 10 % of long runs."""
    return max(1, n_steps // 10) if n_steps >= 3 else 0


def job_step_ms(steps: pd.DataFrame, duration_ms: pd.Series) -> np.ndarray:
    """For each step number, the slowest rank's time, in step order, warm-up dropped."""
    frame = pd.DataFrame({"step": steps["step"].to_numpy(), "ms": duration_ms.to_numpy()})
    frame = frame[np.isfinite(frame["ms"].astype(float)) & (frame["ms"] > 0)]
    per_step = frame.groupby("step", sort=True)["ms"].max().to_numpy(dtype=float)
    return per_step[warmup_steps(len(per_step)) :]


def sample_from_run_steps(steps: pd.DataFrame) -> StepSample | None:
    """Every step of the run tables (start_ns/end_ns per rank and step), or None; with
    each step's largest training-thread run-queue wait where runq_ns was recorded."""
    if steps is None or steps.empty or not {"start_ns", "end_ns"} <= set(steps.columns):
        return None
    s = steps.dropna(subset=["start_ns", "end_ns"])
    frame = pd.DataFrame(
        {
            "step": s["step"].to_numpy(),
            "ms": (s["end_ns"].astype(float) - s["start_ns"].astype(float)).to_numpy() / 1e6,
            "wait": _runq_ms(s),
        }
    )
    frame = frame[np.isfinite(frame["ms"]) & (frame["ms"] > 0)]
    per_step = frame.groupby("step", sort=True).agg(ms=("ms", "max"), wait=("wait", "max"))
    per_step = per_step.iloc[warmup_steps(len(per_step)) :]
    if per_step.empty:
        return None
    wait = per_step["wait"].to_numpy(dtype=float)
    return StepSample(
        per_step["ms"].to_numpy(dtype=float),
        f"run tables, {len(per_step)} steps",
        wait if np.isfinite(wait).all() else None,
    )


def _runq_ms(steps: pd.DataFrame) -> np.ndarray:
    if "runq_ns" not in steps:
        return np.full(len(steps), np.nan)
    return pd.to_numeric(steps["runq_ns"], errors="coerce").to_numpy(dtype=float) / 1e6


def sample_from_breakdown(breakdown: pd.DataFrame) -> StepSample | None:
    """The analysed (profiled) steps of the breakdown table, or None."""
    if breakdown is None or breakdown.empty:
        return None
    ms = job_step_ms(breakdown, breakdown["step_ms"].astype(float))
    return StepSample(ms, f"profiled steps, {len(ms)} steps") if len(ms) else None


def paired_samples(base: AnalysisResult, new: AnalysisResult) -> tuple[StepSample, StepSample]:
    """Both from the run tables when both have them (every step), else both from the
    analysed steps, so the two samples always measure the same thing."""
    from_tables = (sample_from_run_steps(base.run_steps), sample_from_run_steps(new.run_steps))
    if from_tables[0] is not None and from_tables[1] is not None:
        return from_tables[0], from_tables[1]
    empty = StepSample(np.empty(0), "no steps")
    return (
        sample_from_breakdown(base.breakdown) or empty,
        sample_from_breakdown(new.breakdown) or empty,
    )


def _average_ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    _, first, counts = np.unique(sorted_values, return_index=True, return_counts=True)
    average = first + (counts + 1) / 2.0  # 1-based average rank of each tie group
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(average, counts)
    return ranks


def mann_whitney_greater(new: np.ndarray, base: np.ndarray) -> float:
    """One-sided p-value that NEW tends to be larger than BASE (normal approximation
    with tie correction; the samples here have tens to thousands of steps)."""
    n1, n2 = len(new), len(base)
    both = np.concatenate([new, base])
    ranks = _average_ranks(both)
    u = ranks[:n1].sum() - n1 * (n1 + 1) / 2.0
    _, counts = np.unique(both, return_counts=True)
    n = n1 + n2
    tie_term = float((counts**3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    if sigma == 0:
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / sigma  # continuity correction
    return 0.5 * math.erfc(z / math.sqrt(2))


def bootstrap_change_pct(
    base: np.ndarray, new: np.ndarray, confidence: float, resamples: int, seed: int
) -> tuple[float, float]:
    """Percentile bootstrap interval of the change of the median, in percent."""
    rng = np.random.default_rng(seed)
    base_medians = np.median(rng.choice(base, size=(resamples, len(base))), axis=1)
    new_medians = np.median(rng.choice(new, size=(resamples, len(new))), axis=1)
    changes = 100.0 * (new_medians / base_medians - 1.0)
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(changes, [tail, 100.0 - tail])
    return float(low), float(high)


def assess(
    base: StepSample,
    new: StepSample,
    threshold_pct: float,
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> RegressionVerdict:
    """Judge NEW against BASE. Raises NotEnoughSteps when either has < MIN_STEPS steps."""
    for name, sample in (("BASE", base), ("NEW", new)):
        if len(sample.ms) < MIN_STEPS:
            raise NotEnoughSteps(
                f"{name} has {len(sample.ms)} steps after warm-up ({sample.source}); "
                f"at least {MIN_STEPS} are needed to judge a regression"
            )
    base_median, new_median = float(np.median(base.ms)), float(np.median(new.ms))
    low, high = bootstrap_change_pct(base.ms, new.ms, confidence, resamples, seed)
    net = _net_of_cpu_wait(base, new, confidence, resamples, seed)
    return RegressionVerdict(
        threshold_pct=threshold_pct,
        confidence=confidence,
        base_median_ms=base_median,
        new_median_ms=new_median,
        change_pct=100.0 * (new_median / base_median - 1.0),
        ci_low_pct=low,
        ci_high_pct=high,
        mann_whitney_p=mann_whitney_greater(new.ms, base.ms * (1.0 + threshold_pct / 100.0)),
        base_steps=len(base.ms),
        new_steps=len(new.ms),
        base_source=base.source,
        new_source=new.source,
        net_change_pct=net[0] if net else None,
        net_ci_low_pct=net[1] if net else None,
        cpu_wait_change_ms=net[2] if net else None,
    )


def _net_of_cpu_wait(
    base: StepSample, new: StepSample, confidence: float, resamples: int, seed: int
) -> tuple[float, float, float] | None:
    """(change %, its interval's lower bound %, CPU wait change ms) of the steps net of
    their CPU wait, or None where either sample has no wait (or a step left nothing)."""
    if base.cpu_wait_ms is None or new.cpu_wait_ms is None:
        return None
    base_net, new_net = base.ms - base.cpu_wait_ms, new.ms - new.cpu_wait_ms
    if not ((base_net > 0).all() and (new_net > 0).all()):
        return None
    change = 100.0 * (float(np.median(new_net)) / float(np.median(base_net)) - 1.0)
    low, _ = bootstrap_change_pct(base_net, new_net, confidence, resamples, seed)
    wait_change = float(np.median(new.cpu_wait_ms) - np.median(base.cpu_wait_ms))
    return change, low, wait_change


__all__ = [
    "MIN_STEPS",
    "NotEnoughSteps",
    "RegressionVerdict",
    "StepSample",
    "assess",
    "mann_whitney_greater",
    "paired_samples",
    "sample_from_breakdown",
    "sample_from_run_steps",
]
