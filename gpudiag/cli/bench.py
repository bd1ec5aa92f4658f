"""`gpudiag bench`: single vs DataParallel vs DDP on the reference trainers, under capture.

The options, the runs and the table live in gpudiag/reference/bench.py (the reference
trainers' own package); this module is the command's entry in the command layer.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from gpudiag.reference.bench import main as bench_main

    return bench_main(argv)
