"""Bad input to ingestion and the core analysis (issue 7): every bad file gives one
warning line naming the file and the problem, and the rest is still analysed. Also the
files no reader should read (issue 16 part 3: surrogates, endless files, FIFOs,
permission denied), through the real CLI: see "unusable files" below."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from fuzz_inputs import can_deny, limit_memory, remove_tree, replace_unusable, unprivileged
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudiag import rundir
from gpudiag.analysis import comms, stragglers
from gpudiag.analysis.breakdown import comm_comp_overlap, run_breakdown
from gpudiag.analysis.ingest import find_traces, load_trace, load_traces

DLRM = "param_dlrm_ddp8"


def _dlrm_files(shared_traces: Path) -> list[Path]:
    return sorted((shared_traces / DLRM).glob("*.json.gz"))


def _analyse(traces) -> None:
    """The whole core analysis; must not raise on anything ingestion let through."""
    bd = run_breakdown(traces)
    table = comms.collective_table(traces)
    comms.collective_summary(table)
    comms.ddp_buckets(table)
    comms.allreduce_stall(traces, table)
    stragglers.stragglers(stragglers.arrival_skew(table), bd)
    for t in traces:
        comm_comp_overlap(t)


def _one_line_naming(warnings: list[str], path: Path, words: str) -> None:
    hits = [w for w in warnings if w.startswith(str(path)) and words in w]
    assert len(hits) == 1, warnings
    assert "\n" not in hits[0] and "Traceback" not in hits[0]


@pytest.fixture
def run_dir(shared_traces: Path, tmp_path: Path) -> Path:
    """Ranks 0-3 of the DLRM set, copied to a scratch directory to be damaged."""
    d = tmp_path / "traces"
    d.mkdir()
    for p in _dlrm_files(shared_traces)[:4]:
        shutil.copy(p, d / p.name)
    return d


def test_each_bad_file_is_named_and_the_rest_analysed(run_dir: Path, shared_traces: Path) -> None:
    files = sorted(run_dir.iterdir())
    good = files[0]
    truncated = files[1]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    malformed = run_dir / "rank5.pt.trace.json"
    malformed.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur"')
    empty = run_dir / "rank6.pt.trace.json"
    empty.write_bytes(b"")
    not_trace = run_dir / "rank7.json"
    not_trace.write_bytes(b'{"hello": "world", "traceEvents": 3}')
    duplicate = run_dir / "zz_copy_of_rank0.pt.trace.json.gz"
    shutil.copy(good, duplicate)
    corrupt = files[2]
    data = bytearray(corrupt.read_bytes())
    data[100:140] = b"\x00" * 40
    corrupt.write_bytes(bytes(data))

    warnings: list[str] = []
    traces = load_traces(find_traces(run_dir), warnings=warnings)
    assert sorted(t.meta.rank for t in traces) == [0, 3]
    _one_line_naming(warnings, truncated, "truncated gzip")
    _one_line_naming(warnings, malformed, "malformed JSON")
    _one_line_naming(warnings, empty, "empty file")
    _one_line_naming(warnings, not_trace, "not a profiler trace")
    _one_line_naming(warnings, duplicate, "a second trace for rank 0")
    assert any(w.startswith(str(corrupt)) and "gzip" in w for w in warnings), warnings
    assert any("traces for 6 of 8 ranks are missing (ranks 1-2, 4-7)" in w for w in warnings)
    assert all("\n" not in w for w in warnings)
    _analyse(traces)


def test_trace_from_another_run_is_set_aside(shared_traces: Path, tmp_path: Path) -> None:
    d = tmp_path / "mixed"
    d.mkdir()
    files = _dlrm_files(shared_traces)
    for p in files[:2]:
        shutil.copy(p, d / p.name)
    doc = orjson.loads(gzip.decompress(files[2].read_bytes()))
    doc["baseTimeNanoseconds"] = 3 * 3600 * 10**9  # the same job, three hours later
    stray = d / files[2].name.replace(".gz", "")
    stray.write_bytes(orjson.dumps(doc))
    warnings: list[str] = []
    traces = load_traces(find_traces(d), warnings=warnings)
    assert [t.meta.rank for t in traces] == [0, 1]
    _one_line_naming(warnings, stray, "from a different run")
    assert "10800 s away" in next(w for w in warnings if "different run" in w)


def test_trace_above_the_size_limit_is_refused(shared_traces: Path, tmp_path: Path) -> None:
    src = _dlrm_files(shared_traces)[0]
    trace, warnings = load_trace(src, max_bytes=200_000)
    assert trace is None
    _one_line_naming(warnings, src, "above the 0 MiB limit; refused")
    plain = tmp_path / "rank0.pt.trace.json"
    plain.write_bytes(gzip.decompress(src.read_bytes()))
    trace, warnings = load_trace(plain, max_bytes=200_000)
    assert trace is None and "refused" in warnings[0]


HUGE_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    from gpudiag.analysis.ingest import load_traces
    warnings = []
    traces = load_traces(sys.argv[1:], warnings=warnings, workers=1)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(len(traces), round(peak_mib))
    for w in warnings:
        print(w)
    """
)


