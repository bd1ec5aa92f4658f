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
from streamlit.errors import StreamlitAPIException

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
    found = runs.find_run(refs, wanted)
    if found is not None:
        return found
    several = runs.ambiguity(refs, wanted)
    if several:  # two runs of that name: say so, with both (probe 31l, F4)
        views.ambiguous_url_value("run", wanted, several, f"showing {refs[0].label}")
        return 0
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


SHOWN_IN_URL = "shown_in_url"  # session state: the (run, view) this app last wrote to the URL
VIEW = "view"  # the view radio's key and the URL's parameter


def url_navigated() -> bool:
    """True when the browser changed the page's URL since this app last wrote it (Back or
    Forward: the browser reruns the app with the entry's URL): the URL's run and view are
    then the ones to show, not the session's. A first draw reads the URL anyway."""
    wrote = st.session_state.get(SHOWN_IN_URL)
    if wrote is None:
        return False
    return (st.query_params.get("run"), st.query_params.get(VIEW)) != tuple(wrote)


def _run_select(
    labels: list[str],
    live_labels: set[str],
    refs: list[runs.RunRef],
    roots: list[Path],
    navigated: bool,
) -> str:
    """The run select. The browser keeps a select's text once drawn, so a run that
    stopped being live kept its "(live)" until a reload: the select's key names the
    live runs (``run`` when there are none), a new select when that set changes, which
    starts from the run shown. After Back or Forward (``navigated``) the URL's run is
    shown: the session's own choice was kept, so Back restored the URL and not the page
    (probe D3)."""
    selected = st.session_state.get(SELECTED)
    if navigated or selected not in labels:
        selected = labels[_initial_run(refs, roots)]
    key = "run"
    if live_labels:
        key += "_live_" + hashlib.sha1("\n".join(sorted(live_labels)).encode()).hexdigest()[:10]
    if navigated or st.session_state.get(key) not in labels:
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


def _view_select(navigated: bool) -> str:
    """The view radio. On a first draw, and after Back or Forward, it shows the URL's
    ?view= (an unknown one gets one line and the Overview); else the reader's choice."""
    first = SHOWN_IN_URL not in st.session_state
    if first or navigated:
        asked = st.query_params.get(VIEW)
        if asked and asked not in views.VIEWS:
            views.bad_url_value(
                VIEW, asked, "the dashboard's views", f"showing {next(iter(views.VIEWS))}"
            )
        st.session_state[VIEW] = asked if asked in views.VIEWS else next(iter(views.VIEWS))
    return str(st.sidebar.radio("View", list(views.VIEWS), key=VIEW))


def _to_url(label: str, view: str, partner: str | None) -> None:
    """The run and view shown (and Compare's Run B) into the page's URL in one write:
    shareable, and the browser adds one history entry per page shown, so Back steps
    through the runs and views. The view is written here, not bound to the URL by
    Streamlit: a bound widget's click replaces the URL in place, and Back skipped every
    view (probe D3). Run B's select is bound once drawn: Streamlit writes it then."""
    wanted = {"run": label, VIEW: view}
    if partner is not None:
        wanted[views.PARTNER] = partner
    st.session_state[SHOWN_IN_URL] = (label, view)
    if all(st.query_params.get(k) == v for k, v in wanted.items()):
        return
    try:
        st.query_params.update(wanted)
    except StreamlitAPIException:  # Run B's select is bound: the run and view alone
        wanted.pop(views.PARTNER, None)
        st.query_params.update(wanted)


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
    navigated = url_navigated()
    label = _run_select(labels, live_labels, refs, roots, navigated)
    view = _view_select(navigated)
    ref = refs[labels.index(label)]
    compare_b = views.init_partner(ref, refs) if view == "Compare" and len(refs) > 1 else None
    _to_url(label, view, compare_b)
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
