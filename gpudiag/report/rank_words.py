"""The ranks a finding names, in one wording for every view. The DLRM set's gpu_idle
finding read "all 8 ranks" in the verdict, "ranks 0, 1, 2, 3, 4, 5, 6 and 7" in the
terminal's and the HTML report's finding headers and "0, 1, 2, 3, 4, 5, 6, 7" in the
dashboard's findings table (probe 31m: "every rank" written three ways)."""

from __future__ import annotations

from typing import Any

from gpudiag.report import numbers, overview

# Findings whose cost is the mean over every analysed rank while they name the ranks that
# carry most of it (analysis/gpu.py; the verdict says it the same way). Megatron's
# gpu_idle header put 69.59 ms/step, the mean over 8 ranks, beside "ranks 0, 2, 3 and 6",
# whose own mean is 131.5 (probe 31m).
_COST_OVER_EVERY_RANK = ("gpu_idle",)


def finding_ranks(f: Any, run: Any = None) -> str:
    """``all 8 ranks`` where the finding names every analysed rank of the world (as the
    verdict says it, :func:`overview.analysed_ranks`), else ``rank 2`` / ``ranks 0 and 6``
    (``most on ranks 0, 2, 3 and 6 (its ms/step: the mean over all 8 ranks)`` where the
    cost is over every rank). A finding that names none is about every analysed rank, so
    it reads as they are (``all 4 ranks``, ``rank 0`` of a trace set with one rank of 8:
    "all ranks" said more than was analysed, probe 31n, D7); ``all ranks`` only where
    the run names no rank, ``no rank`` for a failure (the job failed to launch)."""
    named = sorted(int(r) for r in f.ranks or [] if numbers.number(r) is not None)
    traced = sorted(int(r) for r in getattr(run, "traced_ranks", None) or [])
    every = overview.analysed_ranks(traced, getattr(run, "world_size", None))
    if named and named == traced:
        return every
    if not named and traced and f.kind != "rank_failed":
        return every  # a finding of the run, on the ranks analysed (probe 31n, D7)
    if named and f.kind in _COST_OVER_EVERY_RANK and len(traced) > 1:
        return f"most on {numbers.ranks(named)} (its ms/step: the mean over {every})"
    return numbers.finding_ranks_named(f.kind, f.ranks or [])
