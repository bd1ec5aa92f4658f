"""Bounded memory of reading a run's tables (issue 28 F13): a long job's steps.jsonl is
turned into columns a block of rows at a time (rundir.tables.Table), never held as one
Python dict per row (a 380 MB steps.jsonl took `gpudiag analyze` to 3 GB before, 7.8x the file
above the interpreter; 518 MiB in all after, docs/reliability.md), and the frame is the
one the whole table made at once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from fuzz_inputs import limit_memory

from gpudiag import rundir

REPO = Path(__file__).resolve().parents[1]
STRAGGLER_RUN = REPO / "sample_runs" / "ddp4_straggler"

_MISSING = object()
# One column per way a column's kinds can mix across blocks: the block-wise frame must
# equal from_records of all the rows (dtype, values, column order).
_COLUMNS = {
    "ints": lambda i: i,
    "ints_then_missing": lambda i: i if i < 20 else _MISSING,
    "ints_then_none": lambda i: i if i < 20 else None,
    "ints_and_floats": lambda i: i if i % 7 else i + 0.5,
    "floats_in_one_block": lambda i: 1.5 if 10 <= i < 13 else i,
    "str": lambda i: f"s{i % 3}",
    "str_then_missing": lambda i: "x" if i < 15 else _MISSING,
    "str_one_none": lambda i: None if i == 17 else "y",
    "none_then_ints": lambda i: None if i < 10 else i,
    "bool": lambda i: i % 2 == 0,
    "bool_one_missing": lambda i: True if i != 25 else _MISSING,
    "lists": lambda i: [i, i],
    "late_column": lambda i: i if i > 30 else _MISSING,
    "beyond_int64": lambda i: 2**63 + i if i > 20 else i,
    "str_or_int": lambda i: "g" if i % 5 == 0 else i,
    "one_row": lambda i: "only" if i == 4 else _MISSING,
}


def _rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        row = {name: make(i) for name, make in _COLUMNS.items()}
        rows.append({k: v for k, v in row.items() if v is not _MISSING})
    return rows


def _same_frame(got: pd.DataFrame, want: pd.DataFrame) -> None:
    assert list(got.columns) == list(want.columns)
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_column_type=True)
    for name in want.columns:  # object columns: the very values (1 stays 1, None None)
        if want[name].dtype == object:
            assert [repr(v) for v in got[name]] == [repr(v) for v in want[name]], name


@pytest.mark.parametrize("block", [1, 3, 7, 16, 40, 100])
def test_blockwise_frame_is_the_whole_tables_frame(
    block: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(40)
    want = pd.DataFrame.from_records([dict(r) for r in rows])
    monkeypatch.setattr(rundir.tables, "TABLE_BLOCK_ROWS", block)
    table = rundir.tables.Table()
    for row in rows:
        table.append(dict(row))
    _same_frame(table.frame(["unused"]), want)


def test_empty_table_has_its_columns() -> None:
    frame = rundir.tables.Table().frame(rundir.STEP_COLUMNS)
    assert list(frame.columns) == list(rundir.STEP_COLUMNS) and frame.empty


def test_run_read_in_blocks_of_two_rows_is_the_same_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every table of a real run (4 ranks, a clock offset on one node so the instants
    move) read two rows at a time equals it read whole."""
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER_RUN, run)
    shutil.copytree(run / "node0", run / "node1")
    for rank in (2, 3):  # on node 1, whose clock is 5 us behind node 0's
        info = json.loads((run / f"rank{rank}" / "rank_info.json").read_text())
        (run / f"rank{rank}" / "rank_info.json").write_text(json.dumps(dict(info, node_rank=1)))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["nodes"] = {"1": {"node_rank": 1, "clock": {"offset_ns": 5000}}}
    (run / "manifest.json").write_text(json.dumps(manifest))
    whole = rundir.load_run(run)
    assert whole.clock_offsets == {2: 5000, 3: 5000}
    monkeypatch.setattr(rundir.tables, "TABLE_BLOCK_ROWS", 2)
    blocks = rundir.load_run(run)
    for name in ("steps", "regions", "ddp_stats", "gpu_samples", "host_samples"):
        want, got = getattr(whole, name), getattr(blocks, name)
        assert len(want) > 2 or name in ("regions", "ddp_stats", "gpu_samples"), name
        _same_frame(got, want)
    assert blocks.warnings == whole.warnings


LOAD_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    import pandas
    from gpudiag import rundir
    rundir.load_run(sys.argv[2])  # the code paths' own imports and caches, on the sample run
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    run = rundir.load_run(sys.argv[1])
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    steps = run.steps
    print(json.dumps({"base": base, "peak": peak, "rows": len(steps),
                      "last_step": int(steps["step"].max()), "warnings": run.warnings,
                      "frame": int(steps.memory_usage(deep=True).sum())}))
    """
)
# Measured (this change): 1.16x the file above the imports (after a load of the sample run)
# for a 32 MB steps.jsonl: the final columns ~0.48x, the join's copy of one column, a block
# of row dicts and the reader's buffers on top. The code before: 8.3x (one dict per row,
# then from_records' object matrix).
GROWTH_PER_FILE_BYTE = 1.5


def _long_steps_table(path: Path, size: int) -> int:
    """A rank's steps.jsonl of ~``size`` bytes: the sample run's rows repeated with
    increasing step numbers and times (a long job). Returns the number of rows."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    span = rows[-1]["end_ns"] - rows[0]["start_ns"] + 1000
    written = copies = 0
    with open(path, "w") as fh:
        while written < size:
            text = "".join(
                json.dumps(
                    dict(
                        r,
                        step=r["step"] + copies * len(rows),
                        start_ns=r["start_ns"] + copies * span,
                        end_ns=r["end_ns"] + copies * span,
                    ),
                    separators=(",", ":"),
                )
                + "\n"
                for r in rows
            )
            fh.write(text)
            written += len(text)
            copies += 1
    return copies * len(rows)


def test_long_steps_table_is_read_in_bounded_memory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(STRAGGLER_RUN, run)
    steps = run / "rank1" / "steps.jsonl"
    rows = _long_steps_table(steps, 32_000_000)
    size = steps.stat().st_size
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, str(run), str(STRAGGLER_RUN)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        preexec_fn=limit_memory,  # an unbounded read fails fast instead of filling memory
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got["warnings"] == []
    sample = rundir.load_run(STRAGGLER_RUN).steps
    others = int((sample["rank"] != 1).sum())
    assert got["rows"] == rows + others
    assert got["last_step"] == rows - 1
    growth = got["peak"] - got["base"]
    assert growth <= GROWTH_PER_FILE_BYTE * size, (
        f"reading a {size / 1e6:.0f} MB steps table took {growth / 2**20:.0f} MiB above the "
        f"imports ({growth / size:.2f}x; frame {got['frame'] / 2**20:.0f} MiB)"
    )
