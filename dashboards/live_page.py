"""The dashboard's live mode: a run still being written (manifest ``running``, launcher
alive) is shown as `gpudiag watch` shows it, and the page refreshes itself.

The refresh is a Streamlit fragment with ``run_every``: only the live panel reruns, in
the open page, without a browser reload. Each run is followed by one
:class:`gpudiag.analysis.live_snapshot.LiveMonitor` kept in a module-level cache (shared by every
session and tab, out of reach of a client's "clear caches", see cache.py), so a refresh
reads only the rows appended since the previous one and its cost stays flat however
long the run. The numbers are the monitor's snapshot, rendered; nothing is computed
here. When the run stops being written the whole app reruns and shows the run's
post-mortem views.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from gpudiag.analysis.live_snapshot import (
    COLLECTIVES_DELAY_S,
    COLLECTIVES_MIN_DELAY_S,
    LiveMonitor,
    LiveSnapshot,
)
from gpudiag.report import figures, numbers, tables

from . import cache, runs
from .views import md
from .widgets import show_table

REFRESH_S = 2.0  # the fragment's rerun interval in the browser
# Sessions (tabs) refreshing within this of each other share one read of the run.
MIN_POLL_S = 0.5
MAX_MONITORS = 8
WATCHED_KEY = "live_watched"  # session state: labels of the runs this session saw live

MONITORS: cache.LruCache[LiveMonitor] = cache.LruCache(MAX_MONITORS)

STATE_LEVEL = {
    "running": "info",
    "ok": "success",
    "failed": "error",
    "hang": "error",
    "hang_suspected": "warning",
    "launcher_lost": "warning",
    "interrupted": "warning",
}


def monitor_of(ref: runs.RunRef) -> LiveMonitor:
    return MONITORS.get(str(ref.path), lambda: LiveMonitor(ref.path, min_interval_s=MIN_POLL_S))


def _table(frame: pd.DataFrame) -> None:
    """Every cell through the one formatter (decimals by the column's unit, the one
    missing mark), escaped, with the line a too-wide table gets (widgets.show_table)."""
    show_table(frame, draw="whole")


def live_page(ref: runs.RunRef) -> None:
    """The header and the self-refreshing live panel of a running run."""
    st.header(f"Live · {md(ref.label)}")
    st.caption(
        f"{md(ref.path)} · still being written: this panel refreshes every "
        f"{REFRESH_S:g} s without reloading the page (the same numbers as `gpudiag watch`). "
        "The analysis views open when the run ends."
    )
    live_panel(ref)


@st.fragment(run_every=REFRESH_S)
def live_panel(ref: runs.RunRef) -> None:
    try:
        update = monitor_of(ref).refresh()
    except Exception as exc:  # a run being deleted or replaced under us: one line
        st.error(md(f"{ref.path}: cannot be read live ({cache.first_line(exc)})"))
        return
    st.session_state.setdefault(WATCHED_KEY, set()).add(ref.label)
    if not update.still_written:
        st.rerun()  # the run ended: the whole app reruns and shows its post-mortem views
    render_snapshot(update.snapshot)


def render_snapshot(snap: LiveSnapshot) -> None:
    state = tables.live_state_text(snap)
    getattr(st, STATE_LEVEL.get(snap.state, "info"))(f"State: {md(state)}")
    newest = tables.live_newest_step(snap)
    facts = {
        "State": state,
        "Ranks": len(snap.ranks),
        "Newest step": "–" if newest is None else newest,
        "Lagging ranks": numbers.ranks(snap.lagging) if snap.lagging else "none",
        "Stuck collectives": len(snap.stuck),
    }
    for col, (label, value) in zip(st.columns(len(facts)), facts.items(), strict=True):
        col.metric(label, md(value))
    _lagging(snap)
    for s in snap.stuck:
        st.error(
            md(
                f"Stuck: {s.op} (process group {s.pg}, seq {s.seq}) waiting {s.waiting_s:.1f} s;"
                f" {tables.stuck_arrived_text(snap, s)}"
            )
        )
    st.subheader("Per rank")
    if snap.ranks:
        st.plotly_chart(
            figures.live_rank_figure(snap),
            width="stretch",
            config={"displaylogo": False},
            key="live_rank_chart",
        )
        _table(tables.live_rank_frame(snap))
    else:
        st.write("No rank has written a step yet.")
    if snap.stuck:
        st.subheader("In-flight collectives past the stuck threshold")
        _table(tables.live_stuck_frame(snap))
    st.subheader("Per node")
    if snap.nodes:
        _table(tables.live_node_frame(snap))
    else:
        st.write("No host or GPU samples yet.")
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.t_ns / 1e9))
    st.caption(f"Updated {stamp} · rates and medians over the last {snap.window_steps} steps")


def _lagging(snap: LiveSnapshot) -> None:
    span = snap.lagging_window
    steps = f"steps {span[0]}–{span[1]}" if span else "the steps seen so far"
    newest = tables.live_newest_step(snap)
    if span and newest is not None and newest > span[1] + 1:
        steps += (
            f", the newest whose collectives every rank has written (they reach the run "
            f"directory in batches, every {COLLECTIVES_MIN_DELAY_S}-{COLLECTIVES_DELAY_S} s: "
            f"{newest - span[1]} steps behind step {newest})"
        )
    if snap.lagging:
        ranks = tables.live_rank_names(snap, snap.lagging)
        plural = "s" if len(snap.lagging) > 1 else ""
        st.warning(
            f"Lagging: rank{plural} {ranks} over {steps} (the straggler finding "
            "`gpudiag analyze` makes, on the recent window)"
        )
    elif span:
        st.caption(f"No lagging rank over {steps}.")
    else:
        st.caption("Lagging ranks: not enough collectives from every rank yet.")


def ended_note(ref: runs.RunRef) -> None:
    """Above the post-mortem views of a run this session watched live."""
    if ref.label in st.session_state.get(WATCHED_KEY, ()):
        status = runs.recorded_status(ref.path) or "ended"
        word = tables.LIVE_STATE_WORDS.get(status, status)
        st.info(f"The run ended while it was watched live ({md(word)}): its analysis below.")
