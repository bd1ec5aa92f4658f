"""Probe 31m: "every rank" was written three ways for one finding on the DLRM GPU set:
"all 8 ranks" (the verdict), "ranks 0, 1, 2, 3, 4, 5, 6 and 7" (the terminal's and the
HTML report's finding headers), "0, 1, 2, 3, 4, 5, 6, 7" (the dashboard's findings
table). One wording now, in every view; a finding naming some ranks keeps naming them.
Recorded GPU traces (../shared/traces) and the dashboard through AppTest."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console
from streamlit.testing.v1 import AppTest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # dashboards/ is not an installed package

from gpudiag.analysis import analyze  # noqa: E402
from gpudiag.report import jsonout  # noqa: E402
from gpudiag.report.html import render_html  # noqa: E402
from gpudiag.report.terminal import print_report  # noqa: E402

APP = REPO / "dashboards" / "app.py"


def test_a_finding_on_every_rank_reads_the_same_in_every_view(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    run = shared_traces / "param_dlrm_ddp8"
    result = analyze(run)
    buf = io.StringIO()
    jsonout.write_results([result], buf)
    payload = json.loads(buf.getvalue())
    every = {f["kind"] for f in payload["findings"] if sorted(f["ranks"]) == list(range(8))}
    some = {f["kind"]: f["ranks"] for f in payload["findings"] if 0 < len(f["ranks"]) < 8}
    assert "gpu_idle" in every and "dataloader_stall" in some
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=400, color_system=None))
    terminal = dict(re.findall(r"\[\w+\] (\w+)\s+[0-9.]+ ms/step\s+(.+?) ─", buf.getvalue()))
    html = dict(re.findall(r"<b>(\w+)</b> — [^—]+ — ([^<]+)<p>", render_html([result])))
    monkeypatch.setattr(sys, "argv", ["app.py", str(run)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    table = at.table[0].value
    dashboard = {
        str(k).replace("\\", ""): str(r).replace("\\", "")
        for k, r in zip(table["kind"], table["ranks"], strict=True)
    }
    assert "all 8 ranks" in at.error[0].value  # the verdict's words
    for name, view in {"terminal": terminal, "html": html, "dashboard": dashboard}.items():
        for kind in every:
            assert view[kind] == "all 8 ranks", (name, kind, view)
        for kind, ranks in some.items():  # named as numbers.ranks names them
            named = [str(r) for r in ranks]
            words = (
                f"rank {named[0]}"
                if len(named) == 1
                else (f"ranks {', '.join(named[:-1])} and {named[-1]}")
            )
            assert view[kind] == words, (name, kind, view)


def test_a_cost_over_every_rank_beside_the_ranks_named_says_so(
    monkeypatch: pytest.MonkeyPatch, shared_traces: Path
) -> None:
    """Megatron TP8: gpu_idle's 69.59 ms/step is the mean over all 8 ranks (their GPU
    idle columns), while its header named ranks 0, 2, 3 and 6 (whose own mean is about
    131 ms): every view now says what the mean is over."""
    run = shared_traces / "astrasim_megatron_tp8"
    result = analyze(run)
    buf = io.StringIO()
    jsonout.write_results([result], buf)
    payload = json.loads(buf.getvalue())
    (idle,) = [f for f in payload["findings"] if f["kind"] == "gpu_idle"]
    per_rank = {r["rank"]: r["idle"] + r["other"] for r in payload["ranks"]}
    assert sum(per_rank.values()) / 8 == pytest.approx(idle["cost_ms_per_step"], abs=0.01)
    named = sorted(idle["ranks"])
    assert sum(per_rank[r] for r in named) / len(named) > 1.5 * idle["cost_ms_per_step"]
    words = "most on ranks 0, 2, 3 and 6 (its ms/step: the mean over all 8 ranks)"
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=400, color_system=None))
    assert f"gpu_idle  {idle['cost_ms_per_step']:.2f} ms/step  {words}" in buf.getvalue()
    assert words in render_html([result])
    monkeypatch.setattr(sys, "argv", ["app.py", str(run)])
    at = AppTest.from_file(str(APP), default_timeout=180)
    at.run()
    table = at.table[0].value
    cells = [
        str(r).replace("\\", "")
        for k, r in zip(table["kind"], table["ranks"], strict=True)
        if str(k).replace("\\", "") == "gpu_idle"
    ]
    assert cells == [words]


@pytest.mark.parametrize(
    ("source", "expected"),
    [("traces/tracelens_mi300_ddp", "rank 0"), ("sample_runs/ddp4_straggler", "all 4 ranks")],
)
def test_a_finding_that_names_no_rank_reads_as_the_ranks_analysed(
    shared_traces: Path, source: str, expected: str
) -> None:
    """A finding that lists no rank is about every analysed rank: "all ranks" said more
    than was analysed on a trace set with one rank of 8, and sat beside "all 4 ranks" in
    one report (probe 31n, D7). The terminal's headers and the verdict say the ranks."""
    run = (shared_traces.parent if source.startswith("traces/") else REPO) / source
    result = analyze(run)
    unnamed = [f for f in result.findings if not f.ranks]
    assert unnamed, [f.kind for f in result.findings]
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=200, color_system=None))
    headers = [line for line in buf.getvalue().splitlines() if re.search(r"\d+\. \[", line)]
    for f in unnamed:
        (header,) = [h for h in headers if f" {f.kind} " in h]
        assert expected in header and "all ranks" not in header, header
    assert "all ranks" not in render_html([result])
