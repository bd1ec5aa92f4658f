"""SARIF 2.1.0 output, for code-scanning UIs (GitHub, VS Code SARIF viewer)."""

from __future__ import annotations

from typing import Any

from gpudiag import __version__
from gpudiag.lint.result import LintResult
from gpudiag.lint.rules import RULES

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
_LEVEL = {"high": "error", "medium": "warning", "low": "note"}


def _uri(path: str) -> str:
    return path.replace("\\", "/")


def _rule_descriptor(code: str) -> dict[str, Any]:
    rule = RULES[code]
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": rule.message},
        "fullDescription": {"text": rule.why},
        "help": {"text": rule.fix},
        "defaultConfiguration": {"level": _LEVEL[rule.severity], "enabled": rule.default},
        "properties": {"severity": rule.severity, "relates_to": rule.relates_to},
    }


def to_sarif(result: LintResult) -> dict[str, Any]:
    codes = sorted(RULES)
    index = {code: i for i, code in enumerate(codes)}
    results = [
        {
            "ruleId": f.code,
            "ruleIndex": index[f.code],
            "level": _LEVEL[f.severity],
            "message": {"text": f"{f.message}. Fix: {f.fix_text}"},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(f.path)},
                        "region": {
                            "startLine": f.line,
                            "startColumn": f.col,
                            "endLine": f.end_line,
                        },
                    }
                }
            ],
        }
        for f in result.findings
    ]
    notifications = [
        {
            "level": "error",
            "message": {"text": e.message},
            "locations": [
                {
                    "physicalLocation": {
                        "artifactLocation": {"uri": _uri(e.path)},
                        "region": {"startLine": e.line, "startColumn": e.col},
                    }
                }
            ],
        }
        for e in result.errors
    ]
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "gpudiag-lint",
                        "version": __version__,
                        "rules": [_rule_descriptor(code) for code in codes],
                    }
                },
                "invocations": [
                    {
                        "executionSuccessful": not result.errors,
                        "toolExecutionNotifications": notifications,
                    }
                ],
                "results": results,
            }
        ],
    }
