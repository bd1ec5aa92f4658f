"""A recorded 4-rank run laid out as the per-node directories of a 2-node job, for the
fast tests of the live view over per-node directories (tests/test_live_nodes_units.py,
tests/test_dashboard_live.py).

sample_runs/ddp4_straggler (one host, rank 2 slow) is copied into ``job/node0`` (ranks
0-1, manifest.json, node 0's samples) and ``job/node1`` (ranks 2-3, manifest.node1.json,
the same host samples as node 1's), both marked running by a live launcher, with one job
id. Node 1's clock is made ``offset_ns`` behind: its rows are written with that shift and
its manifest records the offset the clock exchange would have measured, so a reader that
applies the offset gets the recording's own times back. The rows are the recording's;
only the layout, the node numbers and node 1's clock are changed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path

from gpudiag import rundir

SAMPLE = Path(__file__).resolve().parents[1] / "sample_runs" / "ddp4_straggler"
JOB_ID = "live-nodes-test-job"


def _shift_table(path: Path, shift_ns: int) -> None:
    lines = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        for key in rundir.INSTANT_COLUMNS:
            if isinstance(row.get(key), int):
                row[key] -= shift_ns
        lines.append(json.dumps(row))
    path.write_text("".join(f"{x}\n" for x in lines))


def _manifest(node: int, pid: int) -> dict:
    manifest = json.loads((SAMPLE / "manifest.json").read_text())
    manifest.update(status="running", end_ns=None, exit_code=None, node_rank=node, nnodes="2")
    manifest["launcher"] = {"pid": pid, "hostname": socket.gethostname()}
    manifest["clock"] = {"job_id": JOB_ID, "offset_ns": 0}
    return manifest


def split_job(job: Path, offset_ns: int, pid: int | None = None) -> list[Path]:
    """The two node directories under ``job`` (see the module text), running."""
    pid = os.getpid() if pid is None else pid
    dirs = [job / "node0", job / "node1"]
    for node, d in enumerate(dirs):
        d.mkdir(parents=True)
        for rank in (2 * node, 2 * node + 1):
            shutil.copytree(SAMPLE / f"rank{rank}", d / f"rank{rank}")
            (d / f"rank{rank}" / "status.json").unlink(missing_ok=True)
            info = json.loads((SAMPLE / f"rank{rank}" / "rank_info.json").read_text())
            info["node_rank"] = node
            (d / f"rank{rank}" / "rank_info.json").write_text(json.dumps(info))
        shutil.copytree(SAMPLE / "node0", d / f"node{node}")
    (dirs[0] / "manifest.json").write_text(json.dumps(_manifest(0, pid)))
    node1 = _manifest(1, pid)
    node1["clock"]["offset_ns"] = offset_ns  # add it to node 1's times: node 0's clock
    node1["start_ns"] -= offset_ns
    (dirs[1] / "manifest.node1.json").write_text(json.dumps(node1))
    for table in dirs[1].glob("*/*.jsonl"):
        _shift_table(table, offset_ns)  # written on node 1's clock
    for name in ("rank_info.json",):
        for doc in dirs[1].glob(f"rank*/{name}"):
            obj = json.loads(doc.read_text())
            for key in rundir.INSTANT_COLUMNS:
                if isinstance(obj.get(key), int):
                    obj[key] -= offset_ns
            doc.write_text(json.dumps(obj))
    return dirs


def set_status(dirs: list[Path], status: str) -> None:
    """Both launchers ended with ``status``."""
    for d, name in zip(dirs, ("manifest.json", "manifest.node1.json"), strict=True):
        manifest = json.loads((d / name).read_text())
        manifest.update(status=status, exit_code=0 if status == "ok" else 1)
        (d / name).write_text(json.dumps(manifest))
