"""Two analyses side by side: step time and each breakdown component, with deltas, the
findings that appeared, went or changed severity, and (when asked) a regression verdict."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gpudiag import rundir
from gpudiag.analysis import manifest_facts
from gpudiag.analysis.findings import Finding
from gpudiag.analysis.jsonable import records
from gpudiag.analysis.regression import RegressionVerdict, assess, paired_samples
from gpudiag.analysis.result import BREAKDOWN_KEYS, AnalysisResult

COMPARE_METRICS = ("step_ms_mean", "step_ms_median", "step_ms_p90", *BREAKDOWN_KEYS)
# A component must move by this share of A's mean step to be named as a change.
COMPONENT_CHANGE_SHARE = 0.02


@dataclass(frozen=True)
class FindingChange:
    kind: str
    a: str | None  # severity in A, None when absent
    b: str | None
    cost_a_ms: float | None
    cost_b_ms: float | None
    ranks_a: tuple[int, ...] = ()
    ranks_b: tuple[int, ...] = ()

    @property
    def change(self) -> str:
        if self.a is None:
            return "appeared"
        if self.b is None:
            return "resolved"
        moved = self.ranks_a != self.ranks_b
        if self.a != self.b:
            return "severity and ranks" if moved else "severity"
        return "ranks"


@dataclass
class Comparison:
    a: str
    b: str
    # metric, a, b (means over ranks), delta, delta_pct; a_most, a_most_rank, b_most,
    # b_most_rank: each run's rank with the most of the metric (NaN, None: steady step)
    table: pd.DataFrame
    findings_a: list[str]
    findings_b: list[str]
    finding_changes: list[FindingChange] = field(default_factory=list)
    regression: RegressionVerdict | None = None
    # what makes the two runs not comparable step for step (:func:`shape_warnings`)
    warnings: list[str] = field(default_factory=list)
    # both runs GPU (True), neither (False), one of each (None): the views name `other`
    # and `idle` for GPUs, CPUs, or by the breakdown's definitions for both
    has_gpu_trace: bool | None = False

    def changed_components(self) -> list[tuple[str, float]]:
        """Breakdown components whose ms/step moved by ≥ 2 % of A's step, largest first."""
        rows = self.table.set_index("metric")
        step_a = float(rows.loc["step_ms_mean", "a"]) if "step_ms_mean" in rows.index else 0.0
        floor = COMPONENT_CHANGE_SHARE * step_a if step_a == step_a else 0.0
        moved = [
            (metric, float(rows.loc[metric, "delta"]))
            for metric in BREAKDOWN_KEYS
            if metric in rows.index and abs(float(rows.loc[metric, "delta"])) >= max(floor, 1e-9)
        ]
        return sorted(moved, key=lambda item: -abs(item[1]))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "a": self.a,
            "b": self.b,
            "metrics": records(self.table),
            "warnings": list(self.warnings),
            "findings": {"a": self.findings_a, "b": self.findings_b},
            "changed_components": [
                {"component": name, "delta_ms": delta} for name, delta in self.changed_components()
            ],
            "finding_changes": [
                {
                    "kind": c.kind,
                    "change": c.change,
                    "a": c.a,
                    "b": c.b,
                    "cost_a_ms": c.cost_a_ms,
                    "cost_b_ms": c.cost_b_ms,
                    "ranks_a": list(c.ranks_a),
                    "ranks_b": list(c.ranks_b),
                }
                for c in self.finding_changes
            ],
        }
        if self.regression is not None:
            out["regression"] = self.regression.to_json()
        return out


def most_rank(values: pd.Series, ranks: pd.Series) -> tuple[float, int | None]:
    """The largest of ``values`` and its rank (the lowest rank on ties); NaN, None when
    none is a number."""
    v = pd.to_numeric(values, errors="coerce").astype(float).reset_index(drop=True)
    r = ranks.reset_index(drop=True)
    if v.isna().all():
        return float("nan"), None
    top = float(v.max())
    return top, int(r[v == top].astype(int).min())


def _with_int_ranks(
    frame: pd.DataFrame, rows: list[dict[str, Any]], columns: tuple[str, ...]
) -> pd.DataFrame:
    """``columns`` as whole ranks or None (a column of ints and None is float: 1.0 in
    the JSON)."""
    for column in columns:
        frame[column] = pd.Series([row[column] for row in rows], dtype=object)
    return frame


