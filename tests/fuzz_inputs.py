"""Mutation fuzzer over every input `gpudiag analyze` reads (issue 16 item 11).

Shared by tests/test_fuzz_inputs.py (hypothesis, a few hundred examples) and
bench/fuzz.py (the full run). A base is a small real input: the shipped gloo sample run
(sample_runs/ddp2_healthy, its traces cut to a few hundred events around the
collectives) or a foreign trace directory (two ranks of the recorded DLRM traces, cut
the same way). A mutation damages one file of a copy of it; `run_case` analyses the copy
in-process through the CLI and returns the crash site when anything escaped as an
exception (a traceback), else None.

Besides damaged content, a file (or a rank directory, or traces/) may be replaced by
what no reader should read: /dev/zero through a symlink (an endless file), a FIFO (an
open that would block), a socket, a directory, a symlink loop, or made unreadable
(mode 000). Such a case runs in a subprocess with a timeout and a memory limit, so a
hang or an unbounded read is reported as a crash site instead of stopping the fuzzer;
as root (which ignores permissions) that subprocess drops the capabilities that let
root read anything (setpriv), and without setpriv no case is made unreadable.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import io
import json
import os
import random
import re
import shutil
import socket
import stat
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
SAMPLE_RUN = REPO / "sample_runs" / "ddp2_healthy"
FOREIGN = REPO.parent / "shared" / "traces" / "param_dlrm_ddp8"

# every file kind of a run directory (docs/run-format.md) and a foreign trace
KINDS = (
    "manifest.json",
    "rank0/status.json",
    "rank1/status.json",
    "rank0/rank_info.json",
    "rank0/summary.json",
    "rank0/steps.jsonl",
    "rank1/steps.jsonl",
    "rank0/collectives.jsonl",
    "rank0/collective_times.jsonl",
    "rank0/ddp_stats.jsonl",
    "rank0/regions.jsonl",
    "rank0/inflight.json",
    "rank0/stacks.txt",
    "node0/host_samples.jsonl",
    "node0/gpu_samples.jsonl",
    "hang_report.json",
    "lint.json",
    "bench.json",
    "traces/rank0.pt.trace.json.gz",
    "traces/rank1.pt.trace.json.gz",
    "rank1",  # the rank directory itself
    "traces",  # the traces directory itself
    "foreign:rank0",  # a trace of a foreign (non-gpudiag) trace directory
    "foreign:rank1",
)

WEIRD: list[Any] = [
    None,
    True,
    False,
    "",
    "2",
    "abc",
    "ProfilerStep#-1",
    "ProfilerStep#99999999999999999999",
    [2],
    [],
    {},
    {"a": 1},
    -1,
    0,
    2,
    10**20,
    -(10**20),
    2**63,
    1.5,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    "NaN",
    "1e400",
    "x" * 300,
    "\x00\n\t",
    "\ud800",  # a lone surrogate: json.dumps writes the escape "\ud800"
    "x\udfffy",
    "![t](http://host/x.png)",
    [[1, 2], [3]],
    {"1": {"2": {"3": []}}},
]

_HANG_KEYS = ["culprit", "ranks", "waiting", "last_collective", "stuck", "reason", "0", "x"]


def _nested(depth: int, kind: str) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


def cut_trace(doc: dict, marker: str, around: int = 15, keep: int = 12) -> dict:
    """A real trace cut small: thread names, steps and events around a few comm events."""
    events = doc.get("traceEvents", [])
    out = [e for e in events if e.get("ph") == "M"]
    comm = [i for i, e in enumerate(events) if marker in str(e.get("name", "")).lower()][:keep]
    idx = sorted({j for i in comm for j in range(max(i - around, 0), min(i + around, len(events)))})
    out += [events[i] for i in idx]
    out += [e for e in events if str(e.get("name", "")).startswith("ProfilerStep")]
    return {**doc, "traceEvents": out}


def make_bases(root: Path) -> dict[str, Path]:
    """The two small real bases, written once under ``root``."""
    bases = {"run": root / "base_run", "foreign": root / "base_foreign"}
    if not bases["run"].is_dir():
        shutil.copytree(SAMPLE_RUN, bases["run"])
        for p in sorted((bases["run"] / "traces").glob("*.json.gz")):
            doc = cut_trace(orjson.loads(gzip.decompress(p.read_bytes())), "gloo:")
            p.write_bytes(gzip.compress(orjson.dumps(doc), 1))
    if not bases["foreign"].is_dir():
        bases["foreign"].mkdir(parents=True)
        for i, p in enumerate(sorted(FOREIGN.glob("*.json.gz"))[:2]):
            doc = cut_trace(orjson.loads(gzip.decompress(p.read_bytes())), "nccl")
            (bases["foreign"] / f"rank{i}.json.gz").write_bytes(gzip.compress(orjson.dumps(doc), 1))
    return bases


# --------------------------------------------------------------------------- mutations


def _paths(value: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Every (path) to a value inside a JSON document, capped for big documents."""
    out = [prefix]
    if depth > 6:
        return out
    if isinstance(value, dict):
        for k, v in list(value.items())[:40]:
            out.extend(_paths(v, (*prefix, k), depth + 1))
    elif isinstance(value, list):
        for i, v in enumerate(value[:40]):
            out.extend(_paths(v, (*prefix, i), depth + 1))
    return out


