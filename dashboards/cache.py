"""The dashboard's analysis cache, shared by the app's script runs and the server's
start-up prewarm (dashboards/serve.py): one AnalysisResult per run, keyed by the run's
content (file names, sizes, mtimes)."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboards import runs


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
