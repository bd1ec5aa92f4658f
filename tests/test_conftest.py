"""tests/conftest.py itself: without ../shared/traces the tests that need them are
skipped, and the terminal summary counts them in one line (a quick loop cannot pass
quietly without the real traces)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

NEEDS_TRACES = """
def test_a(shared_traces):
    pass

def test_b(shared_traces):
    pass

def test_c(shared_traces):
    pass

def test_without_traces():
    pass
"""


def _pytest_in(repo: Path) -> subprocess.CompletedProcess[str]:
    """pytest run in ``repo``, whose tests/conftest.py is ours: ../shared/traces, next
    to ``repo``, does not exist there."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _repo_with_tests(tmp_path: Path, tests: str) -> Path:
    repo = tmp_path / "checkout"
    (repo / "tests").mkdir(parents=True)
    (repo / "pytest.ini").write_text("[pytest]\n")
    (repo / "tests" / "conftest.py").write_text(CONFTEST.read_text())
    (repo / "tests" / "test_some.py").write_text(tests)
    return repo


def test_skips_for_missing_traces_are_counted_in_one_line(tmp_path: Path) -> None:
    repo = _repo_with_tests(tmp_path, NEEDS_TRACES)
    assert not (tmp_path / "shared" / "traces").exists()
    done = _pytest_in(repo)
    assert done.returncode == 0, done.stdout[-2000:]
    lines = [line for line in done.stdout.splitlines() if "tests skipped:" in line]
    traces = tmp_path / "shared" / "traces"
    assert len(lines) == 1 and f"3 tests skipped: {traces} is missing" in lines[0]
    assert "1 passed, 3 skipped" in done.stdout


def test_no_line_when_nothing_was_skipped_for_them(tmp_path: Path) -> None:
    repo = _repo_with_tests(tmp_path, "def test_plain():\n    pass\n")
    done = _pytest_in(repo)
    assert done.returncode == 0 and "1 passed" in done.stdout
    assert "tests skipped:" not in done.stdout
