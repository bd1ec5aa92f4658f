"""Lint findings and the result of one lint run, as data.

`LintResult.to_json()` is the lint.json schema of the run directory (version 1): the
analysis joins a finding to a measured cost by (code, path, line) and `relates_to`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpudiag.lint.rules import RULES

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Finding:
    code: str
    path: str
    line: int
    col: int  # 1-based, like editors and ruff
    end_line: int
    message: str
    fix: str = ""  # this finding's fix, when the rule's general one does not fit

    @property
    def fix_text(self) -> str:
        return self.fix or RULES[self.code].fix

    @property
    def rule(self) -> str:
        return RULES[self.code].name

    @property
    def severity(self) -> str:
        return RULES[self.code].severity

    def to_text(self) -> str:
        return f"{self.path}:{self.line}:{self.col} {self.code} {self.message}"

    def to_json(self) -> dict[str, Any]:
        rule = RULES[self.code]
        return {
            "code": self.code,
            "rule": rule.name,
            "severity": rule.severity,
            "path": self.path,
            "line": self.line,
            "col": self.col,
            "end_line": self.end_line,
            "message": self.message,
            "why": rule.why,
            "fix": self.fix_text,
            "relates_to": rule.relates_to,
        }


@dataclass(frozen=True)
class FileError:
    """A file that could not be linted (unreadable, not UTF-8, syntax error)."""

    path: str
    line: int
    col: int
    message: str

    def to_text(self) -> str:
        return f"{self.path}:{self.line}:{self.col} error: {self.message}"


@dataclass
class LintResult:
    findings: list[Finding] = field(default_factory=list)
    errors: list[FileError] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings and not self.errors

    def to_json(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for finding in self.findings:
            counts[finding.code] = counts.get(finding.code, 0) + 1
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "gpudiag lint",
            "files": list(self.files),
            "findings": [finding.to_json() for finding in self.findings],
            "errors": [asdict(error) for error in self.errors],
            "counts": dict(sorted(counts.items())),
        }
