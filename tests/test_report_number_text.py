"""One number format in running text (issue 31, probe classes A, I, J): finding titles,
evidence lines and report headers write ms with two decimals and percentages with one
and a space ("76.8 %"), as the tables do; words are singular or plural as the count is."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from gpudiag.analysis import analyze
from gpudiag.numfmt import clip_words, ms_text, pct_text
from gpudiag.paths import sample_runs_dir
from gpudiag.report.html import render_html
from gpudiag.report.overview import evidence_lines
from gpudiag.report.terminal import print_report

# a number followed by a time unit or a percent sign, as a person reads it
_MS = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?) ?ms\b")
_PCT = re.compile(r"(?<![\w.])(-?\d+(?:\.\d+)?)( ?)%")


def _bad_numbers(text: str) -> list[str]:
    bad = [m.group(0) for m in _MS.finditer(text) if not re.fullmatch(r"-?\d+\.\d\d", m.group(1))]
    for m in _PCT.finditer(text):
        if m.group(2) != " " or not re.fullmatch(r"-?\d+\.\d", m.group(1)):
            bad.append(m.group(0))
    return bad


@pytest.fixture(scope="module", params=["ddp2_dataloader_bound", "ddp4_straggler"])
def result(request):
    return analyze(sample_runs_dir() / request.param, workers=1)


def test_numfmt_rule():
    assert ms_text(30.8123) == "30.81" and ms_text(-0.001) == "0.00"
    assert pct_text(76.84) == "76.8 %"


def test_titles_and_evidence_use_the_table_decimals(result):
    for f in result.findings:
        assert _bad_numbers(f.title) == [], f.title
        for line in evidence_lines(f.evidence):
            assert _bad_numbers(line) == [], line


def test_terminal_and_html_running_text(result):
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=400, color_system=None))
    lines = [ln for ln in buf.getvalue().splitlines() if "┃" not in ln and "│ " not in ln[:3]]
    assert _bad_numbers("\n".join(lines)) == []
    html = render_html([result])
    text = re.sub(r"<script.*?</script>|<style.*?</style>|<[^>]+>", " ", html, flags=re.S)
    assert "41.50 %" not in text and not re.search(r"\d%", text)


def test_shared_traces_titles(shared_traces):
    res = analyze(shared_traces / "param_dlrm_ddp8", workers=1)
    for f in res.findings:
        assert _bad_numbers(f.title) == [], f.title
        assert all(_bad_numbers(ln) == [] for ln in evidence_lines(f.evidence))


def test_counts_read_as_words(result):
    from gpudiag.numfmt import plural

    assert plural(1, "step") == "1 step" and plural(2, "problem") == "2 problems"
    buf = io.StringIO()
    print_report(result, console=Console(file=buf, width=400, color_system=None))
    html = re.sub(r"<script.*?</script>|<style.*?</style>", " ", render_html([result]), flags=re.S)
    text = buf.getvalue() + html
    assert not re.search(r"[a-z]\(s\)", text)
    steps = result.run.steps_analysed
    # the window named (probe 31m): "3 profiled steps analysed"
    assert f"{steps} profiled {'step' if steps == 1 else 'steps'} analysed" in text


def test_one_step_trace_wording(shared_traces):
    res = analyze(shared_traces / "param_dlrm_ddp8", workers=1)
    buf = io.StringIO()
    print_report(res, console=Console(file=buf, width=400, color_system=None))
    text = buf.getvalue()
    assert not re.search(r"[a-z]\(s\)", text) and "1 steps" not in text


def test_gpu_idle_verdict_calls_the_mean_a_mean(shared_traces):
    """probe 31, K: not "worst on" every rank, not "up to" a mean."""
    from gpudiag.report.overview import verdict

    res = analyze(shared_traces / "param_dlrm_ddp8", workers=1)
    head = verdict(res).headline
    assert "worst on" not in head and "up to" not in head, head
    assert "on all 8 ranks" in head and "(the mean over all 8 ranks)" in head, head


def test_a_cut_title_ends_at_a_word_with_an_ellipsis() -> None:
    """Probe 28d, defect 11: titles were cut mid-word at 160 or 240 characters without a
    mark ("... ranks 0, 1 then lost the"), reading as the whole message."""
    text = "rank 2 was ended with its node; ranks 0, 1 then lost the connection to it"
    assert clip_words(text, 200) == text
    cut = clip_words(text, 60)
    assert cut.endswith("…") and len(cut) <= 60 and text.startswith(cut[:-1])
    assert cut[:-1].split()[-1] in text.split()  # a whole word before the mark


def test_a_finding_heading_says_its_cost_once() -> None:
    """Probe 31g, defect 11: "the others wait 39.05 ms per step (39.05 ms/step)" in the
    Overview's expanders and the Communication view. A title that says its cost gets no
    second copy; one that does not gets it appended."""
    from gpudiag.report.overview import cost_suffix

    result = analyze(sample_runs_dir() / "ddp4_straggler")
    straggler = next(f for f in result.findings if f.kind == "straggler")
    cost = f"{straggler.cost_ms_per_step:.2f}"
    assert f"{cost} ms per step" in straggler.title and cost_suffix(straggler) == ""
    buckets = next(f for f in result.findings if f.kind == "bucket_size")
    assert cost_suffix(buckets) == f" ({buckets.cost_ms_per_step:.2f} ms/step)"
    assert f"{buckets.cost_ms_per_step:.2f}" not in buckets.title