def _weird(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.05:
        return _nested(rng.choice([50, 3000, 100_000]), rng.choice(["list", "dict"]))
    return rng.choice(WEIRD)


def mutate_json(doc: Any, rng: random.Random, hang: bool = False) -> Any:
    """One structural mutation: replace / delete / add a value somewhere in ``doc``."""
    paths = _paths(doc)
    path = rng.choice(paths)
    op = rng.choice(["set", "set", "delete", "add", "root"])
    if op == "root" or not path:
        return _weird(rng) if rng.random() < 0.7 else doc
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if op == "delete":
        del parent[last]
    elif op == "add" and isinstance(parent, dict):
        key = rng.choice(_HANG_KEYS) if hang else rng.choice(["x", "0", "-1", "1e3", ""])
        parent[key] = _weird(rng)
    else:
        parent[last] = _weird(rng)
    return doc


def _dump(doc: Any) -> bytes:
    try:
        return json.dumps(doc).encode()  # NaN / Infinity literals, as Python writes them
    except (ValueError, RecursionError, OverflowError):
        try:
            return orjson.dumps(doc)
        except (orjson.JSONEncodeError, TypeError):
            return b'{"unserialisable": true}'


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    op = rng.choice(["truncate", "flip", "empty", "garbage", "insert"])
    if op == "empty" or not data:
        return b""
    if op == "truncate":
        return data[: rng.randrange(len(data))]
    if op == "flip":
        buf = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            buf[rng.randrange(len(buf))] = rng.randrange(256)
        return bytes(buf)
    if op == "garbage":
        return bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    i = rng.randrange(len(data))
    inserted = rng.choice(
        [b"\x00", b"\n", b"{", b"]", b"\xff\xfe", b"NaN", b"\\ud800", b"\xed\xa0\x80"]
    )
    return data[:i] + inserted + data[i:]


def _mutate_jsonl(data: bytes, rng: random.Random) -> bytes:
    lines = data.splitlines()
    if not lines or rng.random() < 0.15:
        return mutate_bytes(data, rng)
    i = rng.randrange(len(lines))
    roll = rng.random()
    if roll < 0.7:
        try:
            row = json.loads(lines[i])
        except ValueError:
            row = {}
        lines[i] = _dump(mutate_json(row, rng))
    elif roll < 0.85:
        lines[i] = _dump(_weird(rng))
    else:
        lines.insert(i, lines[i])  # a duplicated row
    return b"\n".join(lines) + b"\n"


def _mutate_trace(data: bytes, rng: random.Random) -> bytes:
    gz = data[:2] == b"\x1f\x8b"
    raw = gzip.decompress(data) if gz else data
    if rng.random() < 0.15:
        out = mutate_bytes(raw, rng)
    else:
        doc = orjson.loads(raw)
        for _ in range(rng.randint(1, 4)):
            events = doc.get("traceEvents") if isinstance(doc, dict) else None
            if rng.random() < 0.6 and isinstance(events, list) and events:
                ev = events[rng.randrange(len(events))]
                if not isinstance(ev, dict):
                    continue
                if rng.random() < 0.3:
                    ev["name"] = rng.choice(
                        ["ProfilerStep#-1", "ProfilerStep#99999999999999999999", "ProfilerStep#x"]
                    )
                else:
                    mutate_json(ev, rng)
            else:
                doc = mutate_json(doc, rng)
        out = _dump(doc)
    if gz and rng.random() < 0.8:
        out = gzip.compress(out, 1)
        if rng.random() < 0.1:
            out = mutate_bytes(out, rng)
    return out


def mutate_case(bases: dict[str, Path], work: Path, kind: str, seed: int) -> Path:
    """A copy of the base with the file ``kind`` damaged; returns the path to analyse."""
    rng = random.Random(seed)
    foreign = kind.startswith("foreign:")
    base = bases["foreign" if foreign else "run"]
    remove_tree(work)
    shutil.copytree(base, work)
    rel = kind.split(":", 1)[1] + ".json.gz" if foreign else kind
    target = work / rel
    if kind in ("rank1", "traces"):
        roll = rng.random()
        if roll < 0.25 and can_deny():
            target.chmod(0)  # permission denied (a reader other than the owner)
            return work
        if roll < 0.35:
            shutil.rmtree(target)
            target.symlink_to("/dev/zero")
            return work
        shutil.rmtree(target)
        if roll < 0.55:
            target.write_bytes(b"not a directory")
        elif roll < 0.75:
            target.symlink_to(work / "does-not-exist")
        else:
            target.mkdir()
            inner = "rank1.pt.trace.json.gz" if kind == "traces" else "steps.jsonl"
            (target / inner).mkdir()  # a directory where a file should be
        return work
    if rng.random() < 0.08:  # the file replaced by something no reader should read
        replace_unusable(target, rng.choice(UNUSABLE))
        return work
    data = target.read_bytes() if target.is_file() else b""
    if not data:  # a kind this base lacks: write one from scratch
        data = _dump({"x": 1}) + (b"\n" if kind.endswith(".jsonl") else b"")
    if ".trace." in rel or foreign:
        out = _mutate_trace(data, rng)
    elif kind.endswith(".jsonl"):
        out = _mutate_jsonl(data, rng)
    elif kind.endswith(".json"):
        if rng.random() < 0.15:
            out = mutate_bytes(data, rng)
        else:
            try:
                doc = json.loads(data)
            except ValueError:
                doc = {}
            for _ in range(rng.randint(1, 3)):
                doc = mutate_json(doc, rng, hang=kind == "hang_report.json")
            out = _dump(doc)
    else:
        out = mutate_bytes(data, rng)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(out)
    return work


# What a file can be replaced by that must be refused without being read.
UNUSABLE = ("dev_zero", "fifo", "socket", "directory", "symlink_loop", "no_permission")


@functools.cache
def can_deny() -> bool:
    """Whether an unreadable file can be tested here: not root, or root able to drop the
    capabilities that let it read anything (see :func:`unprivileged`)."""
    if os.geteuid() != 0:
        return True
    try:
        return subprocess.run([*unprivileged(), "true"], timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def unprivileged() -> list[str]:
    """The command prefix that runs a command as root without the capabilities to read
    files whatever their permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH): mode 000
    then means permission denied, as for any other user. Nothing as a non-root user."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def replace_unusable(target: Path, how: str) -> None:
    """Put at ``target`` (a file) one of UNUSABLE: /dev/zero through a symlink (an endless
    file), a FIFO, a socket, a directory, a symlink loop, or the file made unreadable."""
    if how == "no_permission" and not can_deny():
        how = "fifo"
    if how == "no_permission":
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(b"{}\n")
        target.chmod(0)
        return
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    if how == "dev_zero":
        target.symlink_to("/dev/zero")
    elif how == "fifo":
        os.mkfifo(target)
    elif how == "socket":
        sock = socket.socket(socket.AF_UNIX)
        try:
            sock.bind(str(target))  # left bound: nobody listens, so opening it fails
        except OSError:  # a path too long for a socket
            os.mkfifo(target)
        finally:
            sock.close()
    elif how == "directory":
        target.mkdir()
    else:
        target.symlink_to(target)  # a symlink loop


def remove_tree(path: Path) -> None:
    """``shutil.rmtree`` that first gives back the permissions a case took away."""
    if not path.exists():
        return
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            if not os.path.islink(full) and stat.S_IMODE(os.lstat(full).st_mode) == 0:
                os.chmod(full, 0o700)
    if stat.S_IMODE(os.lstat(path).st_mode) == 0:
        os.chmod(path, 0o700)
    shutil.rmtree(path)


def needs_isolation(path: Path) -> tuple[bool, bool]:
    """(whether analysing ``path`` could hang or read without end were gpudiag wrong:
    it holds a FIFO, a socket or a symlink to a device; whether it holds something made
    unreadable). Either case runs in a subprocess (:func:`run_case`)."""
    special = denied = False
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                try:
                    st = os.stat(full)
                except OSError:
                    continue
                special = special or not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode))
            elif stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                special = True
            elif stat.S_IMODE(st.st_mode) == 0:
                denied = True
    return special, denied


ISOLATED_TIMEOUT_S = 90
ISOLATED_MEMORY_BYTES = 6 << 30  # address space: the imports need ~2 GiB of it


def limit_memory() -> None:
    """For preexec_fn: an address-space limit, so an unbounded read fails fast."""
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (ISOLATED_MEMORY_BYTES, ISOLATED_MEMORY_BYTES))


_FRAME_RE = re.compile(r'^\s*File "([^"]+)", line (\d+)')


def _site_from_stderr(text: str) -> str:
    """``file:line ExcType`` of the last gpudiag frame of a printed traceback."""
    frames = [m for m in map(_FRAME_RE.match, text.splitlines()) if m]
    ours = [f for f in frames if "/gpudiag/" in f.group(1)] or frames
    last = text.strip().splitlines()[-1] if text.strip() else ""
    exc = last.split(":", 1)[0] if last and not last.startswith(" ") else "traceback"
    if not ours:
        return f"traceback printed on stderr ({exc})"
    return f"{os.path.relpath(ours[-1].group(1), REPO)}:{ours[-1].group(2)} {exc}"


def _run_isolated(argv: list[str], drop: bool) -> tuple[int | None, str | None, str]:
    cmd = [*(unprivileged() if drop else []), sys.executable, "-m", "gpudiag", "analyze", *argv]
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            timeout=ISOLATED_TIMEOUT_S,
            preexec_fn=limit_memory,
        )
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        return None, f"hang: no exit within {ISOLATED_TIMEOUT_S} s", err
    if "Traceback" in proc.stderr or proc.returncode not in (0, 1, 2):
        return proc.returncode, _site_from_stderr(proc.stderr), proc.stderr
    return proc.returncode, None, proc.stderr


# --------------------------------------------------------------------------- running


def run_case(path: Path, mode: str, html_out: Path) -> tuple[int | None, str | None, str]:
    """Analyse ``path`` through the CLI in-process (in a subprocess with a timeout and a
    memory limit when :func:`needs_isolation`). Returns (exit code, crash site or None,
    stderr). A crash site is where an exception escaped, as ``file:line``, or a hang."""
    from gpudiag.cli.analyze import main as analyze_main

    argv = [str(path), "--workers", "1"]  # no process pool per case: 3x faster
    if mode == "json":
        argv.append("--json")
    elif mode == "html":
        argv += ["--html", str(html_out)]
    special, denied = needs_isolation(path)
    if special or denied:
        return _run_isolated(argv, denied)
    err = io.StringIO()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = analyze_main(argv)
    except SystemExit as exc:  # argparse
        return (exc.code if isinstance(exc.code, int) else 2), None, err.getvalue()
    except BaseException as exc:  # noqa: BLE001 - that is what the fuzzer looks for
        if isinstance(exc, KeyboardInterrupt):
            raise
        frames = traceback.extract_tb(exc.__traceback__)
        ours = [f for f in frames if "/gpudiag/" in f.filename] or frames
        site = f"{os.path.relpath(ours[-1].filename, REPO)}:{ours[-1].lineno} {type(exc).__name__}"
        return None, site, err.getvalue()
    text = err.getvalue()
    if "Traceback" in text:
        return code, "traceback printed on stderr", text
    return code, None, text
