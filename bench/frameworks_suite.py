"""Issue 29: do gpudiag's findings hold on real framework scripts and busy hosts?

HELD-OUT SPLIT (chosen 2026-12-02 10:40 UTC, before any case was recorded or analysed):
rule: sort the 20 case names "framework:inject" by sha256(name).hexdigest() and hold out
the first round(20 / 3) = 7. They are:

    hf_trainer:slow_data_rank, torchvision_spawn:none, accelerate_loop:grad_accum,
    hf_trainer:startup_wait, torchvision_spawn:grad_accum_no_sync,
    torchvision_spawn:slow_data_rank, torchvision_spawn:grad_accum

Whoever tunes gpudiag tunes on `--split tuned` only and reports `--split held_out` apart.
(`held_out_cases()` recomputes the rule; the suite refuses to run if it disagrees with
HELD_OUT below, so adding a case cannot silently move the split.)

What it does: records each (framework, inject) case with `gpudiag trace` (scripts in
tests/frameworks/), runs `gpudiag analyze RUN --json` and scores the findings against the
issue's goals, per repetition:

  1. no false medium/high finding (any case, healthy or injected);
  2. the injected problem found at medium or high, with a cost within 20 % of the injected
     time per step (ACCEPT below says which kinds count and why);
  3. no inversion: the injected problem's severity >= the highest severity of the same
     framework's healthy run (`none`) in the same repetition and host condition.

    python bench/frameworks_suite.py --out /tmp/fw --repeat 1
    python bench/frameworks_suite.py --out /tmp/fw_busy --split tuned --hogs 3
    python bench/frameworks_suite.py --cases lightning_ddp:none,hf_trainer:none --out /tmp/x
    python bench/frameworks_suite.py --rescore /tmp/fw      # analyse and score recorded runs again

Ground truth comes from the scripts, not from gpudiag: each rank writes its own wall-clock
optimizer-step ends (`--timing-dir`), used for the grad-accumulation target below.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "frameworks"

# framework -> (script, launcher, injects). "torchrun": gpudiag trace --nproc-per-node 2
# (Lightning, HF Trainer and accelerate all read torchrun's environment); "spawn": the
# script starts its own 2 workers with torch.multiprocessing.spawn (gpudiag trace script.py).
FRAMEWORKS = {
    "lightning_ddp": (
        "lightning_ddp.py",
        "torchrun",
        ["none", "slow_compute_rank", "slow_data_rank", "startup_wait"],
    ),
    "hf_trainer": (
        "hf_trainer.py",
        "torchrun",
        ["none", "slow_compute_rank", "slow_data_rank", "startup_wait"],
    ),
    "accelerate_loop": (
        "accelerate_loop.py",
        "torchrun",
        [
            "none",
            "grad_accum",
            "slow_compute_rank",
            "slow_data_rank",
            "startup_wait",
            "grad_accum_no_sync",
        ],
    ),
    "torchvision_spawn": (
        "torchvision_spawn.py",
        "spawn",
        [
            "none",
            "grad_accum",
            "slow_compute_rank",
            "slow_data_rank",
            "startup_wait",
            "grad_accum_no_sync",
        ],
    ),
}
# Lightning and the HF Trainer do accumulation themselves, with no_sync: a user of their
# documented API cannot write grad_accum_no_sync, so those frameworks do not have the case.
# `grad_accum` is a healthy case: accumulation done right (accelerator.accumulate / no_sync).

ALL_CASES = [f"{fw}:{inj}" for fw, (_, _, injs) in FRAMEWORKS.items() for inj in injs]

HELD_OUT = [
    "hf_trainer:slow_data_rank",
    "torchvision_spawn:none",
    "accelerate_loop:grad_accum",
    "hf_trainer:startup_wait",
    "torchvision_spawn:grad_accum_no_sync",
    "torchvision_spawn:slow_data_rank",
    "torchvision_spawn:grad_accum",
]


def held_out_cases(cases=ALL_CASES):
    ranked = sorted(cases, key=lambda c: hashlib.sha256(c.encode()).hexdigest())
    return ranked[: round(len(cases) / 3)]


HEALTHY = {"none", "grad_accum"}
SLOW_RANK = 1
INJECT_MS = {"slow_compute_rank": 40.0, "slow_data_rank": 40.0, "startup_wait": 3000.0}
STEPS = 40  # optimizer steps per run (grad-accumulation cases: GA_STEPS)
GA_STEPS, GA_ACCUM = 20, 4
TOLERANCE = 0.20
SEV = {"low": 1, "medium": 2, "high": 3}

# Which finding kinds count as finding each injected problem (docs/findings.md), and why.
ACCEPT = {
    # One rank does 40 ms more compute per step; the other rank waits for it at the gradient
    # all-reduce. docs: `straggler` = "a rank that is late consistently", cost = "the time the
    # others stop waiting once this rank is as fast as they are" = the injected 40 ms.
    # Must name the slow rank alone.
    "slow_compute_rank": {"straggler": "rank"},
    # One rank's collate sleeps 40 ms per batch (num_workers=0, so the training thread waits).
    # Either view is right: that rank is a consistent straggler (cost: the others' wait, 40
    # ms), or the step waits for data (`dataloader_stall`, fix: workers/prefetch) on that rank.
    # The target is the 40 ms the job gets back per step either way; a dataloader_stall costed
    # as the mean over both ranks (20 ms) does not give the job's time back correctly.
    "slow_data_rank": {"straggler": "rank", "dataloader_stall": "includes_rank"},
    # Every rank's DataLoader worker waits 3 s before its first batch (a slow worker start:
    # opening an index), once; steady steps are normal. docs: `dataloader_stall` = "the step
    # waits for its batch", cost = mean data wait per step. Target: 3000 ms / the run's
    # steps per rank (the one-off wait spread over the run, what persistent/faster workers
    # give back per step). See the report: if gpudiag judges a one-off wait not worth a
    # per-step finding, this goal and that design disagree.
    # Changed 2026-12-02 by the engineer tuning gpudiag, after this suite's first report:
    # the issue itself says "a one-off start-up wait is reported once, as start-up, never as
    # a per-step cost", so the expected finding is `dataloader_startup` (low, cost 0 per
    # step, evidence `startup_ms`), scored on its one-off wait against the 3000 ms injected,
    # and the case's per-step `dataloader_stall` (the steady wait of its one worker) is
    # neither required nor false (STARTUP_UNSCORED).
    "startup_wait": {"dataloader_startup": "any"},
    # Accumulation over 4 micro-steps without no_sync/accelerator.accumulate: an all-reduce
    # on every micro-step instead of one per optimizer step. docs: `exposed_communication`'s
    # fix names "no_sync() accumulation"; `bucket_size` is not the fix. Target: the script-
    # measured median step time of this run minus that of the same framework's `grad_accum`
    # run (the same accumulation with no_sync) in the same repetition.
    "grad_accum_no_sync": {"exposed_communication": "any"},
}
# Kinds that are neither required nor forbidden on a case that does not inject them: a CPU
# gloo all-reduce really is exposed communication (docs/findings.md), so a healthy run's
# exposed_communication/bucket_size is not called false. They still count for inversion.
UNSCORED = {"exposed_communication", "bucket_size"}
# A one-off wait is reported once, at low severity, with its whole duration.
ONE_OFF = {"startup_wait"}
STARTUP_UNSCORED = {"dataloader_stall"}


def case_split(case):
    return "held_out" if case in HELD_OUT else "tuned"


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


# ---------------------------------------------------------------- recording
def start_hogs(k):
    return [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(k)]


def stop_hogs(procs):
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def record(case, run_dir: Path, hogs: int, timeout_s: float):
    fw, inj = case.split(":")
    script, launcher, _ = FRAMEWORKS[fw]
    timing = run_dir.with_name(run_dir.name + ".timing")
    for p in (run_dir, timing):
        if p.exists():
            shutil.rmtree(p)
    cmd = ["gpudiag", "trace", "--out", str(run_dir), "--hang-timeout", "120"]
    if launcher == "torchrun":
        cmd += ["--nproc-per-node", "2"]
    ga = inj in ("grad_accum", "grad_accum_no_sync")
    cmd += [
        str(SCRIPTS / script),
        "--inject",
        inj,
        "--slow-rank",
        str(SLOW_RANK),
        "--steps",
        str(GA_STEPS if ga else STEPS),
        "--accum",
        str(GA_ACCUM),
        "--timing-dir",
        str(timing),
    ]
    if inj in INJECT_MS:
        cmd += ["--inject-ms", str(INJECT_MS[inj])]
    meta = {"case": case, "cmd": cmd, "hogs": hogs, "load_before": loadavg()}
    hog_procs = start_hogs(hogs)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        meta["rc"] = proc.returncode
        out = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        meta["rc"] = "timeout"
        out = (
            (e.stdout or b"").decode(errors="replace")
            if isinstance(e.stdout, bytes)
            else (e.stdout or "")
        )
    finally:
        stop_hogs(hog_procs)
    meta["wall_s"] = round(time.time() - t0, 1)
    meta["load_after"] = loadavg()
    meta["trace_tail"] = out[-3000:]
    meta["tracebacks_in_trace_output"] = out.count("Traceback (most recent call last)")
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    run_dir.with_name(run_dir.name + ".meta.json").write_text(json.dumps(meta, indent=1))
    return meta


def analyze(run_dir: Path):
    p = subprocess.run(
        ["gpudiag", "analyze", str(run_dir), "--json"], capture_output=True, text=True, timeout=900
    )
    res = {"rc": p.returncode, "stderr": p.stderr[-2000:]}
    try:
        res["json"] = json.loads(p.stdout)
    except json.JSONDecodeError:
        res["json"] = None
    run_dir.with_name(run_dir.name + ".analysis.json").write_text(json.dumps(res))
    return res


def script_step_ms(run_dir: Path):
    """Median optimizer-step time over both ranks from the scripts' own logs (steps 2+)."""
    timing = run_dir.with_name(run_dir.name + ".timing")
    gaps = []
    for f in sorted(timing.glob("rank*.json")):
        ends = json.loads(f.read_text())["step_ends"]
        gaps += [(b - a) * 1000 for a, b in zip(ends[1:], ends[2:], strict=False)]
    return statistics.median(gaps) if gaps else None


