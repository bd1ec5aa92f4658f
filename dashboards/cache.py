"""The dashboard's analysis cache, shared by the app's script runs and the server's
start-up prewarm (dashboards/serve.py): one AnalysisResult per run, keyed by the run's
content (file names, sizes, mtimes)."""

from __future__ import annotations

import threading
import time
from typing import Any

import streamlit as st

from . import runs


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


@st.cache_resource(max_entries=16, show_spinner="Analysing run…")
def _analysis(path: str, content_key: str) -> tuple[Any, str | None]:
    """(AnalysisResult, None) or (None, one-line error). content_key is only the cache key."""
    try:
        from gpudiag.analysis import analyze
    except ImportError as exc:
        return None, f"gpudiag.analysis is not available ({first_line(exc)})"
    try:
        return analyze(path), None
    except Exception as exc:  # the app must never die on a bad run
        return None, f"{path}: cannot be analysed ({first_line(exc)})"


def result_of(ref: runs.RunRef) -> tuple[Any, str | None]:
    return _analysis(str(ref.path), runs.fingerprint(ref.path))


class ScriptActivity:
    """When the app's script last ran, so background work can wait for a quiet server:
    the browser is still loading its scripts and drawing charts after a run ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._last_end = 0.0

    def started(self) -> None:
        with self._lock:
            self._running += 1

    def finished(self) -> None:
        with self._lock:
            self._running -= 1
            self._last_end = time.monotonic()

    def ever_ran(self) -> bool:
        with self._lock:
            return bool(self._running or self._last_end)

    def quiet_for(self) -> float:
        """Seconds since the last script run ended; 0 while one runs or before the first."""
        with self._lock:
            if self._running or not self._last_end:
                return 0.0
            return time.monotonic() - self._last_end


activity = ScriptActivity()
