"""The package's import graph: no circles, and each stage imports only the stages before
it (tools/import_graph.py reads the source with ast; nothing is imported)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))

import import_graph  # noqa: E402


def test_no_import_circles() -> None:
    graph = import_graph.import_graph(REPO)
    assert len(graph) > 50  # the whole tree was read
    assert import_graph.circles(graph) == []


def test_stages_import_only_earlier_stages() -> None:
    graph = import_graph.import_graph(REPO)
    assert import_graph.layer_violations(graph) == []
    analysis = {t for m, ts in graph.items() if m.startswith("gpudiag.analysis") for t in ts}
    assert not {
        t for t in analysis if t.startswith(("gpudiag.report", "dashboards", "gpudiag.capture"))
    }
    capture = {t for m, ts in graph.items() if m.startswith("gpudiag.capture") for t in ts}
    assert not {
        t for t in capture if t.startswith(("gpudiag.lint", "gpudiag.analysis", "gpudiag.report"))
    }


def test_the_graph_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "gpudiag"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "dashboards").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "sub" / "b.py").write_text("from gpudiag.sub.a import f\n")
    (tmp_path / "dashboards" / "app.py").write_text("import gpudiag.dashboards.app\n")
    (pkg / "sub" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpudiag.sub.b import f\n"
    )
    graph = import_graph.import_graph(tmp_path)
    assert graph["gpudiag.sub.a"] == {"gpudiag.sub.b"}
    assert import_graph.circles(graph) == [["gpudiag.sub.a", "gpudiag.sub.b"]]
    assert graph["dashboards.app"] == set()  # itself, under the name the wheel gives it
    assert graph["gpudiag.sub.c"] == set()  # annotations only: never imported at run time


def test_script_exit_status() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "import_graph.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "circles: 0" in proc.stdout and "layer violations: 0" in proc.stdout
