"""Lint files: parse (never import or run), apply the checks, filter, sort."""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpudiag.lint.checks import all_checks
from gpudiag.lint.config import Selection, SelectionResolver, check_codes
from gpudiag.lint.context import ModuleContext
from gpudiag.lint.result import FileError, Finding, LintResult
from gpudiag.lint.rules import RULES
from gpudiag.lint.suppression import is_suppressed, suppressions

_SKIP_DIRS = {"__pycache__", "node_modules", "venv", "site-packages", "build", "dist"}


def lint_source(
    source: str, path: str = "<string>", selection: Selection | None = None
) -> list[Finding]:
    """Findings for one module's source. Raises SyntaxError for code that does not parse."""
    tree = ast.parse(source, filename=path)
    ctx = ModuleContext(tree)
    ignored = suppressions(source)
    selection = selection or Selection()
    findings: set[Finding] = set()
    for check in all_checks():
        for hit in check(ctx):
            if not selection.enabled(hit.code):
                continue
            line = getattr(hit.node, "lineno", 1)
            end_line = getattr(hit.node, "end_lineno", None) or line
            if is_suppressed(ignored, hit.code, line, end_line):
                continue
            col = getattr(hit.node, "col_offset", 0) + 1
            message = RULES[hit.code].message + hit.detail
            findings.add(Finding(hit.code, path, line, col, end_line, message))
    return sorted(findings, key=lambda f: (f.line, f.col, f.code))


def iter_python_files(paths: Iterable[str]) -> Iterator[str]:
    """Each path as given; directories walked for *.py (hidden and build folders skipped).
    A file reached twice (given, and inside a given directory) is linted once."""
    seen: set[str] = set()
    for path in paths:
        if os.path.isdir(path):
            found = []
            for root, dirs, files in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS)
                found += [
                    os.path.join(root, name) for name in sorted(files) if name.endswith(".py")
                ]
        else:
            found = [path]
        for file in found:
            key = os.path.realpath(file)
            if key not in seen:
                seen.add(key)
                yield file


def lint_paths(
    paths: Iterable[str | os.PathLike[str]],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> LintResult:
    """Lint files and directories. Missing paths raise FileNotFoundError; bad config ConfigError."""
    as_given = [os.fspath(p) for p in paths]
    for path in as_given:
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such file or directory")
    chosen = check_codes(list(select), "--select") if select is not None else None
    ignored = check_codes(list(ignore), "--ignore") if ignore is not None else ()
    resolver = SelectionResolver(chosen, ignored)
    result = LintResult()
    for path in iter_python_files(as_given):
        result.files.append(path)
        selection = resolver.for_file(Path(path))
        try:
            source = _read(path)
            result.findings.extend(lint_source(source, path, selection))
        except SyntaxError as error:
            result.errors.append(
                FileError(
                    path, error.lineno or 1, (error.offset or 0) or 1, f"syntax error: {error.msg}"
                )
            )
        except RecursionError:
            result.errors.append(FileError(path, 1, 1, "too deeply nested to parse"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            result.errors.append(FileError(path, 1, 1, f"cannot read: {error}"))
        except Exception as error:  # a bug in a rule must not hide the other files' findings
            message = (
                f"internal error in gpudiag lint, please report: {type(error).__name__}: {error}"
            )
            result.errors.append(FileError(path, 1, 1, message))
    return result


def _read(path: str) -> str:
    with open(path, "rb") as handle:
        data = handle.read()
    return data.decode("utf-8-sig")
