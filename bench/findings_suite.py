"""Precision and recall of gpudiag's findings on a labelled suite (docs/findings.md).

The suite (bench/findings_labels.json) lists real 2-4 rank gloo jobs, each recorded with
`gpudiag trace` around tests/scripts/suite_train.py with one injected problem or none,
and the real GPU trace sets in ../shared/traces, each with the findings it must have
(kind and ranks) and the kinds it must not have.

    python bench/findings_suite.py record --out /tmp/suite/rep1 [--hog] [--cases a,b]
    python bench/findings_suite.py evaluate /tmp/suite/rep1 /tmp/suite/rep2 ... [--json F]

``record`` runs every gloo case once (``--hog``: with a CPU-bound neighbour process
spinning for the whole recording) and writes load.json (load averages before and after,
whether the hog ran). ``evaluate`` analyses every recorded run and every trace set with
the current code and prints, per repetition and in total, each case's verdict and per
kind: true positives (a finding a label asks for, right ranks), false positives (a kind
the case must not have, or a required kind naming the wrong ranks), misses, precision and
recall; false positives at high or medium severity are counted apart. Kinds a case
neither requires nor forbids are listed but not scored, as are the kinds a case lists as
``low_ok`` when they come at low severity (true but small: e.g. the ~2 ms a DataLoader
without workers takes per batch).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
LABELS = REPO / "bench" / "findings_labels.json"
SCRIPT = REPO / "tests" / "scripts" / "suite_train.py"
TRACES = REPO.parent / "shared" / "traces"
JOB_TIMEOUT_S = 300
SEVERE = ("high", "medium")


def load_labels(path: Path = LABELS) -> dict[str, Any]:
    return json.loads(path.read_text())


# --------------------------------------------------------------------------- record


def trace_command(out: Path, case: dict[str, Any]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpudiag",
        "trace",
        "--nproc-per-node",
        str(case["ranks"]),
        "--standalone",
        "--no-lint",
        "--out",
        str(out),
        *case.get("trace_options", []),
        str(SCRIPT),
        *case.get("args", []),
    ]


def _hog() -> subprocess.Popen:
    """A CPU-bound neighbour: one process spinning in Python."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def record(out: Path, cases: list[dict[str, Any]], hog: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    load = {"hog": hog, "load_before": os.getloadavg(), "runs": {}}
    neighbour = _hog() if hog else None
    try:
        for case in cases:
            run_dir = out / case["name"]
            t0 = time.monotonic()
            proc = subprocess.run(
                trace_command(run_dir, case),
                capture_output=True,
                text=True,
                timeout=JOB_TIMEOUT_S,
                check=False,
                env=env,
            )
            took = time.monotonic() - t0
            load["runs"][case["name"]] = {
                "exit_code": proc.returncode,
                "seconds": round(took, 1),
                "load_1min": os.getloadavg()[0],
            }
            print(f"{case['name']:28s} exit {proc.returncode:4d} {took:6.1f} s", flush=True)
            if proc.returncode not in (0, *case.get("exit_codes", [])):
                (out / f"{case['name']}.log").write_text(proc.stdout[-4000:] + proc.stderr[-8000:])
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    load["load_after"] = os.getloadavg()
    (out / "load.json").write_text(json.dumps(load, indent=1))


# --------------------------------------------------------------------------- evaluate


def _matches(finding: Any, label: dict[str, Any]) -> bool:
    if finding.kind != label["kind"]:
        return False
    return "ranks" not in label or sorted(finding.ranks) == sorted(label["ranks"])


def judge(findings: list[Any], case: dict[str, Any]) -> dict[str, Any]:
    """Per finding: tp (a required one), fp (forbidden, or required with wrong ranks),
    or unscored; per required label: found or missed."""
    must = case.get("must", [])
    must_not = set(case.get("must_not", []))
    low_ok = set(case.get("low_ok", []))
    rows = []
    for f in findings:
        if any(_matches(f, m) for m in must):
            verdict = "tp"
        elif f.kind in low_ok and f.severity == "low":
            verdict = "unscored"
        elif f.kind in must_not or any(m["kind"] == f.kind for m in must):
            verdict = "fp"
        else:
            verdict = "unscored"
        rows.append(
            {
                "kind": f.kind,
                "severity": f.severity,
                "ranks": list(f.ranks),
                "cost_ms_per_step": round(float(f.cost_ms_per_step or 0.0), 2),
                "verdict": verdict,
            }
        )
    missed = [m for m in must if not any(_matches(f, m) for f in findings)]
    return {"findings": rows, "missed": missed}