@pytest.mark.slow
def test_several_gb_trace_is_refused_with_bounded_memory(
    shared_traces: Path, tmp_path: Path
) -> None:
    """3 GiB of (uncompressed) JSON in a 3 MiB multi-member gzip, whose trailer states
    only the last member's size: the reader stops at the limit instead of inflating it."""
    chunk = zlib.compressobj(9, zlib.DEFLATED, 31)
    member = chunk.compress(b" " * (64 << 20)) + chunk.flush()
    huge = tmp_path / "rank1.pt.trace.json.gz"
    with open(huge, "wb") as fh:
        fh.write(gzip.compress(b'{"traceEvents": [', 1))
        for _ in range(48):
            fh.write(member)
    ok = tmp_path / "rank0.pt.trace.json.gz"
    shutil.copy(_dlrm_files(shared_traces)[0], ok)
    env = dict(os.environ, GPUDIAG_MAX_TRACE_BYTES=str(256 << 20))
    proc = subprocess.run(
        [sys.executable, "-c", HUGE_SCRIPT, str(ok), str(huge)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    count, peak_mib = (int(x) for x in lines[0].split())
    assert count == 1  # the good rank is still analysed
    assert peak_mib < 900, f"peak RSS {peak_mib} MiB"
    assert any(x.startswith(str(huge)) and "refused" in x for x in lines[1:]), lines


# --------------------------------------------------------------------------- hypothesis


GLOO_RUN = Path(__file__).resolve().parents[1] / "sample_runs" / "ddp2_healthy"


def _cut_around_comms(doc: dict, marker: str) -> dict:
    """Keep thread names, steps and a few hundred events around the comm events."""
    events = doc["traceEvents"]
    keep = [e for e in events if e.get("ph") == "M"]
    comm = [i for i, e in enumerate(events) if marker in str(e.get("name", "")).lower()][:12]
    idx = sorted({j for i in comm for j in range(max(i - 15, 0), min(i + 15, len(events)))})
    keep += [events[i] for i in idx]
    keep += [e for e in events if str(e.get("name", "")).startswith("ProfilerStep")]
    return {**doc, "traceEvents": keep}


@pytest.fixture(scope="module", params=["nccl", "gloo"])
def small_doc(request: pytest.FixtureRequest, shared_traces: Path) -> dict:
    """A real trace cut small: DLRM (GPU, NCCL) or a gloo run recorded by gpudiag trace."""
    if request.param == "nccl":
        doc = orjson.loads(gzip.decompress(_dlrm_files(shared_traces)[0].read_bytes()))
        return _cut_around_comms(doc, "nccl")
    path = GLOO_RUN / "traces" / "rank0.pt.trace.json.gz"
    if not path.is_file():
        pytest.skip(f"{path} not recorded")
    return _cut_around_comms(orjson.loads(gzip.decompress(path.read_bytes())), "gloo:")


_WEIRD = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from([2**63 - 1, -(2**63), 10**18, 1e308, -1e308, -5, -0.5, 0, 1.5e15]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_KEYS = ["ph", "name", "ts", "dur", "cat", "pid", "tid", "args"]
_ARG_KEYS = ["stream", "correlation", "External id", "Collective name", "In msg nelems", "dtype"]


@st.composite
def mutations(draw: st.DrawFn) -> list[tuple]:
    ops = []
    for _ in range(draw(st.integers(1, 8))):
        what = draw(st.sampled_from(["drop", "set", "arg", "negdur", "nandur", "top"]))
        ops.append(
            (
                what,
                draw(st.integers(0, 10**6)),
                draw(st.sampled_from(_KEYS)),
                draw(st.sampled_from(_ARG_KEYS)),
                draw(_WEIRD),
            )
        )
    return ops


def _mutate(doc: dict, ops: list[tuple]) -> tuple[dict, bool]:
    doc = json.loads(json.dumps(doc))
    events = doc["traceEvents"]
    nan_literal = False
    for what, pos, key, arg, value in ops:
        ev = events[pos % len(events)]
        if what == "drop":
            ev.pop(key, None)
        elif what == "set":
            ev[key] = value
        elif what == "arg":
            ev.setdefault("args", {})
            if isinstance(ev["args"], dict):
                ev["args"][arg] = value
        elif what == "negdur":
            ev["dur"] = -abs(
                float(ev.get("dur", 1) or 1) if isinstance(ev.get("dur"), (int, float)) else 1
            )
        elif what == "nandur":
            ev["dur"] = math.nan
            nan_literal = True
        elif what == "top":
            doc[key] = value
    return doc, nan_literal


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=mutations(), cut=st.one_of(st.none(), st.floats(0.0, 1.0)), gz=st.booleans())
def test_mutated_traces_never_crash(small_doc: dict, tmp_path: Path, ops, cut, gz) -> None:
    doc, _ = _mutate(small_doc, ops)
    try:
        data = json.dumps(doc).encode()  # NaN / Infinity literals, as Python writes them
    except (ValueError, OverflowError):
        data = orjson.dumps(doc, option=orjson.OPT_PASSTHROUGH_SUBCLASS)
    if gz:
        data = gzip.compress(data, 1)
    if cut is not None:
        data = data[: int(len(data) * cut)]
    path = tmp_path / f"rank0.pt.trace.json{'.gz' if gz else ''}"
    path.write_bytes(data)
    trace, warnings = load_trace(path)
    assert all("\n" not in w and w.startswith(str(path)) for w in warnings)
    if trace is None:
        assert warnings
        return
    ev = trace.events
    assert (ev["dur_ns"] >= 0).all() and (ev["end_ns"] >= ev["start_ns"]).all()
    _analyse([trace])
    bd = run_breakdown([trace])
    if len(bd):
        assert (bd["step_ms"] >= 0).all()


@pytest.mark.parametrize("fraction", [50, 3])
def test_truncated_gzip_is_called_truncated_not_too_big(
    shared_traces: Path, tmp_path: Path, fraction: int
) -> None:
    """A cut-off gzip's last 4 bytes are not its size: it must not read as a huge trace."""
    whole = _dlrm_files(shared_traces)[0].read_bytes()
    cut = tmp_path / "rank0.pt.trace.json.gz"
    cut.write_bytes(whole[: len(whole) // fraction])
    warnings: list[str] = []
    assert load_traces([cut], warnings=warnings) == []
    _one_line_naming(warnings, cut, "truncated gzip")


def test_unfinished_last_row_is_a_crash_artefact_not_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rank killed mid-write leaves its last row unfinished: a warning, exit 0. A broken
    row in the middle of a table is bad input: exit 2 (the rest is still reported)."""
    from gpudiag.cli import analyze as analyze_cli

    sample = Path(__file__).resolve().parents[1] / "sample_runs" / "ddp2_healthy"
    torn = tmp_path / "torn"
    shutil.copytree(sample, torn)
    steps = torn / "rank0" / "steps.jsonl"
    with open(steps, "a") as fh:
        fh.write('{"step": 99, "start_ns": 12')
    assert analyze_cli.main([str(torn), "--json"]) == 0
    err = capsys.readouterr().err
    assert f"{steps}: ignored its unfinished last line" in err
    broken = tmp_path / "broken"
    shutil.copytree(sample, broken)
    table = broken / "rank0" / "steps.jsonl"
    lines = table.read_text().splitlines(keepends=True)
    table.write_text("".join([*lines[:3], '{"step": 3, "sta\n', *lines[3:]]))
    assert analyze_cli.main([str(broken), "--json"]) == 2
    assert f"{table}: skipped 1 malformed line, first at line 4" in capsys.readouterr().err


# --------------------------------------------------------------------------- unusable files
# What the fuzzer found (part 3): a lone surrogate in a table row, /dev/zero
# symlinked as a file, a FIFO (or a socket) in a file's place, permission denied on the
# run directory, a rank directory, traces/ or a file. Each runs the real CLI in a
# subprocess (a hang fails by its timeout) on a copy of the 4-rank straggler sample run,
# the fault on rank 1 (or a run-wide file): exit 2, one warning line naming the file,
# no traceback, and rank 2 is still named the straggler.

STRAGGLER_RUN = Path(__file__).resolve().parents[1] / "sample_runs" / "ddp4_straggler"
CLI_TIMEOUT_S = 60


def _analyze_cli(run: Path, *extra: str, drop_root: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "gpudiag", "analyze", str(run), "--workers", "1", *extra]
    return subprocess.run(
        [*(unprivileged() if drop_root else []), *cmd],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        preexec_fn=limit_memory,  # an unbounded read fails fast instead of filling memory
    )


def _surrogate_row(path: Path) -> None:
    """Line 2's ``source`` a lone surrogate (the escape json.dumps writes for it)."""
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace('"source":"optimizer"', '"source":"\\ud800x"')
    path.write_text("".join(lines))


def _surrogate_doc(path: Path) -> None:
    doc = json.loads(path.read_text())
    doc["hostname"] = "node\udc00"
    path.write_text(json.dumps(doc))  # ensure_ascii: written as the escape "\udc00"


def _bad_unicode_trace(path: Path) -> None:
    """Two names with a lone surrogate escape, one value with bytes that are not UTF-8."""
    data = gzip.decompress(path.read_bytes())
    marker = b'"cat":"user_annotation","name":"'
    data = data.replace(marker, marker + b"\\ud800", 2)
    data = data.replace(b'{"ph":"X"', b'{"ph":"X","extra":"\xff\xfe"', 1)
    path.write_bytes(gzip.compress(data, 1))


def _long_line(path: Path) -> None:
    with open(path, "ab") as fh:
        fh.write(b'{"step": 99, "source": "' + b"x" * (2 << 20) + b'"}\n')


# name: (file or directory, fault, what its one warning line says)
UNUSABLE_CASES = {
    "surrogate in a table row": ("rank1/steps.jsonl", _surrogate_row, "lone surrogate"),
    "surrogate in a JSON document": ("rank1/rank_info.json", _surrogate_doc, "lone surrogate"),
    "bad Unicode in a trace": (
        "traces/rank1.pt.trace.json.gz",
        _bad_unicode_trace,
        "not valid Unicode",
    ),
    "line above the row limit": ("rank1/steps.jsonl", _long_line, "longer than 1 MiB"),
    "/dev/zero as the manifest": ("manifest.json", "dev_zero", "a character device, not a"),
    "/dev/zero as a table": ("rank1/collectives.jsonl", "dev_zero", "a character device"),
    "/dev/zero as a trace": ("traces/rank1.pt.trace.json.gz", "dev_zero", "a character device"),
    "/dev/zero as stacks.txt": ("rank1/stacks.txt", "dev_zero", "a character device"),
    "FIFO as status.json": ("rank1/status.json", "fifo", "a FIFO, not a regular file; refused"),
    "FIFO as a table": ("rank1/steps.jsonl", "fifo", "a FIFO"),
    "FIFO as a trace": ("traces/rank1.pt.trace.json.gz", "fifo", "a FIFO"),
    "FIFO as lint.json": ("lint.json", "fifo", "a FIFO"),
    "socket as summary.json": ("rank1/summary.json", "socket", "not a regular file"),
    "/dev/zero as traces/": ("traces", "dev_zero", "a character device, not a directory"),
    "permission denied: a rank directory": ("rank1", "no_permission", "Permission denied"),
    "permission denied: traces/": ("traces", "no_permission", "Permission denied"),
    "permission denied: a table": ("rank1/steps.jsonl", "no_permission", "Permission denied"),
    "permission denied: a trace": (
        "traces/rank1.pt.trace.json.gz",
        "no_permission",
        "Permission denied",
    ),
}


def _inject(run: Path, rel: str, fault: Any) -> None:
    target = run / rel
    if callable(fault):
        fault(target)
    elif fault == "no_permission":
        target.chmod(0)
    else:
        replace_unusable(target, fault)


def _needs_denial(fault: Any) -> None:
    if fault == "no_permission" and not can_deny():
        pytest.skip(
            "running as root, and `setpriv --bounding-set -dac_override,-dac_read_search` "
            "cannot drop root's permission override here: mode 000 cannot be tested"
        )


@pytest.mark.parametrize("name", list(UNUSABLE_CASES))
def test_unusable_file_is_one_warning_and_the_rest_is_analysed(tmp_path: Path, name: str) -> None:
    rel, fault, says = UNUSABLE_CASES[name]
    _needs_denial(fault)
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER_RUN, run)
    _inject(run, rel, fault)
    try:
        proc = _analyze_cli(run, "--json", drop_root=fault == "no_permission")
    finally:
        remove_tree(run)
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == 2, proc.stderr[-3000:]
    target = str(run / rel)
    naming = [
        line
        for line in proc.stderr.splitlines()
        if line.startswith("gpudiag: warning: ") and target in line
    ]
    assert len(naming) == 1, proc.stderr
    assert naming[0].startswith(f"gpudiag: warning: {target}: "), naming
    assert says in naming[0], naming
    result = json.loads(proc.stdout)
    stragglers = [f for f in result["findings"] if f["kind"] == "straggler"]
    assert [f["ranks"] for f in stragglers] == [[2]], result["findings"]
    assert {0, 2, 3} <= {row["rank"] for row in result["ranks"]}, result["ranks"]


def test_unreadable_run_directory_is_one_error(tmp_path: Path) -> None:
    _needs_denial("no_permission")
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER_RUN, run)
    run.chmod(0)
    try:
        proc = _analyze_cli(run, drop_root=True)
    finally:
        remove_tree(run)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"gpudiag: error: {run}: cannot read (Permission denied)"
    ]


def test_table_above_its_limit_is_read_up_to_it(tmp_path: Path) -> None:
    """GPUDIAG_MAX_TABLE_BYTES bounds each table: the rows before the limit are used."""
    from gpudiag import rundir

    path = tmp_path / "steps.jsonl"
    rows = [{"step": i, "start_ns": i, "end_ns": i + 1} for i in range(1000)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    warnings: list[str] = []
    got = list(rundir.iter_jsonl(path, warnings, schema=rundir.STEPS, max_bytes=4096))
    assert 0 < len(got) < 1000 and got == rows[: len(got)]
    assert len(warnings) == 1 and warnings[0].startswith(f"{path}: larger than the 4096 bytes")
    assert isinstance(warnings[0], rundir.BadInput)


def test_watch_once_survives_unusable_files(tmp_path: Path) -> None:
    """`gpudiag watch` reads the same files live: a FIFO, /dev/zero and an unreadable rank
    directory neither hang nor crash it."""
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER_RUN, run)
    replace_unusable(run / "rank1" / "status.json", "fifo")
    replace_unusable(run / "rank1" / "steps.jsonl", "dev_zero")
    replace_unusable(run / "manifest.json", "dev_zero")
    if can_deny():
        (run / "rank3").chmod(0)
    watch = [sys.executable, "-m", "gpudiag", "watch", str(run), "--once", "--json"]
    try:
        proc = subprocess.run(
            [*unprivileged(), *watch],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_S,
            preexec_fn=limit_memory,
        )
    finally:
        remove_tree(run)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    ranks = {r["rank"] for r in json.loads(proc.stdout)["ranks"]}
    assert {0, 2} <= ranks, proc.stdout


def _lines_reference(data: bytes, limit: int, longest: int) -> tuple[list, int, bool]:
    """What rundir.read.Lines yields, computed on the whole text at once."""
    over = len(data) > limit
    pieces = data[:limit].split(b"\n")
    last = pieces.pop()
    out, long_lines = [], 0
    for number, piece in enumerate(pieces, 1):
        if len(piece) > longest:
            long_lines += 1
        else:
            out.append((number, piece, True))
    if len(last) > longest:
        long_lines += 1
    elif last and not over:
        out.append((len(pieces) + 1, last, False))
    return out, long_lines, over


@settings(max_examples=300, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=12).map(lambda b: b.replace(b"\n", b"")), max_size=12),
    end=st.booleans(),
    block=st.integers(1, 9),
    longest=st.integers(1, 8),
    limit=st.integers(0, 120),
)
def test_table_lines_are_bounded_in_any_block_size(
    lines: list[bytes], end: bool, block: int, longest: int, limit: int
) -> None:
    """rundir reads a table a block at a time: whatever the block size, the same lines,
    line numbers, skipped long lines and limit as reading the whole text would give."""
    import io

    from gpudiag import rundir

    data = b"\n".join(lines) + (b"\n" if end and lines else b"")
    reader = rundir.read.Lines(io.BytesIO(data), limit)
    reader.BLOCK = block
    saved = rundir.read.MAX_LINE_BYTES
    rundir.read.MAX_LINE_BYTES = longest
    try:
        got = [(n, line, complete) for n, line, complete, _ in reader]
    finally:
        rundir.read.MAX_LINE_BYTES = saved
    assert (got, reader.long_lines, reader.over) == _lines_reference(data, limit, longest)


