"""Speed of `gpudiag lint` side by side with the floor (ast.parse of the same source).

Target (issue 6): linting 1000 lines takes < 0.2 s. Prints one line per size:
lines, lint ms, ast.parse ms, ratio lint/parse, lint ms per 1000 lines.

    python bench/lint_speed.py
"""

from __future__ import annotations

import ast
import time
from pathlib import Path

from gpudiag.lint import lint_source

CASES = Path(__file__).resolve().parents[1] / "tests" / "lint_cases"


def best_of(function, repeat: int = 7) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    unit = "\n".join(path.read_text() for path in sorted(CASES.glob("*.py")))
    print(f"{'lines':>7} {'lint ms':>9} {'parse ms':>9} {'ratio':>6} {'ms/1000 lines':>14}")
    for copies in (1, 2, 8):
        source = "\n".join([unit] * copies)
        lines = source.count("\n") + 1
        lint = best_of(lambda source=source: lint_source(source, "bench.py"))
        parse = best_of(lambda source=source: ast.parse(source))
        per_k = lint * 1000 / lines * 1000
        print(
            f"{lines:>7} {lint * 1000:>9.1f} {parse * 1000:>9.1f} {lint / parse:>6.1f} {per_k:>14.1f}"
        )
    print("target: < 200 ms per 1000 lines")


if __name__ == "__main__":
    main()
