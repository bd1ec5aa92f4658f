"""AnalysisResult: every analysis of a run (or of a directory of profiler traces)
gathered into one object, with a stable JSON form (docs/json-schema.md).

:func:`gpudiag.analysis.analyze` (gpudiag/analysis/pipeline.py) builds it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from gpudiag.analysis.dataloader import DataLoaderResult
from gpudiag.analysis.dataparallel import DataParallelResult
from gpudiag.analysis.findings import Finding
from gpudiag.analysis.gpu import GpuResult
from gpudiag.analysis.jsonable import plain, record_rows, records, whole
from gpudiag.analysis.spill import SpilledTable
from gpudiag.analysis.timeline import LANES, TIMELINE_COLUMNS, timeline
from gpudiag.analysis.whatif import Projection

if TYPE_CHECKING:  # annotations only: the analysis does not load the linter
    from gpudiag.lint.report import LintReport

__all__ = [
    "BREAKDOWN_COLUMNS",
    "BREAKDOWN_KEYS",
    "LANES",
    "MAX_TIMELINE_RANKS",
    "RANK_COLUMNS",
    "SCHEMA_VERSION",
    "TIMELINE_COLUMNS",
    "AnalysisInputError",
    "AnalysisResult",
    "RunInfo",
    "SpilledTable",
    "plain",
    "records",
]

SCHEMA_VERSION = 1
BREAKDOWN_KEYS = ("compute", "comm_overlapped", "comm_exposed", "data_loading", "idle", "other")
RANK_COLUMNS = ("rank", "steps", "step_ms_mean", "step_ms_median", "step_ms_p90", *BREAKDOWN_KEYS)
BREAKDOWN_COLUMNS = ("rank", "step", "step_ms", *BREAKDOWN_KEYS)
# Ranks the Timeline draws when none are named (the HTML report, the dashboard with every
# rank chosen): the lanes of thousands of ranks can be neither drawn nor read.
MAX_TIMELINE_RANKS = 32
# Ranks taken from each finding for the Timeline (one naming every rank must not fill it).
_RANKS_PER_FINDING = 4


class AnalysisInputError(ValueError):
    """Nothing analysable at the given path (one-line message naming it). ``warnings``
    holds the one-line reasons for each file that could not be read."""

    def __init__(self, message: str, warnings: list[str] | None = None) -> None:
        super().__init__(message)
        self.warnings = list(warnings or [])


# The names of a step's all-reduces (RunInfo.allreduce_label): DDP's gradient buckets
# only where the run shows DDP (issue 31, D: Megatron's tensor-parallel all-reduces were
# called buckets).
ALLREDUCE_LABEL_DDP = "DDP gradient buckets"
ALLREDUCE_LABEL = "all-reduce calls"


@dataclass(frozen=True)
class RunInfo:
    """The facts of the run analysed (docs/json-schema.md, ``run``)."""

    kind: str  # "gpudiag_run" | "traces" | "summaries"
    path: str
    world_size: int | None
    backend: str | None
    devices: list[str]
    ranks_present: list[int]
    traced_ranks: list[int]
    steps_analysed: int
    status: str | None  # the manifest's status
    exit_code: int | None
    has_gpu_trace: bool = False
    script: str | list[str] | None = None
    total_steps: int | None = None  # rows of the run's steps table
    rank_statuses: dict[str, int] | None = None  # summaries only
    synthetic: bool | None = None  # summaries only
    # From the manifest's hosts and environment (not in the JSON "run" object): the
    # scaling model's oversubscription (gpudiag/analysis/scaling.py).
    nodes: int | None = None
    cores_per_node: int | None = None  # the smallest host's os.cpu_count()
    threads_per_rank: int | None = None  # OMP_NUM_THREADS when the run set it
    # Median step over every step the run recorded after warm-up (steady.py); the base of
    # every share and severity. None for foreign traces (no steps table).
    steady_step_ms: float | None = None
    # how many steps that median is over, and how many warm-up steps it left out
    steady_steps: int | None = None
    warmup_steps: int | None = None
    # "host": the median of the host's step times; "gpu": the GPU's median busy time per
    # profiled step, longer (the host ran ahead of the GPU: steady.gpu_bounded_step_ms)
    steady_step_basis: str | None = None
    # What says the run's all-reduces are DDP's gradient buckets (analysis/ddp.py:
    # DDP's logging data, or its record_function names in a trace); None: no evidence of
    # DDP, and they are called all-reduce calls (a Megatron tensor-parallel run's).
    ddp_evidence: str | None = None

    @property
    def allreduce_label(self) -> str:
        """The name every view gives the all-reduces of a step (:attr:`ddp_evidence`)."""
        return ALLREDUCE_LABEL_DDP if self.ddp_evidence else ALLREDUCE_LABEL

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        order = (
            "kind", "path", "world_size", "backend", "devices", "ranks_present",
            "traced_ranks", "steps_analysed", "steady_step_ms", "steady_steps", "warmup_steps",
            "steady_step_basis", "has_gpu_trace", "status",
            "exit_code", "script", "total_steps", "rank_statuses", "synthetic", "ddp_evidence",
        )  # fmt: skip
        return {
            k: out[k]
            for k in order
            if k not in ("rank_statuses", "synthetic") or out[k] is not None
        }


@dataclass
class AnalysisResult:
    source: Path
    run: RunInfo
    ranks: pd.DataFrame
    breakdown: pd.DataFrame
    # Per collective call of every rank (a many-rank run's: millions of rows), kept in
    # the analysis' spill file: read with .frame(columns, rows), the columns and rows a
    # view needs (comms.TABLE_COLUMNS; comms.ddp_buckets'; stragglers.SKEW_COLUMNS)
    collectives: SpilledTable
    collective_summary: pd.DataFrame
    buckets: SpilledTable
    skew: SpilledTable
    stragglers: pd.DataFrame
    dataparallel: DataParallelResult | None
    dataloader: DataLoaderResult
    gpu: GpuResult
    gpu_samples: pd.DataFrame
    host_samples: pd.DataFrame
    findings: list[Finding]
    lint: LintReport | None
    warnings: list[str]
    step_ms: float = float("nan")  # mean step time over ranks (ms); NaN when unknown
    traces: list[Any] = field(default_factory=list, repr=False)
    allreduce_stall: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    # Every step of the run tables (rundir.STEP_COLUMNS); empty for foreign traces.
    run_steps: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    whatif: list[Projection] = field(default_factory=list)
    # Per (op, group, caller: DDP buckets apart from the user's calls): wall time per step
    # (comms.collective_wall_per_step); empty when not computed (many-rank runs).
    collective_wall: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {key: whole(build()) for key, build in self.json_sections()}

    def json_sections(self) -> list[tuple[str, Callable[[], Any]]]:
        """:meth:`to_json`'s keys in order, each with the function that builds its value,
        per-rank lists as jsonable.Rows: a writer that builds and writes one at a time
        (jsonout.write_results) never holds the whole JSON of a many-rank run, whose
        per-rank lists are most of it, nor one of those lists."""
        dp = self.dataparallel
        return [
            ("schema_version", lambda: SCHEMA_VERSION),
            ("source", lambda: str(self.source)),
            ("run", lambda: plain(self.run.to_json())),
            ("ranks", lambda: record_rows(self.ranks)),
            ("collectives", lambda: records(self.collective_summary)),
            ("collective_wall", lambda: records(self.collective_wall)),
            ("stragglers", lambda: record_rows(self.stragglers)),
            ("dataparallel", lambda: plain(dp.to_json() if dp else None)),
            ("dataloader", lambda: plain(self.dataloader.json_rows())),
            ("gpu", lambda: plain(self.gpu.json_rows())),
            ("findings", lambda: [f.to_dict() for f in self.findings]),
            ("whatif", lambda: [p.to_json() for p in self.whatif]),
            ("warnings", lambda: list(self.warnings)),
        ]

    def timeline(
        self,
        rank: int | None = None,
        max_intervals: int = 5000,
        ranks: Collection[int] | None = None,
    ) -> pd.DataFrame:
        """Merged intervals per rank and lane (ms since the earliest event of any rank),
        for plotting: of ``rank``, of ``ranks``, or else of :meth:`timeline_ranks`."""
        if rank is None and ranks is None:
            ranks = self.timeline_ranks()
        return timeline(self.traces, rank=rank, max_intervals=max_intervals, ranks=ranks)

    def timeline_ranks(self) -> list[int] | None:
        """The ranks the Timeline draws when none are named: None (every traced rank) up
        to MAX_TIMELINE_RANKS ranks; above, the ranks named by findings (a few of each,
        most severe first), then the slowest and the fastest by mean step time in
        turn, then ranks evenly spaced."""
        traced = sorted({int(t.meta.rank) for t in self.traces})
        if len(traced) <= MAX_TIMELINE_RANKS:
            return None
        candidates = [r for f in self.findings for r in list(f.ranks)[:_RANKS_PER_FINDING]]
        if len(self.ranks):
            by_speed = self.ranks.sort_values(["step_ms_mean", "rank"])["rank"].astype(int)
            fast, slow = by_speed.tolist(), by_speed.tolist()[::-1]
            candidates += [r for pair in zip(slow, fast, strict=True) for r in pair]
        step = len(traced) / MAX_TIMELINE_RANKS
        candidates += [traced[int(i * step)] for i in range(MAX_TIMELINE_RANKS)]
        known = set(traced)
        chosen: dict[int, None] = {}
        for r in candidates:
            if int(r) in known:
                chosen.setdefault(int(r))
            if len(chosen) == MAX_TIMELINE_RANKS:
                break
        return sorted(chosen)
