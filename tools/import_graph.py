"""The import graph of gpudiag/ and dashboards/: its circles and each file's size.

    python tools/import_graph.py            # circles, layer violations, file sizes
    python tools/import_graph.py --edges    # every edge, one `a -> b` per line

Reads the source with ast only (nothing is imported). An edge a -> b means module a has
an ``import`` of b anywhere in its body, lazy imports inside functions included: a lazy
import still ties the two modules together for a reader. Imports under
``if TYPE_CHECKING:`` (annotations only, never executed) are not edges. ``import x.y.z`` and
``from x.y import z`` count as an edge to the deepest module that exists in the tree.
``dashboards`` files are named ``dashboards.<module>`` (the package the wheel ships them
as is ``gpudiag.dashboards``; both spellings map to the same file).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = ("gpudiag", "dashboards")

# layer -> prefixes it must never import (the pipeline's direction)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "gpudiag.analysis": ("gpudiag.report", "dashboards", "gpudiag.capture", "gpudiag.cli"),
    "gpudiag.capture": ("gpudiag.lint", "gpudiag.analysis", "gpudiag.report", "gpudiag.cli"),
    "gpudiag.report": ("dashboards", "gpudiag.capture", "gpudiag.cli"),
    "gpudiag.lint": ("gpudiag.analysis", "gpudiag.report", "gpudiag.capture", "gpudiag.cli"),
    "gpudiag.rundir": ("gpudiag.analysis", "gpudiag.report", "gpudiag.capture", "gpudiag.cli"),
}


def module_files(repo: Path = REPO) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the roots."""
    mods: dict[str, Path] = {}
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = path
    return mods


def _canonical(name: str) -> str:
    if name == "gpudiag.dashboards" or name.startswith("gpudiag.dashboards."):
        return name.removeprefix("gpudiag.")
    return name


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    name = _canonical(name)
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking_only(tree: ast.AST) -> set[ast.AST]:
    """Import nodes under ``if TYPE_CHECKING:``: annotations only, never run."""
    skip: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skip.update(ast.walk(child))
    return skip


def _imported_names(mod: str, path: Path, tree: ast.AST) -> Iterable[str]:
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    skip = _type_checking_only(tree)
    for node in ast.walk(tree):
        if node in skip:
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from pkg import sub` names the submodule when one exists, else pkg itself
            for alias in node.names:
                yield f"{prefix}.{alias.name}"
            yield prefix


def import_graph(repo: Path = REPO) -> dict[str, set[str]]:
    """module -> the in-tree modules it imports (not itself)."""
    mods = module_files(repo)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name in _imported_names(mod, path, tree):
            target = _resolve(name, mods)
            if target is not None and target != mod and not mod.startswith(target + "."):
                # `import gpudiag.x` from inside gpudiag.y loads gpudiag/__init__ too, but
                # a package's own __init__ is not a dependency worth a circle
                graph[mod].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _in_layer(mod: str, layer: str) -> bool:
    return mod == layer or mod.startswith(layer + ".")


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs that go against the pipeline's direction."""
    bad = []
    for mod, targets in sorted(graph.items()):
        for layer, banned in FORBIDDEN.items():
            if not _in_layer(mod, layer):
                continue
            bad += [(mod, t) for t in sorted(targets) if any(_in_layer(t, b) for b in banned)]
    return bad


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--edges", action="store_true", help="print every edge")
    args = parser.parse_args(argv)
    graph = import_graph()
    if args.edges:
        for mod, targets in sorted(graph.items()):
            for t in sorted(targets):
                print(f"{mod} -> {t}")
        return 0
    found = circles(graph)
    print(f"circles: {len(found)}")
    for comp in found:
        print("  " + " <-> ".join(comp))
    bad = layer_violations(graph)
    print(f"layer violations: {len(bad)}")
    for a, b in bad:
        print(f"  {a} -> {b}")
    files = module_files()
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in files.items()}
    edges = sum(len(t) for t in graph.values())
    print(f"modules: {len(files)}  edges: {edges}  lines: {sum(lines.values())}")
    print("largest files (lines):")
    for mod, n in sorted(lines.items(), key=lambda kv: -kv[1])[:15]:
        print(f"  {n:5d}  {files[mod].relative_to(REPO)}")
    return 1 if found or bad else 0


if __name__ == "__main__":
    sys.exit(main())