def _most(result: AnalysisResult) -> dict[str, tuple[float, int | None]]:
    """Per metric, the rank with the most of it (the mean over ranks hides a rank's 43.58
    ms of data loading as 22.02 in a 2-rank job: probe 31l, F2)."""
    ranks = result.ranks
    if ranks is None or ranks.empty or "rank" not in ranks:
        return {}
    return {m: most_rank(ranks[m], ranks["rank"]) for m in COMPARE_METRICS if m in ranks}


def _means(result: AnalysisResult) -> dict[str, float]:
    ranks = result.ranks
    if ranks is None or ranks.empty:
        return dict.fromkeys(COMPARE_METRICS, float("nan"))
    return {m: float(ranks[m].astype(float).mean()) for m in COMPARE_METRICS if m in ranks}


def _worst_by_kind(findings: list[Finding]) -> dict[str, Finding]:
    """The most costly finding of each kind (the analysis lists them in that order)."""
    worst: dict[str, Finding] = {}
    for f in findings:
        worst.setdefault(f.kind, f)
    return worst


def finding_changes(a: list[Finding], b: list[Finding]) -> list[FindingChange]:
    """Findings that appeared, went, or changed severity or the ranks they name (a
    straggler that moved from rank 2 to rank 1 is another problem, browser probe)."""
    wa, wb = _worst_by_kind(a), _worst_by_kind(b)
    changes = []
    for kind in [*wa, *(k for k in wb if k not in wa)]:
        fa, fb = wa.get(kind), wb.get(kind)
        ranks_a = tuple(sorted(int(r) for r in fa.ranks)) if fa else ()
        ranks_b = tuple(sorted(int(r) for r in fb.ranks)) if fb else ()
        same = fa is not None and fb is not None and fa.severity == fb.severity
        if same and ranks_a == ranks_b:
            continue
        changes.append(
            FindingChange(
                kind=kind,
                a=fa.severity if fa else None,
                b=fb.severity if fb else None,
                cost_a_ms=fa.cost_ms_per_step if fa else None,
                cost_b_ms=fb.cost_ms_per_step if fb else None,
                ranks_a=ranks_a,
                ranks_b=ranks_b,
            )
        )
    return changes


def shape_warnings(a: AnalysisResult, b: AnalysisResult) -> list[str]:
    """What makes two runs not comparable step for step: world size, backend, script or
    an argument that may change a step's work (each named), and ranks one of them could not analyse
    (a mean over 3 ranks against one over 4). One list for the dashboard and the CLI."""
    out = []
    if a.run.world_size != b.run.world_size:
        out.append(f"World size differs: A {a.run.world_size} ranks, B {b.run.world_size}.")
    if a.run.backend != b.run.backend:
        out.append(f"Backend differs: A {a.run.backend}, B {b.run.backend}.")
    # the device and the job, named even where neither run names a script (trace sets:
    # DLRM on V100 against Megatron on A100 had no warning at all; probe 31j, D4)
    da, db = _devices_text(a), _devices_text(b)
    if da != db:
        out.append(f"Devices differ: A {da}, B {db}.")
    sa, sb = _script_text(a), _script_text(b)
    if not sa or not sb:
        which = "Neither run names a" if not sa and not sb else f"{'A' if not sa else 'B'} names no"
        out.append(
            f"{which} script (a folder of traces): nothing shows the two run the same job, "
            "so a change here may be another model, not a change to one."
        )
    differ = _work_arguments_differ(a.run.script, b.run.script) if sa and sb else []
    if differ:
        named = ", ".join(differ[:4]) + (", ..." if len(differ) > 4 else "")
        out.append(f"Script or arguments differ ({named}): A '{sa}', B '{sb}'.")
    for name, mine in (("A", a), ("B", b)):
        missing = _ranks_not_analysed(mine)
        if missing:
            shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
            out.append(
                f"{name} analysed {len(_analysed(mine))} of its {mine.run.world_size} ranks "
                f"(rank{'s' if len(missing) > 1 else ''} {shown} not analysed, see its "
                "warnings): its means are over fewer ranks."
            )
    return out


