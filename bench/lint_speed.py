"""Speed of `gpudiag lint` side by side with the floor (ast.parse of the same source).

Target (issue 6): linting 1000 lines takes < 0.2 s. Prints one line per input:

- tests/lint_cases concatenated 1x, 2x, 8x into one module (`lint_source`: per-module rules);
- tests/lint_corpus linted as one run (`lint_paths`: 47 real files, the project index that
  resolves imports across them included);
- with `--repo DIR`, a whole repository as one run (`gpudiag lint DIR`): where scans that
  grow with the number of modules show (Lightning-AI/pytorch-lightning, 646 files, 139 k
  lines: 23.0 s before the sixteenth session's indexes, 17.6 s after, median of 3
  alternated, at load 3-5; docs/lint.md "Speed").

Each is timed `--repeat` times (default 9); median and spread (min-max) in ms, and the
median per 1000 lines. Compare two versions by alternating them, e.g.

    for i in 1 2 3; do PYTHONPATH=/work/main python bench/lint_speed.py; \
                       PYTHONPATH=$PWD python bench/lint_speed.py; done
"""

from __future__ import annotations

import argparse
import ast
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from gpudiag.lint import lint_paths, lint_source

TESTS = Path(__file__).resolve().parents[1] / "tests"
CASES = TESTS / "lint_cases"
CORPUS = TESTS / "lint_corpus"


def timings(function: Callable[[], object], repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def row(name: str, lines: int, lint: list[float], parse: list[float]) -> str:
    median = statistics.median(lint)
    per_k = median * 1000 / lines * 1000
    spread = f"{min(lint) * 1000:.0f}-{max(lint) * 1000:.0f}"
    ratio = median / statistics.median(parse)
    return (
        f"{name:<16} {lines:>6} {median * 1000:>9.1f} {spread:>11} "
        f"{statistics.median(parse) * 1000:>9.1f} {ratio:>6.1f} {per_k:>8.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--repo", type=Path, help="also lint this folder as one run")
    arguments = parser.parse_args()
    repeat = arguments.repeat
    print(
        f"{'input':<16} {'lines':>6} {'lint ms':>9} {'min-max':>11} {'parse ms':>9} "
        f"{'ratio':>6} {'ms/1000':>8}"
    )
    unit = "\n".join(path.read_text() for path in sorted(CASES.glob("*.py")))
    for copies in (1, 2, 8):
        source = "\n".join([unit] * copies)
        lines = source.count("\n") + 1
        lint = timings(lambda source=source: lint_source(source, "bench.py"), repeat)
        parse = timings(lambda source=source: ast.parse(source), repeat)
        print(row(f"cases x{copies}", lines, lint, parse))
    files = sorted(CORPUS.rglob("*.py"))
    texts = [path.read_text() for path in files]
    lines = sum(text.count("\n") + 1 for text in texts)
    lint = timings(lambda: lint_paths([CORPUS]), repeat)
    parse = timings(lambda: [ast.parse(text) for text in texts], repeat)
    print(row(f"corpus ({len(files)} files)", lines, lint, parse))
    if arguments.repo is not None:
        print(_repository_row(arguments.repo, min(repeat, 3)))
    print("target: < 200 ms per 1000 lines")


def _parsed(text: str) -> ast.AST | None:
    try:
        return ast.parse(text)
    except SyntaxError:  # linted as a file error too
        return None


def _repository_row(folder: Path, repeat: int) -> str:
    files = sorted(folder.rglob("*.py"))
    texts = [path.read_text(errors="replace") for path in files]
    lines = sum(text.count("\n") + 1 for text in texts)
    lint = timings(lambda: lint_paths([folder]), repeat)
    parse = timings(lambda: [_parsed(text) for text in texts], repeat)
    return row(f"{folder.name} ({len(files)})", lines, lint, parse)


if __name__ == "__main__":
    main()
