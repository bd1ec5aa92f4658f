"""Shared test fixtures.

../shared/traces holds real GPU traces from other public projects. Tests read them in
place (never copied into the repository). In CI (CI=true) their absence is an error;
outside CI the tests that need them (the ``shared_traces`` fixture) are skipped, and the
terminal summary says how many in one line, so a quick loop cannot pass quietly without
them.

Markers: `slow` (launches training processes or servers, or inflates gigabytes) and
`browser` (drives headless Chromium). `pytest -q` skips both (pyproject's addopts);
`pytest -q -m "" -n 3 --dist loadfile --no-loadscope-reorder` runs everything, as CI
does: each test file on one worker, the longest files first (LONGEST_FILES), so the jobs
a file's module or session fixture records are recorded once (tests of one file spread
over several workers recorded them once per worker). A test that uses one of the fixtures
in RECORDING_FIXTURES records a gloo job, so it is slow wherever it lives.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_RUNS = REPO / "sample_runs"
TRACES_MISSING = f"{SHARED_TRACES} not present (outside CI)"

# the linter's test inputs are source to lint, not tests (a case of unit-test code,
# `lint_cases/issue30/unit_test_dp/tests/test_sync_bn.py`, is named like one)
collect_ignore_glob = ["lint_cases/*"]


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED_TRACES} is missing: CI must have ../shared/traces")
        pytest.skip(TRACES_MISSING)
    return SHARED_TRACES


def _skipped_for_missing_traces(report: pytest.TestReport) -> bool:
    """A skip raised by the ``shared_traces`` fixture (its longrepr: path, line, reason)."""
    longrepr = report.longrepr
    return isinstance(longrepr, tuple) and TRACES_MISSING in str(longrepr[2])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    skipped = terminalreporter.stats.get("skipped", [])
    missing = sum(1 for report in skipped if _skipped_for_missing_traces(report))
    if missing:
        terminalreporter.write_sep(
            "!",
            f"{missing} tests skipped: {SHARED_TRACES} is missing (the real GPU traces)",
            yellow=True,
            bold=True,
        )


# Fixtures that record a training job (gloo ranks under `gpudiag trace` or torchrun).
RECORDING_FIXTURES = frozenset({"runs_root", "analyzed"})


def pytest_configure(config: pytest.Config) -> None:
    # A shell's background job (`pytest ... &`, nohup) starts with SIGINT ignored, and an
    # ignored signal stays ignored across exec: every process a test starts would then be
    # deaf to the Ctrl-C the tests send it. Handling it here resets it in the children.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# The files that took longest in CI (summed setup and call times, --durations), in the
# order xdist should hand them out. Under `--dist loadfile --no-loadscope-reorder` the
# workers get files in collection order (three workers: files 1-3 first, then the next
# file to the worker nearly done): a long file handed out last runs alone at the end
# while the other workers idle (CI, 2026-12-03: the frameworks and what-if files ran in
# the last minutes, after xdist's own order, most tests first). test_busy_host runs three CPU hogs beside
# its first recordings, so it starts beside files that only analyse recorded data (the
# out-of-core and fuzz tests), and the files whose findings depend on timing (the
# findings suite, the frameworks suite) start after those hogs have gone.
LONGEST_FILES = (
    "test_busy_host.py",
    "test_out_of_core.py",
    "test_fuzz_inputs.py",
    "test_findings_gloo.py",
    "test_dashboard.py",
    "test_frameworks.py",
    "test_multinode.py",
    "test_reliability_gloo.py",
    "test_cluster.py",
    "test_profiler_safety.py",
    "test_exit_paths.py",
    "test_collective_timeout.py",
    "test_dashboard_live.py",
    "test_launchers.py",
    "test_dashboard_overview.py",
    "test_capture_guard_jobs.py",
    "test_job_signals_and_paths.py",
    "test_bad_input.py",
    "test_blame_early_exit.py",
    "test_capture_trace.py",
)


def _file_order(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if RECORDING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_file_order)  # stable: within a file, and among the rest, as collected
