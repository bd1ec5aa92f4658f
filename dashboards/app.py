"""gpudiag dashboard: `streamlit run dashboards/app.py -- RUN_OR_ROOT ...`
(normally started by `gpudiag dashboard`).

Presentation only: every number comes from `gpudiag.analysis.analyze`, cached per run
and keyed by the run's content (file names, sizes, mtimes). A run still being written
(manifest ``running``, launcher alive) is shown live instead (dashboards/live_page.py: the
`gpudiag watch` snapshot, refreshed in place) until it ends. The runs it can open are
the ones found under the roots given; URL query parameters (`?run=...&view=...`) are
resolved against those roots and refused when they point elsewhere. The page's URL
always names the run and view shown, so it can be shared.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pandas as pd
import streamlit as st

from gpudiag.analysis.result import AnalysisResult

# Streamlit runs this file by path. Installed, it is gpudiag/dashboards/app.py inside the
# package; in a source checkout, dashboards/ sits beside gpudiag/.
if (Path(__file__).resolve().parents[1] / "__init__.py").is_file():
    from gpudiag.dashboards import (  # type: ignore[import-not-found,no-redef,unused-ignore]
        cache,
        runs,
        views,
    )
    from gpudiag.dashboards import (  # type: ignore[import-not-found,no-redef,unused-ignore]
        live_page as live,
    )
else:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from dashboards import cache, runs, views
    from dashboards import live_page as live


def _roots() -> list[Path]:
    args = [a for a in sys.argv[1:] if a and not a.startswith("-")]
    return [Path(a) for a in args] if args else list(runs.DEFAULT_ROOTS)


def result_of(ref: runs.RunRef) -> cache.Analysis:
    """The run's analysis; a spinner while it is computed for this page."""
    cached = cache.ANALYSES.peek(cache.key_of(ref))
    if cached is not None:
        return cached
    with st.spinner(f"Analysing {views.md(ref.label)}…"):
        return cache.result_of(ref)


TIMELINES: cache.LruCache[pd.DataFrame] = cache.LruCache(cache.MAX_TIMELINES)


def _timeline(result: AnalysisResult, ranks: tuple[int, ...] | None, budget: int) -> pd.DataFrame:
    return result.timeline(None, max_intervals=budget, ranks=ranks)


def timeline_of(
    result: AnalysisResult, ref: runs.RunRef, ranks: tuple[int, ...] | None, budget: int
) -> pd.DataFrame:
    key = (*cache.key_of(ref), ranks, budget)
    return TIMELINES.get(key, lambda: _timeline(result, ranks, budget))


def _initial_run(refs: list[runs.RunRef], roots: list[Path]) -> int:
    """Index of the run named by ?run= (a label or a path inside the roots), else 0."""
    wanted = st.query_params.get("run")
    if not wanted:
        return 0
    labels = [r.label for r in refs]
    if wanted in labels:
        return labels.index(wanted)
    if not Path(wanted).is_absolute() and ".." not in Path(wanted).parts:
        # a run's label mistyped, not a path leaving the roots: say that (browser probe)
        views.bad_url_value("run", wanted, "the runs found", f"showing {refs[0].label}")
        return 0
    try:
        path = runs.confine(wanted, roots)
    except runs.PathOutsideRoots as exc:
        st.error(views.md(exc))
        return 0
    paths = [r.path for r in refs]
    if path in paths:
        return paths.index(path)
    st.error(views.md(f"{wanted}: not a run under the dashboard's roots"))
    return 0


SELECTED = "selected_run"  # session state: the run shown, whichever select chose it


def select_run(label: str) -> None:
    """Show ``label`` (a callback: Compare's Run A): the sidebar's select restarts from
    it, whatever its key (:func:`_run_select`)."""
    st.session_state[SELECTED] = label
    for key in [k for k in st.session_state if k == "run" or str(k).startswith("run_live_")]:
        del st.session_state[key]


def _run_select(
    labels: list[str], live_labels: set[str], refs: list[runs.RunRef], roots: list[Path]
) -> str:
    """The run select. The browser keeps a select's text once drawn, so a run that
    stopped being live kept its "(live)" until a reload: the select's key names the
    live runs (``run`` when there are none), a new select when that set changes, which
    starts from the run shown."""
    selected = st.session_state.get(SELECTED)
    if selected not in labels:
        selected = labels[_initial_run(refs, roots)]
    key = "run"
    if live_labels:
        key += "_live_" + hashlib.sha1("\n".join(sorted(live_labels)).encode()).hexdigest()[:10]
    if st.session_state.get(key) not in labels:
        st.session_state[key] = selected
    label = str(
        st.sidebar.selectbox(
            "Run",
            labels,
            key=key,
            format_func=lambda x: f"● {x} (live)" if x in live_labels else x,
        )
    )
    st.session_state[SELECTED] = label
    return label


def main() -> None:
    st.set_page_config(page_title="gpudiag", layout="wide")
    roots = _roots()
    refs = runs.discover_runs(roots)
    st.sidebar.title("gpudiag")
    if not refs:
        st.title("gpudiag dashboard")
        st.warning(
            "No runs found under: "
            + views.md(", ".join(str(r) for r in roots))
            + ". Record one with `gpudiag trace train.py` or pass run/trace directories."
        )
        return
    labels = [r.label for r in refs]
    live_labels = {r.label for r in refs if runs.is_live(r)}
    label = _run_select(labels, live_labels, refs, roots)
    # The view is bound to ?view= by Streamlit itself (the browser writes the URL when
    # it is clicked): set from Python, a click during a live run's refreshes reached the
    # URL one click late (browser probe of issue 31). An unknown ?view= is dropped.
    asked = st.query_params.get("view")
    if asked and asked not in views.VIEWS:
        views.bad_url_value(
            "view", asked, "the dashboard's views", f"showing {next(iter(views.VIEWS))}"
        )
    view = st.sidebar.radio("View", list(views.VIEWS), key="view", bind="query-params")
    st.query_params["run"] = label  # a shareable URL
    ref = refs[labels.index(label)]
    st.sidebar.caption(views.md(ref.path))
    if label in live_labels:
        st.sidebar.caption("Live: the views open when the run ends.")
        live.live_page(ref)
        return
    live.ended_note(ref)

    result, error = result_of(ref)
    if error or result is None:
        st.error(views.md(error))
        st.info("Other runs and views still work: pick another run in the sidebar.")
        return
    ctx = views.ViewContext(
        ref=ref,
        result=result,
        roots=roots,
        all_runs=refs,
        result_of=result_of,
        timeline_of=timeline_of,
        select_run=select_run,
    )
    try:
        views.VIEWS[view](ctx)
    except Exception as exc:  # a view must never take the app down with it
        st.error(views.md(f"{view}: could not render this run ({cache.first_line(exc)})"))


cache.activity.started()
try:
    main()
except Exception as exc:  # one line for the reader, never a traceback with server paths
    st.error(views.md(f"The dashboard cannot show this page ({cache.first_line(exc)})"))
finally:
    cache.activity.finished()
