"""The dashboard's analysis cache, shared by the app's script runs and the server's
start-up prewarm (dashboards/serve.py): one AnalysisResult per run, keyed by the run's
content (file names, sizes, mtimes).

It is a plain module-level cache, not ``st.cache_resource``: Streamlit lets any web
client clear every ``st.cache_*`` cache with one ``clear_cache`` message (the "Clear
caches" menu item), which would make every large run be analysed again from scratch.
Nothing a client sends reaches this one. It also works outside a script run (the
prewarm thread) without Streamlit's "missing ScriptRunContext" warnings.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from gpudiag.analysis.result import AnalysisResult

from . import runs

V = TypeVar("V")
Analysis = tuple[AnalysisResult | None, str | None]

MAX_ANALYSES = 16
MAX_TIMELINES = 64


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


class LruCache(Generic[V]):
    """A thread-safe least-recently-used cache that computes each key once: a second
    caller asking for a key being computed waits for that result."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.computed = 0  # how many values were computed (tests, benchmarks)
        self._lock = threading.Lock()
        self._values: OrderedDict[Hashable, V] = OrderedDict()
        self._pending: dict[Hashable, threading.Lock] = {}

    def peek(self, key: Hashable) -> V | None:
        with self._lock:
            return self._values.get(key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)

    def get(self, key: Hashable, compute: Callable[[], V]) -> V:
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]
            pending = self._pending.setdefault(key, threading.Lock())
        with pending:
            with self._lock:
                if key in self._values:
                    return self._values[key]
            value = compute()
            with self._lock:
                self.computed += 1
                self._values[key] = value
                self._values.move_to_end(key)
                while len(self._values) > self.max_entries:
                    self._values.popitem(last=False)
                self._pending.pop(key, None)
            return value


ANALYSES: LruCache[Analysis] = LruCache(MAX_ANALYSES)


def _analyse(path: str) -> Analysis:
    """(AnalysisResult, None) or (None, one-line error)."""
    try:
        from gpudiag.analysis import analyze

        return analyze(path), None
    except Exception as exc:  # the app must never die on a bad run
        return None, f"{path}: cannot be analysed ({first_line(exc)})"


def key_of(ref: runs.RunRef) -> tuple[str, str]:
    return str(ref.path), runs.fingerprint(ref.path)


def result_of(ref: runs.RunRef) -> Analysis:
    """The run's analysis, computed once per content key (any thread)."""
    key = key_of(ref)
    return ANALYSES.get(key, lambda: _analyse(key[0]))


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
