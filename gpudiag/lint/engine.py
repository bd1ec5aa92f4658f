"""Lint files: parse (never import or run), apply the checks, filter, sort."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from gpudiag.lint.checks import all_checks
from gpudiag.lint.config import Selection, SelectionResolver, check_codes
from gpudiag.lint.context import FUNCTION_TYPES, ModuleContext
from gpudiag.lint.project import Project, local_imports
from gpudiag.lint.result import FileError, Finding, LintResult
from gpudiag.lint.rules import RULES
from gpudiag.lint.suppression import is_suppressed, suppressions
from gpudiag.lint.test_code import in_unit_test
from gpudiag.rundir.files import read_limited

_MAX_SIBLINGS = 50
_MAX_SIBLING_BYTES = 1_000_000
_SKIP_DIRS = {"__pycache__", "node_modules", "venv", "site-packages", "build", "dist"}


def lint_source(
    source: str, path: str = "<string>", selection: Selection | None = None
) -> list[Finding]:
    """Findings for one module's source, on its own (no other file is read).
    Raises SyntaxError for code that does not parse."""
    tree = ast.parse(source, filename=path)
    ctx = ModuleContext(tree)
    ctx.lines = source.splitlines()
    Project([ctx])
    try:
        return _check_module(ctx, source, path, selection)
    finally:
        ctx.release()


def _check_module(
    ctx: ModuleContext, source: str, path: str, selection: Selection | None
) -> list[Finding]:
    ignored = suppressions(source)
    selection = selection or Selection()
    findings: set[Finding] = set()
    for check in all_checks():
        for hit in check(ctx):
            if not selection.enabled(hit.code) or ctx.in_smoke_test(hit.node):
                continue
            if _smoke_test_only(ctx, hit.node) or in_unit_test(ctx, path, hit.node):
                continue
            line = getattr(hit.node, "lineno", 1)
            end_line = getattr(hit.node, "end_lineno", None) or line
            if is_suppressed(ignored, hit.code, line, end_line):
                continue
            col = getattr(hit.node, "col_offset", 0) + 1
            message = RULES[hit.code].message + hit.detail
            findings.add(Finding(hit.code, path, line, col, end_line, message, hit.fix))
    return sorted(findings, key=lambda f: (f.line, f.col, f.code))


def _smoke_test_only(ctx: ModuleContext, node: ast.AST) -> bool:
    """`node` is in a module-level function that only the module's own smoke-test block
    calls (ModuleContext.in_smoke_test): dragon's `optimization_utils.run_test()`, a CPU
    self-test reached from `if __name__ == "__main__":` of a module the job imports
    (fifteenth judge). Not when another file of the run calls it."""
    function = next(
        (a for a in ctx.ancestors(node) if isinstance(a, FUNCTION_TYPES) and a in ctx.tree.body),
        None,
    )
    if function is None:
        return False
    references = ctx.references_to(function.name)
    if not references or not all(
        ctx.in_smoke_test(ref) and _called_bare(ctx, ref) for ref in references
    ):
        return False
    project = ctx.project
    return project is None or all(
        module is ctx and ctx.in_smoke_test(call)
        for module, call in project.callers(ctx, function.name)
    )


_COMMAND_LINE = re.compile(r"parse|argv|ArgumentParser|Options|fire\.|hydra|click", re.I)


def _called_bare(ctx: ModuleContext, reference: ast.AST) -> bool:
    """`run_test()`: called with nothing, from a block that reads no command line (a
    script's `main(args)` after argparse runs the job: contriever, vq-vae-2's train)."""
    call = reference if isinstance(reference, ast.Call) else ctx.parents.get(reference)
    if not isinstance(call, ast.Call) or call.args or call.keywords:
        return False
    block = next((a for a in ctx.ancestors(call) if isinstance(a, ast.If)), None)
    return block is not None and not _COMMAND_LINE.search(ast.unparse(block))


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
    parsed: list[tuple[str, str, ModuleContext]] = []
    for path in iter_python_files(as_given):
        result.files.append(path)
        try:
            source = _read(path)
            ctx = ModuleContext(ast.parse(source, filename=path), path)
            ctx.lines = source.splitlines()
            parsed.append((path, source, ctx))
        except Exception as error:
            result.errors.append(_file_error(path, error))
    siblings = _imported_siblings(parsed)
    _link([ctx for _, _, ctx in parsed], siblings)
    try:
        for path, source, ctx in parsed:
            selection = resolver.for_file(Path(path))
            try:
                result.findings.extend(_check_module(ctx, source, path, selection))
            except Exception as error:
                result.errors.append(_file_error(path, error))
    finally:
        for ctx in [*(ctx for _, _, ctx in parsed), *siblings]:
            ctx.release()
    return result


def _link(linted: list[ModuleContext], siblings: list[ModuleContext]) -> None:
    """One project index over the run; should it fail, each file on its own."""
    try:
        Project(linted + siblings)
    except Exception:
        for ctx in linted:
            Project([ctx])


def _imported_siblings(parsed: list[tuple[str, str, ModuleContext]]) -> list[ModuleContext]:
    """Modules next to the linted files that they import but that were not given (linting
    `main.py` alone still sees `trainer.py`'s set_device): indexed, never reported."""
    known = {os.path.realpath(path) for path, _, _ in parsed}
    extra: list[ModuleContext] = []
    queue = [ctx for _, _, ctx in parsed]
    importers = _importers(parsed, known)
    listings: dict[str, set[str]] = {}
    while queue and len(extra) < _MAX_SIBLINGS:
        ctx = queue.pop()
        for file in [*local_imports(ctx, listings), *importers]:
            key = os.path.realpath(file)
            if key in known or len(extra) >= _MAX_SIBLINGS:
                continue
            known.add(key)
            try:
                if os.path.getsize(file) > _MAX_SIBLING_BYTES:
                    continue
                sibling = ModuleContext(ast.parse(_read(file), filename=file), file)
            except Exception:  # an unreadable helper module only loses its facts
                continue
            extra.append(sibling)
            queue.append(sibling)
    return extra


def _importers(parsed: list[tuple[str, str, ModuleContext]], known: set[str]) -> list[str]:
    """Scripts not in the run, in the folder of a linted file, that import it (`main.py`
    next to a linted `trainer.py`). Each such file is read once."""
    stems_by_folder: dict[str, list[str]] = {}
    for path, _, _ in parsed:
        folder, name = os.path.split(os.path.abspath(path))
        stem = name.removesuffix(".py")
        if stem.isidentifier() and stem != "__init__":
            stems_by_folder.setdefault(folder, []).append(stem)
    found: list[str] = []
    searches: list[tuple[str, re.Pattern[str]]] = []
    for folder, stems in stems_by_folder.items():
        names = "|".join(re.escape(stem) for stem in stems)
        pattern = re.compile(rf"^\s*(from\s+\.?({names})\s+import|import\s+({names})\b)", re.M)
        searches.append((folder, pattern))
        searches += _package_importer_searches(folder)
    for folder, pattern in searches:
        try:
            entries = sorted(os.listdir(folder))
        except OSError:
            continue
        for entry in entries:
            file = os.path.join(folder, entry)
            if not entry.endswith(".py") or os.path.realpath(file) in known or file in found:
                continue
            try:
                if os.path.getsize(file) <= _MAX_SIBLING_BYTES and pattern.search(_read(file)):
                    found.append(file)
            except (OSError, UnicodeDecodeError):
                continue
            if len(found) >= _MAX_SIBLINGS:
                return found
    return found


def _package_importer_searches(folder: str) -> list[tuple[str, re.Pattern[str]]]:
    """A linted module of a package (`improved_diffusion/dist_util.py`): the scripts next to
    the package or in a folder beside it (`scripts/image_train.py`) that import the package,
    often through its `__init__.py` re-exports."""
    if not os.path.isfile(os.path.join(folder, "__init__.py")):
        return []
    parent, package = os.path.split(folder)
    if not package.isidentifier():
        return []
    name = re.escape(package)
    pattern = re.compile(rf"^\s*(from\s+{name}(\.\w+)*\s+import|import\s+{name}\b)", re.M)
    try:
        beside = sorted(
            os.path.join(parent, entry)
            for entry in os.listdir(parent)
            if not entry.startswith(".") and os.path.isdir(os.path.join(parent, entry))
        )
    except OSError:
        return []
    return [(path, pattern) for path in [parent, *beside] if path != folder]


def _file_error(path: str, error: Exception) -> FileError:
    if isinstance(error, SyntaxError):
        column = (error.offset or 0) or 1
        return FileError(path, error.lineno or 1, column, f"syntax error: {error.msg}")
    if isinstance(error, RecursionError):
        return FileError(path, 1, 1, "too deeply nested to parse")
    if isinstance(error, (OSError, UnicodeDecodeError, ValueError)):
        return FileError(path, 1, 1, f"cannot read: {error}")
    # a bug in a rule must not hide the other files' findings
    message = f"internal error in gpudiag lint, please report: {type(error).__name__}: {error}"
    return FileError(path, 1, 1, message)


# A Python source larger than this is not a training script (the largest file of the
# lint corpus is 0.2 MiB): refused, as a FIFO, a device or /dev/zero in a .py's place is
# (`gpudiag trace` lints the script it runs: read without a limit, /dev/zero linked as a
# module took 9.4 GB; issue 28 probe 28e).
MAX_SOURCE_BYTES = 8 << 20


def _read(path: str) -> str:
    return read_limited(path, MAX_SOURCE_BYTES, "a Python source file").decode("utf-8-sig")