# Arguments that change how long a run is or where it writes, not the work of a step:
# two recordings of one job that differ only in them compare step for step (probe 31h,
# D4: `--steps 60` against `--steps 1700` was "batch size among them" and never paired).
_LENGTH_OR_OUTPUT = re.compile(
    r"^-{1,2}(steps?|max[-_]?steps|num[-_]?steps|train[-_]?steps|iters?|iterations?"
    r"|max[-_]?iters?|epochs?|num[-_]?epochs|max[-_]?epochs|out|output([-_]?dir)?"
    r"|(out|report|results?)[-_]?dir|log[-_]?(dir|every|interval|freq|steps)|print[-_]?(freq|every)"
    r"|save[-_]?\w*|ckpt[-_]?\w*|checkpoint[-_]?\w*|run[-_]?name|exp[-_]?name|name|tag"
    r"|seed|wandb[-_]?\w*|quiet|verbose)$",
    re.I,
)


def _arguments(script: str | list[str] | None) -> tuple[str, dict[str, str]]:
    """The program (script, or `-m module`) and each `--flag`'s value (`--flag=v` too;
    a flag without a value is "")."""
    words = [script] if isinstance(script, str) else [str(w) for w in script or []]
    program = " ".join(words[:2]) if words[:1] == ["-m"] else (words[0] if words else "")
    rest = words[2:] if words[:1] == ["-m"] else words[1:]
    flags: dict[str, str] = {}
    positional, i = 0, 0
    while i < len(rest):
        word = rest[i]
        if word.startswith("-") and len(word) > 1 and not _number(word):
            name, sign, value = word.partition("=")
            nxt = rest[i + 1] if i + 1 < len(rest) else None
            if not sign and nxt is not None and (not nxt.startswith("-") or _number(nxt)):
                value, i = nxt, i + 1
            flags[name] = value
        else:
            positional += 1
            flags[f"argument {positional}"] = word
        i += 1
    return program, flags


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _work_arguments_differ(a: str | list[str] | None, b: str | list[str] | None) -> list[str]:
    """What differs between two runs' command lines that may change a step's work: the
    script, or an argument other than the run's length and outputs (:data:`_LENGTH_OR_OUTPUT`),
    each named as `--batch 32 vs 64`."""
    program_a, flags_a = _arguments(a)
    program_b, flags_b = _arguments(b)
    out = [f"script {program_a} vs {program_b}"] if program_a != program_b else []
    for flag in sorted(set(flags_a) | set(flags_b)):
        va, vb = flags_a.get(flag), flags_b.get(flag)
        if va != vb and not _LENGTH_OR_OUTPUT.match(flag):
            out.append(f"{flag} {_shown(va)} vs {_shown(vb)}")
    return out


def _shown(value: str | None) -> str:
    return "absent" if value is None else (value or "set")


def _shape(result: AnalysisResult) -> tuple[object, ...]:
    return (result.run.world_size, result.run.backend, result.run.has_gpu_trace)


def comparable(a: AnalysisResult | None, b: AnalysisResult | None) -> bool:
    """Two runs comparable step for step (the dashboard's default Compare partner): the
    same shape (world size, backend, GPU or not), both naming the same script and
    arguments (trace sets name none: Megatron's and DLRM's 8-rank sets were paired; issue
    31 probe), and nothing else :func:`shape_warnings` warns of (every rank analysed)."""
    return (
        a is not None
        and b is not None
        and _shape(a) == _shape(b)
        and bool(a.run.script)
        and bool(b.run.script)
        and not shape_warnings(a, b)
    )


@dataclass(frozen=True)
class RecordedShape:
    """What a run's manifest says of its shape, read without analysing it: the world
    size, backend and script with its arguments."""

    world_size: int | None
    backend: str | None
    script: str | list[str] | None


def recorded_shape(run: str | os.PathLike[str]) -> RecordedShape | None:
    """The shape a run directory's manifest records (node 0's for a job of per-node
    directories); None without a manifest (a trace set)."""
    parts = rundir.node_parts(run) or [Path(run)]
    manifest = rundir.read_json(rundir.manifest_path(parts[0]))
    if not isinstance(manifest, dict):
        return None
    world = manifest.get("world_size")
    backend = manifest.get("backend")
    return RecordedShape(
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None,
        backend=backend if isinstance(backend, str) else None,
        script=manifest_facts.script_and_arguments(manifest),
    )