def test_surrogate_escape_across_a_block_boundary_is_replaced(tmp_path: Path) -> None:
    from gpudiag import rundir

    path = tmp_path / "regions.jsonl"
    row = b'{"name": "r\\ud800", "start_ns": 1, "end_ns": 2}\n'
    path.write_bytes(row * 3)
    for block in range(1, len(row) + 2):
        warnings: list[str] = []
        saved, rundir.read.Lines.BLOCK = rundir.read.Lines.BLOCK, block
        try:
            got = list(rundir.iter_jsonl(path, warnings, schema=rundir.REGIONS))
        finally:
            rundir.read.Lines.BLOCK = saved
        assert [r["name"] for r in got] == ["r\ufffd"] * 3, block
        assert warnings == [
            f"{path}: 3 string(s) (first at line 1) with a lone surrogate "
            "(not valid Unicode); replaced with U+FFFD"
        ]


def test_an_empty_last_call_slot_and_an_absurd_world_size_are_not_errors(tmp_path: Path) -> None:
    """Issue 28 probe (2026-12-02): a rank's last_call.json is created empty at start and
    stays so when it never enters a user collective (any plain DDP job); a dead rank's
    empty slot was reported as invalid JSON and `analyze` exited 2 on runs gpudiag wrote.
    And a manifest whose world_size is 10**15 made the "ranks not recorded" note build
    a set of that size (MemoryError)."""
    from gpudiag.analysis import analyze

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "sample_runs" / "ddp4_straggler", run)
    (run / "rank1" / "status.json").unlink()  # rank 1 died: its slot is read
    (run / "rank1" / "last_call.json").write_bytes(b"")
    result = analyze(run)
    assert not [w for w in result.warnings if "last_call.json" in w], result.warnings

    manifest = json.loads((run / "manifest.json").read_text())
    manifest["world_size"] = 10**15
    (run / "manifest.json").write_text(json.dumps(manifest))
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit_memory,
        check=False,
    )
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr, proc.stderr
    # an implausible size is one line and then unknown: the world is the 4 ranks present
    said = [ln for ln in proc.stderr.splitlines() if "not a plausible world size" in ln]
    assert len(said) == 1 and "manifest.json" in said[0], proc.stderr
    findings = json.loads(proc.stdout)["findings"]
    assert not [f for f in findings if "not recorded" in f["title"]], findings


