"""Precision and recall of `gpudiag lint` on the labelled corpus of real training scripts.

Lints tests/lint_corpus in one run (as a user lints a project folder), compares the findings
with tests/lint_corpus/labels.txt and prints precision and recall per severity and per rule:

    python tools/lint_corpus.py

A finding labelled `expect` is a true positive; any other finding is a false positive; an
`expect` label with no finding is a false negative. tests/test_lint_corpus.py uses the same
scoring (`score()`).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from gpudiag.lint import RULES, lint_paths

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "lint_corpus"
SEVERITIES = ("high", "medium", "low")
_LABEL = re.compile(
    r"^(?P<path>\S+):(?P<line>\d+)\s+(?P<code>GD\d{3})\s+(?P<kind>expect|must-not)\b"
)

Key = tuple[str, int, str]  # (path under the corpus, line, code)


@dataclass
class Labels:
    expect: set[Key] = field(default_factory=set)
    must_not: set[Key] = field(default_factory=set)


@dataclass
class Count:
    tp: int = 0
    fp: int = 0
    fn: int = 0

    @property
    def precision(self) -> float | None:
        found = self.tp + self.fp
        return self.tp / found if found else None

    @property
    def recall(self) -> float | None:
        real = self.tp + self.fn
        return self.tp / real if real else None


@dataclass
class Score:
    found: set[Key]
    labels: Labels
    errors: list[str]

    @property
    def false_positives(self) -> set[Key]:
        return self.found - self.labels.expect

    @property
    def false_negatives(self) -> set[Key]:
        return self.labels.expect - self.found

    def count(self, codes: set[str]) -> Count:
        def of(keys: set[Key]) -> int:
            return sum(1 for key in keys if key[2] in codes)

        return Count(
            tp=of(self.found & self.labels.expect),
            fp=of(self.false_positives),
            fn=of(self.false_negatives),
        )

    def by_severity(self) -> dict[str, Count]:
        return {
            severity: self.count({c for c, r in RULES.items() if r.severity == severity})
            for severity in SEVERITIES
        }


def read_labels(path: Path) -> Labels:
    labels = Labels()
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LABEL.match(line)
        if not match or match["code"] not in RULES:
            raise ValueError(f"{path}:{number}: not a label: {raw!r}")
        key = (match["path"], int(match["line"]), match["code"])
        (labels.expect if match["kind"] == "expect" else labels.must_not).add(key)
    return labels


def score(corpus: Path = CORPUS) -> Score:
    # every rule, the opt-in ones (GD701, GD702) included: their labels stay scored
    result = lint_paths([corpus], select=["GD"])
    found = {
        (Path(f.path).resolve().relative_to(corpus.resolve()).as_posix(), f.line, f.code)
        for f in result.findings
    }
    errors = [f"{e.path}:{e.line}: {e.message}" for e in result.errors]
    return Score(found, read_labels(corpus / "labels.txt"), errors)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(result: Score) -> str:
    files = len({path for path, _, _ in result.found | result.labels.expect})
    scripts = sum(1 for p in CORPUS.rglob("*.py"))
    lines = [
        f"corpus: {scripts} files, {len(result.labels.expect)} expected diagnostics, "
        f"{len(result.labels.must_not)} must-not, findings in {files} files",
        "",
        "| severity | expected | found | TP | FP | FN | precision | recall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for severity, c in result.by_severity().items():
        lines.append(
            f"| {severity} | {c.tp + c.fn} | {c.tp + c.fp} | {c.tp} | {c.fp} | {c.fn} "
            f"| {_pct(c.precision)} | {_pct(c.recall)} |"
        )
    lines += ["", "| rule | severity | TP | FP | FN |", "|---|---|---|---|---|"]
    for code, rule in RULES.items():
        c = result.count({code})
        if c.tp or c.fp or c.fn:
            lines.append(f"| {code} | {rule.severity} | {c.tp} | {c.fp} | {c.fn} |")
    for title, keys in (
        ("false positives", result.false_positives),
        ("false negatives", result.false_negatives),
    ):
        for path, line, code in sorted(keys):
            lines.append(f"{title}: {path}:{line} {code}")
    return "\n".join(lines)


def main() -> int:
    result = score()
    print(table(result))
    for error in result.errors:
        print(f"error: {error}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
