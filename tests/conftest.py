"""Shared test fixtures.

../shared/traces holds real GPU traces from other public projects. Tests read them in
place (never copied into the repository). In CI (CI=true) their absence is an error;
outside CI the tests that need them (the ``shared_traces`` fixture) are skipped, and the
terminal summary says how many in one line, so a quick loop cannot pass quietly without
them.

Markers: `slow` (launches training processes or servers, or inflates gigabytes) and
`browser` (drives headless Chromium). `pytest -q` skips both (pyproject's addopts);
`pytest -q -m "" -n 3 --dist loadfile` runs everything, as CI does: each test file on one
worker, so the jobs a file's module or session fixture records are recorded once (tests of
one file spread over several workers recorded them once per worker). A test that uses one of the fixtures
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if RECORDING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
