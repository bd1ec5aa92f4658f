"""Issue 16 item 11: no input makes `gpudiag analyze` print a traceback. CI-sized pieces
of the mutation fuzzer (tests/fuzz_inputs.py; the full run is bench/fuzz.py), plus the
named cases from the issue, each a one-line warning naming the file and exit code 2."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
from fuzz_inputs import KINDS, make_bases, mutate_case, run_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory, shared_traces: Path) -> dict[str, Path]:
    return make_bases(tmp_path_factory.mktemp("fuzz"))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**31),
    mode=st.sampled_from(["json", "terminal"]),
)
def test_mutated_inputs_never_traceback(
    bases: dict[str, Path], tmp_path: Path, kind: str, seed: int, mode: str
) -> None:
    path = mutate_case(bases, tmp_path / "case", kind, seed)
    code, site, err = run_case(path, mode, tmp_path / "out.html")
    assert site is None, f"traceback at {site} (kind {kind}, seed {seed})\n{err[-1500:]}"
    assert code in (0, 1, 2)
    for line in err.splitlines():
        assert "Traceback" not in line


def _case(bases: dict[str, Path], tmp_path: Path) -> Path:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(bases["run"], run)
    return run


def _edit(path: Path, changes: dict) -> None:
    doc = json.loads(path.read_text()) if path.exists() else {}
    nested = {k: v for k, v in changes.items() if isinstance(v, _Nested)}
    doc.update({k: f"@@{k}@@" if k in nested else v for k, v in changes.items()})
    text = json.dumps(doc)
    for key, value in nested.items():
        text = text.replace(f'"@@{key}@@"', value.text)
    path.write_text(text)


class _Nested:
    """A list nested ``depth`` deep, written as JSON text (json.dumps would recurse)."""

    def __init__(self, depth: int) -> None:
        self.text = "[" * depth + "1" + "]" * depth


def _nested(depth: int) -> _Nested:
    return _Nested(depth)


NAMED = {
    "format_version string": ("manifest.json", {"format_version": "2"}),
    "format_version list": ("manifest.json", {"format_version": [2]}),
    "world_size not numeric": ("manifest.json", {"world_size": "eight"}),
    "manifest deeply nested": ("manifest.json", {"env": _nested(5000)}),
    "status deeply nested": ("rank0/status.json", {"traceback": _nested(100_000)}),
    "hang_report keys": (
        "hang_report.json",
        {"ranks": {"zero": {"inflight": []}}, "desync": {"calls": {"a": {}}}},
    ),
    "hang_report seq dict": (
        "hang_report.json",
        {"stuck_ranks": [0], "ranks": {"0": {"inflight": [{"seq": {}}, {"seq": "3"}]}}},
    ),
}


@pytest.mark.parametrize("name", list(NAMED))
def test_named_bad_run_files(bases: dict[str, Path], tmp_path: Path, name: str) -> None:
    rel, changes = NAMED[name]
    run = _case(bases, tmp_path)
    target = run / rel
    _edit(target, changes)
    code, site, err = run_case(run, "json", tmp_path / "x.html")
    assert site is None, err
    assert code == 2, err
    assert any(line.startswith(f"gpudiag: warning: {target}") for line in err.splitlines()), err


@pytest.mark.parametrize(
    ("table", "row"),
    [
        ("steps", {"step": "7", "start_ns": 1, "end_ns": 2}),
        ("steps", {"step": 10**20, "start_ns": 1, "end_ns": 2}),
        ("collectives", {"pg_name": "0", "seq": {"a": 1}, "op": "all_reduce"}),
        ("collectives", {"pg_name": "0", "seq": "12", "op": "all_reduce"}),
    ],
)
def test_bad_table_rows_are_skipped(
    bases: dict[str, Path], tmp_path: Path, table: str, row: dict
) -> None:
    run = _case(bases, tmp_path)
    path = run / "rank0" / f"{table}.jsonl"
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    code, site, err = run_case(run, "json", tmp_path / "x.html")
    assert site is None and code == 2, err
    assert f"{path}: skipped 1 row with a field of the wrong type or value" in err


@pytest.mark.parametrize("step", ["ProfilerStep#-1", "ProfilerStep#99999999999999999999"])
def test_bad_step_numbers_cost_one_file(bases: dict[str, Path], tmp_path: Path, step: str) -> None:
    """Not the whole directory: the other rank's trace is still analysed."""
    run = _case(bases, tmp_path)
    path = run / "traces" / "rank0.pt.trace.json.gz"
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    for ev in doc["traceEvents"]:
        if str(ev.get("name", "")).startswith("ProfilerStep#"):
            ev["name"] = step
    path.write_bytes(gzip.compress(orjson.dumps(doc)))
    code, site, err = run_case(run, "json", tmp_path / "x.html")
    assert site is None and code == 2, err
    assert f"{path}: ignored" in err and "step marker" in err


def test_unwritable_html_and_full_disk(bases: dict[str, Path], tmp_path: Path) -> None:
    import subprocess
    import sys

    run = bases["run"]
    proc = subprocess.run(
        [sys.executable, "-m", "gpudiag", "analyze", str(run), "--html", "/"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("gpudiag: error: --html /")
    if Path("/dev/full").exists():
        with open("/dev/full", "w") as full:
            proc = subprocess.run(
                [sys.executable, "-m", "gpudiag", "analyze", str(run), "--json"],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                timeout=300,
            )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "No space left on device" in proc.stderr
