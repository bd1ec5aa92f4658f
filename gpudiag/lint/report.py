"""lint.json in a run directory: the `gpudiag lint` result a run carries, read as a
typed :class:`LintReport` (through the run directory's safe readers)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpudiag.rundir.files import bad_input, read_json
from gpudiag.rundir.layout import LINT
from gpudiag.rundir.schema import MAX_DEPTH, _too_deep

# --------------------------------------------------------------------------- lint.json


@dataclass(frozen=True)
class LintDiagnostic:
    """One finding of `gpudiag lint` as lint.json holds it (gpudiag/lint/result.py)."""

    code: str
    rule: str
    severity: str
    path: str
    line: int
    col: int
    message: str
    why: str = ""
    fix: str = ""
    relates_to: str | None = None  # the `gpudiag analyze` finding kind of the same cost

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True)
class LintFileError:
    path: str
    line: int
    message: str


@dataclass
class LintReport:
    """lint.json, typed: the files linted, the diagnostics, the files that could not be."""

    files: list[str]
    diagnostics: list[LintDiagnostic]
    errors: list[LintFileError]
    raw: dict[str, Any] = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        return self.raw


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def parse_lint(obj: Any, source: str, warnings: list[str] | None = None) -> LintReport | None:
    """A lint.json document (or `LintResult.to_json()`) as a LintReport; None, with a
    one-line warning naming ``source``, when it is not one. Malformed entries are skipped."""
    if obj is None:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("findings", []), list):
        bad_input(warnings, f"{source}: not a gpudiag lint result; ignored")
        return None
    diagnostics = []
    skipped = 0
    for item in _as_list(obj.get("findings")):
        if not isinstance(item, dict) or not _text(item.get("code")) or not _text(item.get("path")):
            skipped += 1
            continue
        relates = item.get("relates_to")
        diagnostics.append(
            LintDiagnostic(
                code=item["code"],
                rule=_text(item.get("rule")),
                severity=_text(item.get("severity")),
                path=item["path"],
                line=_int(item.get("line")),
                col=_int(item.get("col")),
                message=_text(item.get("message")),
                why=_text(item.get("why")),
                fix=_text(item.get("fix")),
                relates_to=relates if isinstance(relates, str) and relates else None,
            )
        )
    if skipped:
        bad_input(warnings, f"{source}: {skipped} malformed lint finding(s) skipped")
    errors = [
        LintFileError(_text(e.get("path")), _int(e.get("line")), _text(e.get("message")))
        for e in _as_list(obj.get("errors"))
        if isinstance(e, dict)
    ]
    files = [f for f in _as_list(obj.get("files")) if isinstance(f, str)]
    return LintReport(files=files, diagnostics=diagnostics, errors=errors, raw=obj)


def read_lint(run: str | os.PathLike[str], warnings: list[str] | None = None) -> LintReport | None:
    """<run>/lint.json, typed; None when the run has none (or it is unreadable: warned)."""
    path = Path(run) / LINT
    obj = read_json(path, warnings)
    if obj is not None and _too_deep(obj):
        bad_input(warnings, f"{path}: nested deeper than {MAX_DEPTH} levels; ignored")
        return None
    return parse_lint(obj, str(path), warnings)