def comparable_recordings(a: RecordedShape | None, b: RecordedShape | None) -> bool:
    """Two runs comparable step for step by what their manifests record: the same world
    size and backend, both naming a script, and no argument that changes a step's work
    differing (:func:`_work_arguments_differ`). The dashboard's default Compare partner,
    decided from the runs' own files, so it is the same whichever runs were analysed
    (probe N8: it changed with the analysis cache)."""
    return (
        a is not None
        and b is not None
        and a.world_size is not None
        and a.world_size == b.world_size
        and a.backend == b.backend
        and bool(a.script)
        and bool(b.script)
        and not _work_arguments_differ(a.script, b.script)
    )


def _devices_text(result: AnalysisResult) -> str:
    """``CPU only`` or the GPUs the traces name (``Tesla V100-SXM2-32GB``)."""
    if not result.run.has_gpu_trace:
        return "CPU only"
    names = sorted({str(d) for d in result.run.devices or [] if str(d).lower() != "cpu"})
    return ", ".join(names) if names else "GPU (model not recorded)"


def _script_text(result: AnalysisResult) -> str:
    script = result.run.script
    if isinstance(script, list):
        return " ".join(str(s) for s in script)
    return str(script or "")


def _analysed(result: AnalysisResult) -> set[int]:
    ranks = result.ranks
    if ranks is None or ranks.empty or "rank" not in ranks:
        return set()
    return {int(r) for r in ranks["rank"]}


def _ranks_not_analysed(result: AnalysisResult) -> list[int]:
    world = result.run.world_size or 0
    analysed = _analysed(result)
    if not analysed or world <= len(analysed):
        return []
    return [r for r in range(world) if r not in analysed]


def compare(
    a: AnalysisResult, b: AnalysisResult, *, regression_threshold_pct: float | None = None
) -> Comparison:
    """Mean over ranks of each metric (ms per step) for A and B, B - A and its percentage.

    With ``regression_threshold_pct``, also judge whether B's step time is slower than A's
    by more than that (regression.assess; raises regression.NotEnoughSteps)."""
    ma, mb = _means(a), _means(b)
    metrics: tuple[str, ...] = COMPARE_METRICS
    steady_a, steady_b = a.run.steady_step_ms, b.run.steady_step_ms
    if steady_a is not None and steady_b is not None:
        # the step every share of `analyze` is of, first: the rows below are the profiled
        # window's (big_fp32 against big_bf16: 13.95 -> 2.73 steady, 14.02 -> 3.78 window)
        ma["steady_step_ms"], mb["steady_step_ms"] = steady_a, steady_b
        metrics = ("steady_step_ms", *COMPARE_METRICS)
    most_a, most_b = _most(a), _most(b)
    none: tuple[float, int | None] = (float("nan"), None)
    rows = []
    for metric in metrics:
        va, vb = ma.get(metric, float("nan")), mb.get(metric, float("nan"))
        delta = vb - va
        rows.append(
            {
                "metric": metric,
                "a": va,
                "b": vb,
                "delta": delta,
                "delta_pct": 100 * delta / va if va else float("nan"),
                "a_most": most_a.get(metric, none)[0],
                "a_most_rank": most_a.get(metric, none)[1],
                "b_most": most_b.get(metric, none)[0],
                "b_most_rank": most_b.get(metric, none)[1],
            }
        )
    verdict = None
    if regression_threshold_pct is not None:
        verdict = assess(*paired_samples(a, b), regression_threshold_pct)
    return Comparison(
        a=str(a.source),
        b=str(b.source),
        table=_with_int_ranks(pd.DataFrame(rows), rows, ("a_most_rank", "b_most_rank")),
        findings_a=[f"{f.kind}:{f.severity}" for f in a.findings],
        findings_b=[f"{f.kind}:{f.severity}" for f in b.findings],
        finding_changes=finding_changes(a.findings, b.findings),
        regression=verdict,
        warnings=shape_warnings(a, b),
        has_gpu_trace=(
            bool(a.run.has_gpu_trace)
            if bool(a.run.has_gpu_trace) == bool(b.run.has_gpu_trace)
            else None
        ),
    )


__all__ = [
    "COMPARE_METRICS",
    "Comparison",
    "FindingChange",
    "RecordedShape",
    "comparable_recordings",
    "compare",
    "finding_changes",
    "recorded_shape",
    "shape_warnings",
]