@pytest.mark.parametrize(
    "command",
    [
        ["compare", "{base}", "{run}"],
        ["analyze", "{run}", "--html", "{html}"],
        ["analyze", "{run}", "--json"],
        ["whatif", "{run}"],
    ],
    ids=["compare", "html", "analyze", "whatif"],
)
def test_an_implausible_world_size_is_one_warning_under_a_memory_limit(
    tmp_path: Path, command: list[str]
) -> None:
    """Issue 28 re-probe, F11 (class 5): a manifest world_size of 10**12 sized a list of
    every rank in `compare` and `analyze --html` (MemoryError at 3.6 GB). The reader now
    drops a world size outside 1..2**20 with one line naming the file and field; the run
    is analysed from the ranks present, under an address-space limit."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["world_size"] = 10**12
    manifest["nproc_per_node"] = str(10**12)
    (run / "manifest.json").write_text(json.dumps(manifest))
    info = json.loads((run / "rank1" / "rank_info.json").read_text())
    info["world_size"] = 10**15
    (run / "rank1" / "rank_info.json").write_text(json.dumps(info))
    fill = {"base": str(GLOO_RUN), "run": str(run), "html": str(tmp_path / "r.html")}
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", *(a.format(**fill) for a in command)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        preexec_fn=limit_memory,
        check=False,
    )
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 2), proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "not a plausible world size" in ln]
    assert len(lines) == 2, proc.stderr  # the manifest's and rank 1's rank_info.json
    assert any(f"{run / 'manifest.json'}: world_size {10**12}" in ln for ln in lines), lines
    assert any("rank_info.json" in ln for ln in lines), lines
    if command[0] == "analyze" and "--json" in command:
        assert json.loads(proc.stdout)["run"]["world_size"] == 2


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("rank", 99, "rank 99 is no rank of the world of 4"),
        ("rank", -1, "rank -1 is no rank of the world of 4"),
        ("consequences", "none", "consequences is not a list"),
    ],
)
def test_a_manifest_failure_naming_no_rank_of_the_job_is_one_warning(
    tmp_path: Path, field: str, value: object, said: str
) -> None:
    """Eighth probe, F6: `failure.rank` 99 (or -1) in a damaged manifest of a 3-rank run
    gave "Rank 99 failed first" with exit 0. The field is dropped with one line naming
    the file, exit 2, the rest analysed."""
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER_RUN, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["status"] = "failed"
    manifest["failure"] = {"rank": 2, "exc_type": "ValueError", "message": "boom", field: value}
    (run / "manifest.json").write_text(json.dumps(manifest))
    done = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if "manifest.json (failure)" in ln]
    assert len(lines) == 1 and said in lines[0], done.stderr
    titles = [f["title"] for f in json.loads(done.stdout)["findings"]]
    assert not any("Rank 99" in t or "Rank -1" in t for t in titles), titles


def _findings_and_warnings(run: Path) -> tuple[dict, list[str], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run), "--json"],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        preexec_fn=limit_memory,
        check=False,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    return out, [ln for ln in proc.stderr.splitlines() if "warning:" in ln], proc.stderr


@pytest.mark.parametrize("junk", ["rank_dirs", "trace_files"])
def test_junk_rank_folders_and_trace_files_are_not_ranks(tmp_path: Path, junk: str) -> None:
    """Issue 28 re-probe, F45/F46 (class 6): ~300 extra empty (or junk-holding) rank<N>
    directories, or trace files of ranks outside the world (links to rank 0's), beside a
    recorded 2-rank run switched it to "more than 256 ranks; analysed from summary.json
    files only" (untrue) and dropped every finding. They are one warning line naming how
    many and the first few, and the run is analysed from its 2 real ranks as before."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    before, _, _ = _findings_and_warnings(GLOO_RUN)
    if junk == "rank_dirs":
        for r in range(2, 302):
            (run / f"rank{r}").mkdir()
        (run / "rank302").mkdir()
        (run / "rank302" / "notes.txt").write_text("not gpudiag's")
        where, said = str(run), "301 rank directories holding no gpudiag file (rank2, rank3"
    else:
        for r in range(2, 302):
            (run / "traces" / f"rank{r}.pt.trace.json.gz").symlink_to(
                run / "traces" / "rank0.pt.trace.json.gz"
            )
        where, said = str(run / "traces"), "300 trace files of ranks outside the world of 2"
    out, warned, stderr = _findings_and_warnings(run)
    assert len(warned) == 1 and where in warned[0] and said in warned[0], stderr
    assert "256" not in stderr and "summary.json files only" not in stderr, stderr
    assert out["run"]["kind"] == "gpudiag_run" and out["run"]["ranks_present"] == [0, 1]
    assert [f["kind"] for f in out["findings"]] == [f["kind"] for f in before["findings"]]


NO_PROFILE_RUN = Path(__file__).resolve().parent / "fixtures" / "gate_busy" / "base"


@pytest.mark.parametrize("how", ["deleted", "emptied", "link_to_root"])
def test_a_run_whose_traces_are_all_gone_says_so(tmp_path: Path, how: str) -> None:
    """Issue 28 re-probe, F48 (class 7): with traces/ deleted, emptied or a symlink to /,
    a recorded 2-rank run was "No findings: nothing costs a noticeable share of the step",
    exit 0, without a word, while one missing trace of two was said. The ranks'
    summary.json name the trace each wrote: one line says none is here, and the no-findings
    text claims only what the tables show. A --no-profile run (no trace by design) stays
    quiet."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    if how == "deleted":
        shutil.rmtree(run / "traces")
    elif how == "emptied":
        for p in (run / "traces").iterdir():
            p.unlink()
    else:
        shutil.rmtree(run / "traces")
        (run / "traces").symlink_to("/")
    out, warned, stderr = _findings_and_warnings(run)
    assert len(warned) == 1, stderr
    assert f"{run / 'traces'}: traces for 0 of 2 ranks present" in warned[0], stderr
    assert "analysed from the run's tables" in warned[0]
    assert out["run"]["ranks_present"] == [0, 1]
    text = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False,
        env={**os.environ, "COLUMNS": "400"},
    )  # fmt: skip
    assert "nothing costs a noticeable share" not in text.stdout, text.stdout
    if not out["findings"]:
        assert "no trace was analysed" in text.stdout, text.stdout

    quiet, warned, stderr = _findings_and_warnings(NO_PROFILE_RUN)
    assert not [w for w in warned if "traces" in w], stderr


def _edit_json(path: Path, **fields: object) -> None:
    doc = json.loads(path.read_text())
    doc.update(fields)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        ({"steps_completed": "lots"}, "'steps_completed' must be an object"),
        ({"steps_completed": {"0": "lots", "x": 3, "1": 15}}, "ignored steps_completed entries"),
        ({"start_ns": 10**40}, "'start_ns' is 41 digits long: no 64-bit integer"),
        ({"end_ns": "late"}, "'end_ns' must be an integer"),
        ({"world_size": 10**30}, "world_size of 31 digits is not a plausible world size"),
        ({"hosts": "vm"}, "'hosts' must be a list"),
    ],
    ids=["steps-str", "steps-entries", "start-huge", "end-str", "world-huge", "hosts-str"],
)
def test_a_wrongly_valued_manifest_field_is_one_warning(
    tmp_path: Path, damage: dict, said: str
) -> None:
    """Probe 28c, defect 6: manifest fields the readers use but the schema did not list
    (`steps_completed: "lots"`, `start_ns: 10**40`) were analysed silently, and a world
    size of 10**30 read "must be an integer". Each is now one warning naming the file."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    _edit_json(run / "manifest.json", **damage)
    loaded = rundir.load_run(run)
    said_here = [w for w in loaded.warnings if said in w]
    assert len(said_here) == 1 and str(run / "manifest.json") in said_here[0], loaded.warnings
    assert not loaded.steps.empty


def test_repeated_step_numbers_are_one_warning_naming_the_table(tmp_path: Path) -> None:
    """Probe 28c, B09: twenty rows of rank 1's steps table numbered 10**18 changed the
    exposed communication (2.07 -> 2.30 ms a step) without a word."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    table = run / "rank1" / "steps.jsonl"
    rows = [json.loads(line) for line in table.read_text().splitlines()]
    for row in rows[:5]:
        row["step"] = 10**18
    table.write_text("".join(json.dumps(r) + "\n" for r in rows))
    loaded = rundir.load_run(run)
    said = [w for w in loaded.warnings if "repeat the number of an earlier step" in w]
    assert len(said) == 1 and str(table) in said[0] and "4 row(s)" in said[0], loaded.warnings
    assert f"step {10**18}" in said[0]
    clean = rundir.load_run(GLOO_RUN)
    assert not [w for w in clean.warnings if "repeat the number" in w], clean.warnings


def _edit_rows(path: Path, change: Any) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    change(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _invert(rows: list[dict]) -> None:
    for row in rows:
        row["start_ns"], row["end_ns"] = row["end_ns"], row["start_ns"]


@pytest.mark.parametrize(
    ("table", "change", "said"),
    [
        ("steps", lambda rows: rows[3].update(step=-5), "'step' must be a whole number"),
        ("steps", _invert, "'end_ns' is before 'start_ns'"),
        ("steps", lambda rows: rows[2].update(data_ns=-4e6), "'data_ns' must be a duration"),
        ("collectives", lambda rows: rows[1].update(in_bytes=-(10**12)), "'in_bytes' must be"),
        ("collectives", lambda rows: rows[1].update(in_bytes=10**18), "0 to 2**50 bytes"),
        ("collectives", lambda rows: rows[1].update(seq=-3), "'seq' must be a whole number"),
    ],
    ids=["step-negative", "steps-inverted", "data-negative", "bytes-negative", "bytes-huge",
         "seq-negative"],
)  # fmt: skip
def test_impossible_values_in_a_table_are_one_warning_in_analyze_and_watch(
    tmp_path: Path, table: str, change: Any, said: str
) -> None:
    """Probe 28d, defects 4-6: a step numbered -5 or ending before it starts moved the
    steady step from 8.23 to 6.49 ms, every step of a rank inverted moved a cost from
    2.88 to 61.77 ms a step, a call of -10**12 or 10**18 bytes made a false high desync
    the first finding, each without a word; and `watch` said nothing of rows `analyze`
    skips. Such a row is skipped with one warning naming the table, in both."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    path = run / "rank1" / f"{table}.jsonl"
    _edit_rows(path, change)
    loaded = rundir.load_run(run)
    lines = [w for w in loaded.warnings if str(path) in w]
    assert len(lines) == 1 and said in lines[0], loaded.warnings
    live = [w for w in rundir.open_live(run).poll().warnings if str(path) in w]
    assert len(live) == 1 and said in live[0], live


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("status.json", "null", "status.json: not a JSON object"),
        ("rank_info.json", None, "rank_info.json: says rank 0; read as rank 1"),
    ],
)
def test_a_rank_document_of_null_or_of_another_rank_is_one_warning(
    tmp_path: Path, name: str, text: str | None, said: str
) -> None:
    """Probe 28d, defect 7: `rank1/status.json` holding `null`, or a rank_info.json of
    rank 1 saying rank 0, were read without a word."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    path = run / "rank1" / name
    if text is None:
        _edit_json(path, rank=0)
    else:
        path.write_text(text)
    loaded = rundir.load_run(run)
    assert len([w for w in loaded.warnings if said in w]) == 1, loaded.warnings
    assert loaded.rank_info[1]["rank"] == 1


def test_watch_says_once_what_analyze_says_of_a_bad_manifest_or_rank_directory(
    tmp_path: Path,
) -> None:
    """Probe 28d, defects 6 and 8: `watch` showed a manifest that is a JSON array as
    `state: ok` without a word, and a rank directory replaced by a file in two lines."""
    run = tmp_path / "run"
    shutil.copytree(GLOO_RUN, run)
    (run / "manifest.json").write_text("[1, 2, 3]")
    shutil.rmtree(run / "rank1")
    (run / "rank1").write_text("not a directory")
    warnings = rundir.open_live(run).poll().warnings
    assert [w for w in warnings if "manifest.json: not a JSON object" in w], warnings
    about_rank1 = [w for w in warnings if str(run / "rank1") in w]
    assert len(about_rank1) == 1 and "not a directory" in about_rank1[0], warnings