def script_steps(run_dir: Path):
    timing = run_dir.with_name(run_dir.name + ".timing")
    n = [len(json.loads(f.read_text())["step_ends"]) for f in timing.glob("rank*.json")]
    return max(n) if n else None


# ---------------------------------------------------------------- scoring
def _why_capped(finding: dict) -> str:
    """The finding's title and the evidence that sets its severity (a failed CI run then
    says which hedge capped it)."""
    ev = finding.get("evidence") or {}
    keys = (
        "extra_ms_per_step",
        "main_cause",
        "starved_of_cpu",
        "unexplained_on_busy_host",
        "consistent",
        "chance_of_lateness",
        "host_cpu",
        "step_ms",
    )
    shown = {k: ev[k] for k in keys if k in ev}
    return f"{finding.get('title')!r} {shown}"


def fnd(f):
    return f"{f['kind']}:{f['severity']}:{f['cost_ms_per_step']:.1f}ms:r{f.get('ranks')}"


def matches(f, inj):
    rule = ACCEPT.get(inj, {}).get(f["kind"])
    if rule is None:
        return False
    ranks = f.get("ranks") or []
    if rule == "rank":
        return ranks == [SLOW_RANK]
    if rule == "includes_rank":
        return SLOW_RANK in ranks or not ranks
    return True


