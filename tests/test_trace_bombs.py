"""Trace files that are mostly zeros (issue 28 section 3, F3/F4/M3): a gzip trace whose
tail is zero bytes (a preallocated or crash-recovered file), a small gzip that inflates
to hundreds of MiB of zeros, an all-zero file named like a trace (gzip name or not).
Each runs the real ``gpudiag analyze --json`` in a subprocess on a copy of a recorded
2-rank run: bounded time (the subprocess timeout), bounded memory (its peak RSS, under
an address-space limit), exit 2 and one warning line naming the file; rank 1 (and,
where the trace itself is sound, rank 0) still analysed."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
from fuzz_inputs import limit_memory

from gpudiag.analysis.ingest import load_trace

RUN = Path(__file__).resolve().parents[1] / "sample_runs" / "ddp2_healthy"
TIMEOUT_S = 30  # each run takes ~1-3 s; before, a 512 MiB zero tail took ~50-80 s
# Peak RSS of `analyze` on this run is ~145 MiB; before, 300 MiB of inflated zeros
# peaked at ~2x that (1.93 GB for 900 MiB), the whole text held and copied.
PEAK_RSS_BYTES = 300 << 20

# Runs `gpudiag analyze` and prints its peak RSS (bytes) as the last line of stderr.
_MEASURED = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.run(sys.argv[1:]).returncode\n"
    "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024\n"
    "print(f'peak_rss={peak}', file=sys.stderr)\n"
    "sys.exit(rc)\n"
)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(RUN, dest)
    return dest


def _analyze(run: Path) -> tuple[int, dict, list[str], int]:
    """(exit code, the JSON report, stderr's warning lines, peak RSS in bytes)."""
    cmd = [sys.executable, "-m", "gpudiag", "analyze", str(run), "--json", "--workers", "1"]
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURED, *cmd],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=limit_memory,
    )
    lines = proc.stderr.splitlines()
    assert lines and lines[-1].startswith("peak_rss="), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, lines[:-1], int(lines[-1].split("=")[1])


def _one_warning(lines: list[str], path: Path, words: str) -> str:
    hits = [w for w in lines if str(path) in w]
    assert len(hits) == 1, lines
    assert hits[0].startswith(f"gpudiag: warning: {path}: ") and words in hits[0], hits
    return hits[0]


def _ranks(report: dict) -> list[int]:
    return sorted(r["rank"] for r in report.get("ranks", []))


def _zeros_gzip(path: Path, mib: int, prefix: bytes = b"") -> None:
    """A small gzip (level 1: ~4.6 KiB per MiB) inflating to ``prefix`` + ``mib`` MiB of zeros."""
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    block = b"\0" * (1 << 20)
    with path.open("wb") as fh:
        fh.write(comp.compress(prefix))
        for _ in range(mib):
            fh.write(comp.compress(block))
        fh.write(comp.flush())


@pytest.mark.parametrize(
    ("tail", "kind"),
    [(512 << 20, "zeros"), (7, "not gzip")],
    ids=["512MiB_of_zeros", "garbage"],
)
def test_data_after_the_gzip_stream_is_one_warning(run: Path, tail: int, kind: str) -> None:
    """F3: the trace is read up to the end of its gzip stream, never through the tail
    (Python's gzip module skipped zero padding a byte at a time, ~6-10 MB/s, silently)."""
    trace = run / "traces" / "rank0.pt.trace.json.gz"
    size = trace.stat().st_size
    if kind == "zeros":
        os.truncate(trace, size + tail)  # sparse: costs no disk
    else:
        with trace.open("ab") as fh:
            fh.write(b"garbage")
    rc, report, lines, peak = _analyze(run)
    line = _one_warning(lines, trace, f"{tail} bytes of trailing data after the gzip stream")
    assert f"({kind}); ignored" in line
    assert rc == 2
    assert _ranks(report) == [0, 1]  # the trace itself is whole: analysed
    assert peak < PEAK_RSS_BYTES


def _gzip_bomb(trace: Path) -> Path:
    _zeros_gzip(trace, 300)
    return trace


def _gzip_bomb_after_a_brace(trace: Path) -> Path:
    _zeros_gzip(trace, 300, b'{"traceEvents": [{"ph": "X", "name": "a"}, ')
    return trace


def _zeros_named_gz(trace: Path) -> Path:
    trace.write_bytes(b"")
    os.truncate(trace, 300 << 20)  # sparse
    return trace


def _zeros_uncompressed(trace: Path) -> Path:
    trace.unlink()
    plain = trace.with_name("rank0.pt.trace.json")
    plain.write_bytes(b"")
    os.truncate(plain, 100 << 20)
    return plain


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (_gzip_bomb, "not a JSON trace (its text begins with b'\\x00"),
        (_gzip_bomb_after_a_brace, "malformed JSON (a NUL byte at byte 43"),
        (_zeros_named_gz, "not a JSON trace"),
        (_zeros_uncompressed, "not a JSON trace"),
    ],
    ids=["gzip_of_300MiB_zeros", "json_head_then_zeros", "zeros_named_gz", "zeros_json_M3"],
)
def test_zeros_are_refused_at_the_first_chunk(run: Path, make, words: str) -> None:
    """F4 / M3: refused before the text is held (was: inflated whole, then rejected as
    malformed JSON at char 0; the uncompressed rank0.pt.trace.json was not read at all)."""
    bad = make(run / "traces" / "rank0.pt.trace.json.gz")
    rc, report, lines, peak = _analyze(run)
    _one_warning(lines, bad, words)
    assert rc == 2
    assert _ranks(report) == [1]
    assert peak < PEAK_RSS_BYTES


def test_gzip_members_and_a_plain_json_trace_read_as_before(tmp_path: Path) -> None:
    """Several gzip members are one stream (no warning); a sound uncompressed
    rank<R>.pt.trace.json in a run directory is that rank's trace."""
    text = gzip.decompress((RUN / "traces" / "rank0.pt.trace.json.gz").read_bytes())
    whole, _ = load_trace(RUN / "traces" / "rank0.pt.trace.json.gz")
    members = tmp_path / "rank0.pt.trace.json.gz"
    cut = len(text) // 3
    members.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    split, notes = load_trace(members)
    assert whole is not None and split is not None and notes == []
    assert split.events.equals(whole.events)

    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    (run / "traces" / "rank0.pt.trace.json.gz").unlink()
    (run / "traces" / "rank0.pt.trace.json").write_bytes(text)
    rc, report, lines, _ = _analyze(run)
    assert rc == 0, lines
    assert _ranks(report) == [0, 1]
