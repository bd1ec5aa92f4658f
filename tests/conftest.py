"""Shared test fixtures.

../shared/traces holds real GPU traces from other public projects. Tests read them in
place (never copied into the repository). In CI (CI=true) their absence is an error;
outside CI the tests that need them are skipped.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_TRACES = REPO.parent / "shared" / "traces"
SAMPLE_RUNS = REPO / "sample_runs"


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED_TRACES} is missing: CI must have ../shared/traces")
        pytest.skip(f"{SHARED_TRACES} not present (outside CI)")
    return SHARED_TRACES