def analyse_case(path: Path) -> list[Any] | str:
    from gpudiag.analysis import analyze

    try:
        return analyze(path).findings
    except Exception as exc:  # noqa: BLE001 - a broken analysis is a result too
        return f"{type(exc).__name__}: {exc}"


def evaluate_dir(rep: Path, labels: dict[str, Any], include_traces: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cases = [(c, rep / c["name"]) for c in labels["gloo"]]
    if include_traces:
        cases += [(c, TRACES / c["name"]) for c in labels["traces"]]
    for case, path in cases:
        if not path.exists():
            out[case["name"]] = {"error": "not recorded"}
            continue
        findings = analyse_case(path)
        if isinstance(findings, str):
            out[case["name"]] = {"error": findings}
            continue
        out[case["name"]] = judge(findings, case)
    return out


def tally(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per kind: tp, fp, fp_severe (high/medium), missed."""
    per: dict[str, dict[str, int]] = {}

    def row(kind: str) -> dict[str, int]:
        return per.setdefault(kind, {"tp": 0, "fp": 0, "fp_severe": 0, "missed": 0})

    for res in results.values():
        for f in res.get("findings", []):
            if f["verdict"] == "tp":
                row(f["kind"])["tp"] += 1
            elif f["verdict"] == "fp":
                row(f["kind"])["fp"] += 1
                if f["severity"] in SEVERE:
                    row(f["kind"])["fp_severe"] += 1
        for m in res.get("missed", []):
            row(m["kind"])["missed"] += 1
    return per


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}" if b else "-"


def table(per: dict[str, dict[str, int]]) -> str:
    lines = [
        "| kind | TP | FP (high/medium) | missed | precision | recall |",
        "|---|---|---|---|---|---|",
    ]
    for kind in sorted(per):
        r = per[kind]
        lines.append(
            f"| `{kind}` | {r['tp']} | {r['fp']} ({r['fp_severe']}) | {r['missed']} | "
            f"{_ratio(r['tp'], r['tp'] + r['fp'])} | {_ratio(r['tp'], r['tp'] + r['missed'])} |"
        )
    return "\n".join(lines)


def _case_line(name: str, res: dict[str, Any]) -> str:
    if "error" in res:
        return f"  {name:28s} ERROR {res['error']}"
    bad = [f for f in res["findings"] if f["verdict"] == "fp"]
    mark = "ok " if not bad and not res["missed"] else "BAD"
    shown = ", ".join(
        f"{f['kind']}[{f['severity'][0]}]{f['ranks']}={f['cost_ms_per_step']}"
        f"{'' if f['verdict'] != 'fp' else ' FP'}"
        for f in res["findings"]
    )
    missed = "".join(f" MISSED {m['kind']}{m.get('ranks', '')}" for m in res["missed"])
    return f"  {mark} {name:28s} {shown}{missed}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--hog", action="store_true", help="a CPU-bound neighbour process runs")
    rec.add_argument("--cases", default="", help="comma-separated case names (default all)")
    ev = sub.add_parser("evaluate")
    ev.add_argument("reps", type=Path, nargs="+", help="directories written by record")
    ev.add_argument("--json", type=Path, default=None)
    ev.add_argument("--no-traces", action="store_true", help="skip ../shared/traces")
    args = p.parse_args(argv)
    labels = load_labels()
    if args.cmd == "record":
        wanted = {c for c in args.cases.split(",") if c}
        cases = [c for c in labels["gloo"] if not wanted or c["name"] in wanted]
        record(args.out, cases, args.hog)
        return 0
    total: dict[str, dict[str, int]] = {}
    everything = {}
    for i, rep in enumerate(args.reps):
        load = json.loads((rep / "load.json").read_text()) if (rep / "load.json").exists() else {}
        results = evaluate_dir(rep, labels, include_traces=not args.no_traces and i == 0)
        everything[str(rep)] = {"load": load, "results": results}
        print(f"## {rep} (hog: {load.get('hog')}, load before {load.get('load_before')})")
        for name, res in results.items():
            print(_case_line(name, res))
        per = tally(results)
        print(table(per))
        for kind, r in per.items():
            t = total.setdefault(kind, {"tp": 0, "fp": 0, "fp_severe": 0, "missed": 0})
            for k in t:
                t[k] += r[k]
    print("## all repetitions")
    print(table(total))
    if args.json:
        args.json.write_text(json.dumps({"reps": everything, "total": total}, indent=1))
    bad = sum(r["fp_severe"] + r["missed"] for r in total.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