def target_ms(case, run_dir: Path, runs: dict):
    fw, inj = case.split(":")
    if inj in ("slow_compute_rank", "slow_data_rank"):
        return INJECT_MS[inj], f"{INJECT_MS[inj]:.0f} ms injected per step"
    if inj == "startup_wait":
        return INJECT_MS[inj], f"{INJECT_MS[inj]:.0f} ms once (the finding's startup_ms)"
    if inj == "grad_accum_no_sync":
        ref = runs.get(f"{fw}:grad_accum")
        a, b = script_step_ms(run_dir), ref and script_step_ms(ref)
        if a is None or b is None:
            return None, "no grad_accum reference"
        return a - b, f"step {a:.0f} ms - {b:.0f} ms with no_sync (script timing)"
    return None, ""


def measured_gain_ms(case, run_dir: Path, runs: dict):
    """What removing a slow rank's injected work gave back, timed by the scripts: the
    median step of this run minus the healthy run's of the same repetition. On a loaded
    2-core host a rank that spins 40 ms also slows its own threads, so the others wait
    longer than the 40 ms injected (measured 23-54 ms); the step the fix gives back is the
    truth the cost must meet, the injected time its quiet-host value. Added 2026-12-03 by
    the engineer tuning gpudiag, after the CI runs' 53.6 ms (+34 %) on a loaded host;
    None where either run has no script timing."""
    fw, inj = case.split(":")
    if inj != "slow_compute_rank" or f"{fw}:none" not in runs:
        return None
    a, b = script_step_ms(run_dir), script_step_ms(runs[f"{fw}:none"])
    return a - b if a is not None and b is not None and a > b else None


def _near(cost: float, target) -> bool:
    return target is not None and target > 0 and abs(cost - target) <= TOLERANCE * target


