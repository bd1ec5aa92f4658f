"""The terminal's findings header states the order the list is in (probe 31l, F3): it
said "severity, then cost per step" above dataloader_stall 41.47 ms/step listed before
the straggler 42.81 it causes (docs/findings.md "Order": a cause goes just above it).
Read on the recorded job whose rank 1 waits for its collate (tests/fixtures/collate_rank1):
every adjacent pair of the printed list must follow a rule the header states."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from gpudiag.analysis import analyze
from gpudiag.report.terminal import print_report

RUN = Path(__file__).resolve().parent / "fixtures" / "collate_rank1" / "collate40"
SEVERITY = {"high": 0, "medium": 1, "low": 2}
FAILURES = ("rank_failed", "hang", "desync")


def test_findings_header_states_the_order_the_list_follows() -> None:
    result = analyze(RUN)
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=300, color_system=None))
    text = buf.getvalue()
    header = next(line for line in text.splitlines() if line.startswith("Findings ("))
    printed = re.findall(r"\d+\. \[(HIGH|MEDIUM|LOW)\] (\w+)\s+([\d.]+) ms/step", text)
    assert [k for _, k, _ in printed][:2] == ["dataloader_stall", "straggler"], printed
    by_kind = {f.kind: f for f in result.findings}
    stated_cause_rule = "a cause just above what it causes" in header
    assert "failures first" in header and "then severity, then cost" in header, header
    for (sa, ka, ca), (sb, kb, cb) in zip(printed, printed[1:], strict=False):
        if ka in FAILURES or SEVERITY[sa.lower()] < SEVERITY[sb.lower()]:
            continue
        if SEVERITY[sa.lower()] == SEVERITY[sb.lower()] and float(ca) >= float(cb):
            continue
        # otherwise only the cause rule explains it: the header must state it
        assert by_kind[kb].evidence.get("caused_by") == ka, (ka, kb)
        assert stated_cause_rule, header
