"""One colour per step-time component, in every chart: the Overview's per-rank bars (its
plotly figure and its inline SVG), the Timeline, the Step breakdown, Compare, the Live
view, GPU busy, DataParallel and the HTML report all take a component's colour from
:data:`COMPONENT_COLORS` through :func:`component_color` (issue 31: "waiting for late
peers" was red in the Overview and the same red drew exposed communication, the live
view's "last step" and a rank in the all-reduce chart).

The palette is Okabe & Ito's colour-blind safe set, extended with Paul Tol's where more
components need a colour; no two components share one. Colours that mean no component
(the whole step, the two runs of Compare, the ranks of the all-reduce chart) are kept
apart here too, so a chart never borrows a component's colour for something else.
Presentation only: nothing here is measured.
"""

from __future__ import annotations

COMPONENT_COLORS: dict[str, str] = {
    # the per-rank / per-step breakdown (analysis.result.BREAKDOWN_KEYS and the split of
    # exposed communication into the wait for late peers and the transfer)
    "compute": "#0072B2",  # blue
    "comm_overlapped": "#56B4E9",  # sky blue
    "comm_exposed": "#CC79A7",  # reddish purple
    "comm_transfer": "#882255",  # wine
    "comm_wait": "#D55E00",  # vermillion
    "data_loading": "#E69F00",  # orange
    "other": "#999933",  # olive: no kernel, host busy (CPU runs: in a recorded range)
    "idle": "#BBBBBB",  # grey: nothing running
    "optimizer": "#009E73",  # bluish green
    # the Timeline's lane of every communication kernel, overlapped or exposed
    "communication": "#AA4499",  # purple
    # GPU busy: any kernel or copy on the device (compute is "compute")
    "gpu_busy": "#332288",  # indigo
    # GPU metrics' compute kernels, a collective running or not: not the breakdown's
    # "compute" (kernels and copies while no collective runs), so not its blue
    # (dark cyan: the cyan #88CCEE it had read as overlapped communication's sky blue
    # beside it, probe 31g)
    "compute_kernels": "#225555",  # dark cyan
    # DataParallel's stages (analysis.dataparallel.STAGES), keyed "dp_<stage>"
    "dp_scatter": "#F0E442",  # yellow
    "dp_replicate": "#44AA99",  # teal
    "dp_parallel_apply": "#117733",  # green
    "dp_gather": "#661100",  # brown
    "dp_reduce_add": "#EE3377",  # magenta (steel blue #6699CC read as overlapped comm)
}
# A component the mapping does not know (a lane or stage added later) is drawn in this
# one fixed colour, never in plotly's next default.
FALLBACK_COLOR = "#DDCC77"  # sand

# Colours for what is not a component.
STEP_COLOR = "#444444"  # the whole step (timeline bands, the live view's median step)
LAST_STEP_COLOR = "#000000"  # the live view's last-step markers
OUTLINE_COLOR = "#111111"  # the ranks a finding names
RUN_COLORS = ("#8C8C8C", "#2B2B2B")  # Compare's runs A and B, where bars are not components
MEASURED_COLOR = "#4D4D4D"  # a measure that is no component (bus bandwidth, a lint cost)
# The ranks of the all-reduce chart: three greys none of the components uses, each with a
# fill pattern after the first three ranks, so a rank is never read as a component (rank 4
# was drawn in the red of "waiting for late peers").
RANK_PALETTE = ("#000000", "#4D4D4D", "#7A7A7A")  # darker than idle's grey
RANK_PATTERNS = ("", "/", "x", ".", "\\", "+", "-", "|")
# A measured series that is no component (a GPU's or a host's metric over time): greys
# and black, then the same with dashes (they were plotly's blue and red, probe 31g)
SERIES_COLORS = ("#000000", "#7A7A7A", "#4D4D4D")
SERIES_DASHES = ("solid", "dash", "dot", "dashdot")


def series_line(index: int) -> dict[str, str]:
    """The line of the ``index``-th series of a metric chart (``go.Scatter(line=...)``)."""
    return {
        "color": SERIES_COLORS[index % len(SERIES_COLORS)],
        "dash": SERIES_DASHES[(index // len(SERIES_COLORS)) % len(SERIES_DASHES)],
    }


PEAK_COLOR = "#000000"  # a reference line (link peak, projected DDP step)
THROTTLE_COLOR = "#000000"  # throttled spans of a GPU metric, shaded (no component's red)


def rank_style(i: int) -> tuple[str, str]:
    """(colour, fill pattern) of the ``i``-th rank drawn in the all-reduce chart: a
    pattern of its own for each of the first eight ranks (ranks 3, 4 and 5 shared one
    hatching in three greys, told apart by shade alone at 8 ranks: probe 31j, D9), the
    greys in turn as well."""
    return RANK_PALETTE[i % len(RANK_PALETTE)], RANK_PATTERNS[i % len(RANK_PATTERNS)]


def component_color(key: str) -> str:
    """The one colour of component ``key`` (:data:`COMPONENT_COLORS`), or
    :data:`FALLBACK_COLOR` for a key it does not know."""
    return COMPONENT_COLORS.get(key, FALLBACK_COLOR)


__all__ = [
    "COMPONENT_COLORS",
    "FALLBACK_COLOR",
    "LAST_STEP_COLOR",
    "MEASURED_COLOR",
    "OUTLINE_COLOR",
    "PEAK_COLOR",
    "RANK_PALETTE",
    "RANK_PATTERNS",
    "RUN_COLORS",
    "STEP_COLOR",
    "THROTTLE_COLOR",
    "component_color",
    "rank_style",
]