def score(case, run_dir: Path, runs: dict, results: dict):
    fw, inj = case.split(":")
    meta = json.loads(run_dir.with_name(run_dir.name + ".meta.json").read_text())
    ana = results[case]
    row = {
        "case": case,
        "split": case_split(case),
        "rc": meta.get("rc"),
        "wall_s": meta.get("wall_s"),
        "load": meta.get("load_before"),
        "host": "busy" if meta.get("hogs") else "quiet",
        "findings": [],
        "verdict": "FAIL",
        "why": [],
    }
    js = ana.get("json")
    if not js:
        row["why"].append(f"analyze rc={ana['rc']} no JSON: {ana['stderr'][-200:]}")
        return row
    fs = js.get("findings", [])
    row["findings"] = [fnd(f) for f in fs]
    row["status"] = js.get("run", {}).get("status")
    if js.get("run", {}).get("status") != "ok":
        row["why"].append(
            f"run status {js.get('run', {}).get('status')} (trace rc={meta.get('rc')})"
        )
    unscored = UNSCORED | (STARTUP_UNSCORED if inj in ONE_OFF else set())
    false = [
        f
        for f in fs
        if SEV[f["severity"]] >= 2
        and not matches(f, inj)
        and f["kind"] not in (unscored - set(ACCEPT.get(inj, {})))
    ]
    if false:
        row["why"].append("false medium/high: " + ", ".join(fnd(f) for f in false))
    if inj in ACCEPT:
        tgt, how = target_ms(case, run_dir, runs)
        row["target"] = how
        hits = [f for f in fs if matches(f, inj)]
        if not hits:
            row["why"].append("missed: no " + "/".join(ACCEPT[inj]) + " finding")
        else:
            best = max(
                hits, key=lambda f: (SEV[f["severity"]], -abs(f["cost_ms_per_step"] - (tgt or 0)))
            )
            row["matched"] = fnd(best)
            # Another accepted finding of the same problem with a cost far off is not failed
            # (one right finding suffices) but is shown: the two together overstate the cost.
            row["notes"] = [
                f"also {fnd(f)}: cost {(f['cost_ms_per_step'] - tgt) / tgt:+.0%}"
                for f in hits
                if f is not best
                and tgt
                and tgt > 0
                and abs(f["cost_ms_per_step"] - tgt) > TOLERANCE * tgt
            ]
            if SEV[best["severity"]] < 2 and inj not in ONE_OFF:
                row["why"].append(f"found only at {best['severity']}: {_why_capped(best)}")
            cost = best["cost_ms_per_step"]
            if inj in ONE_OFF:  # reported once: its whole wait, not a per-step cost
                cost = float((best.get("evidence") or {}).get("startup_ms") or 0.0)
            if tgt is None or tgt <= 0:
                row["why"].append(f"cost not scored: target {how}")
            else:
                err = (cost - tgt) / tgt
                row["cost_err"] = err
                gain = measured_gain_ms(case, run_dir, runs)
                if gain is not None:
                    row["measured_gain"] = gain
                if abs(err) > TOLERANCE and not _near(cost, gain):
                    also = f"; the script-timed gain {gain:.1f} ms" if gain is not None else ""
                    row["why"].append(f"cost {cost:.1f} vs target {tgt:.1f} ms ({err:+.0%}){also}")
                elif abs(err) > TOLERANCE:
                    row["notes"].append(
                        f"cost {cost:.1f} ms is {err:+.0%} off the injected {tgt:.0f} ms but "
                        f"within {TOLERANCE:.0%} of the script-timed gain, {gain:.1f} ms"
                    )
            ref = f"{fw}:none"
            refjs = results.get(ref, {}).get("json")
            if refjs is None:
                row["why"].append("inversion not scored (no healthy run)")
            else:
                top = max([SEV[f["severity"]] for f in refjs.get("findings", [])], default=0)
                if SEV[best["severity"]] < top and inj not in ONE_OFF:
                    row["why"].append(
                        f"inversion: healthy run has severity {top} > {best['severity']}"
                    )
    if not row["why"]:
        row["verdict"] = "PASS"
    elif all(w.startswith(("cost not scored", "inversion not scored")) for w in row["why"]):
        row["verdict"] = "PASS*"
    return row


# ---------------------------------------------------------------- driver
def needed_refs(cases):
    refs = set()
    for c in cases:
        fw, inj = c.split(":")
        if inj in ACCEPT:
            refs.add(f"{fw}:none")
        if inj == "grad_accum_no_sync":
            refs.add(f"{fw}:grad_accum")
    return [r for r in ALL_CASES if r in refs and r not in cases]


def run_rep(cases, rep_dir: Path, hogs: int, timeout_s: float, rescore: bool):
    refs = needed_refs(cases)
    order = [c for c in ALL_CASES if c in refs] + [
        c for c in ALL_CASES if c in cases and c not in refs
    ]
    runs, results = {}, {}
    for c in order:
        run_dir = rep_dir / c.replace(":", "__")
        runs[c] = run_dir
        if not rescore:
            log(f"[{time.strftime('%H:%M:%S')}] recording {c} (hogs={hogs}, load {loadavg():.1f})")
            meta = record(c, run_dir, hogs, timeout_s)
            log(f"    trace rc={meta['rc']} in {meta['wall_s']} s")
            results[c] = analyze(run_dir)
        else:
            # the recorded runs analysed again by the gpudiag installed now
            results[c] = (
                analyze(run_dir)
                if run_dir.is_dir()
                else {"rc": None, "stderr": "not recorded", "json": None}
            )
    rows = []
    for c in order:
        r = score(c, runs[c], runs, results)
        r["reference_only"] = c in refs
        rows.append(r)
    return rows


def print_table(all_rows):
    print(f"{'case':40} {'rep':>3} {'host':5} {'load':>4} {'verdict':7}  findings / why")
    for rep, rows in all_rows:
        for r in rows:
            if r["reference_only"]:
                print(
                    f"{r['case']:40} {rep:>3} {r['host']:5} {r['load'] or 0:4.1f} {'(ref)':7}  "
                    f"reference for scoring only ({r['split']}): findings hidden"
                )
                continue
            print(
                f"{r['case']:40} {rep:>3} {r['host']:5} {r['load'] or 0:4.1f} {r['verdict']:7}  "
                f"{'; '.join(r['findings']) or '(no findings)'}"
            )
            if r.get("target"):
                print(f"{'':60}target: {r['target']}; matched: {r.get('matched', '-')}")
            for w in r["why"]:
                print(f"{'':60}- {w}")
            for n in r.get("notes", []):
                print(f"{'':60}  note: {n}")
    print()
    for split in ("tuned", "held_out"):
        rs = [
            r
            for _, rows in all_rows
            for r in rows
            if r["split"] == split and not r["reference_only"]
        ]
        if not rs:
            continue
        ok = sum(r["verdict"].startswith("PASS") for r in rs)
        false = sum(any(w.startswith("false") for w in r["why"]) for r in rs)
        missed = sum(any(w.startswith(("missed", "found only")) for w in r["why"]) for r in rs)
        cost = sum(any(w.startswith("cost ") for w in r["why"]) for r in rs)
        inv = sum(any(w.startswith("inversion:") for w in r["why"]) for r in rs)
        print(
            f"split {split:8}: {ok}/{len(rs)} pass | false med/high in {false} | missed or low "
            f"{missed} | cost off >20% {cost} | inversions {inv}"
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="/tmp/gpudiag_frameworks")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--hogs", type=int, default=0, help="CPU-spinning processes beside each run")
    ap.add_argument("--cases", default=None, help="comma-separated framework:inject names")
    ap.add_argument("--split", choices=["tuned", "held_out", "all"], default="all")
    ap.add_argument("--timeout", type=float, default=600, help="per recording, seconds")
    ap.add_argument("--rescore", default=None, help="score an --out folder again, no recording")
    ap.add_argument("--json", default=None, help="write the scored rows here")
    a = ap.parse_args(argv)
    if held_out_cases() != HELD_OUT:
        sys.exit(
            "HELD_OUT no longer matches the hash rule: the case list changed; do not "
            "re-split silently, write the new split down with the date"
        )
    cases = ALL_CASES
    if a.cases:
        cases = [c.strip() for c in a.cases.split(",")]
        bad = [c for c in cases if c not in ALL_CASES]
        if bad:
            sys.exit(f"unknown cases {bad}; known: {ALL_CASES}")
    if a.split != "all":
        cases = [c for c in cases if case_split(c) == a.split]
    out = Path(a.rescore or a.out)
    all_rows = []
    if a.rescore:
        for rep_dir in sorted(out.glob("rep*")):
            all_rows.append((rep_dir.name[3:], run_rep(cases, rep_dir, 0, a.timeout, True)))
    else:
        for rep in range(1, a.repeat + 1):
            all_rows.append((str(rep), run_rep(cases, out / f"rep{rep}", a.hogs, a.timeout, False)))
    print_table(all_rows)
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                [{"rep": rep, **r} for rep, rows in all_rows for r in rows], indent=1, default=str
            )
        )


if __name__ == "__main__":
    main()
