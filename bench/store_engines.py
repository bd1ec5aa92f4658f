"""Benchmark: which engine keeps the per-call tables (issue 33 item 1).

The question's queries over the collective table, asked of each candidate engine, on the
real per-call tables of three recorded sets (../shared/traces: ddp4_straggler from
sample_runs, astrasim_megatron_tp8, param_dlrm_ddp8) and on a SYNTHETIC 16,384-rank table
made of astrasim_megatron_tp8's rows (rank r is a copy of recorded rank r % 8, as
bench/scale.py's replay builds it: 1.38 M calls):

* summary: per (op, group): calls per rank, median bytes, total ms per rank (the sum),
  median bus bandwidth, the link's peak, distinct ranks (comms.collective_summary);
* skew: each call matched across ranks on (group, seq or index) (window functions), per
  rank: matched calls, mean skew, times last, summed wait (stragglers.arrival_skew).

Each (engine, table) runs in its own subprocess, --reps times: time of the queries from
the Parquet file (the engine's own reader; `today` builds gpudiag's on-disk tables first,
untimed) and peak RSS (VmHWM) above the RSS after imports. Every result is compared
bit for bit with today's code on the whole table in memory (comms.collective_summary,
stragglers.arrival_skew with exact.compensated_means; the checkout on PYTHONPATH, e.g.
one of the commit before the store): `same` counts the numbers that are the same float. --big-group N adds one all-reduce group of N calls (a world
all-reduce at scale) whose exact median is the engines' one holistic aggregate.

    python bench/store_engines.py [--reps 5] [--engines today,duckdb,polars,pyarrow]
        [--big-group 0] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
SETS = {
    "ddp4_straggler": REPO / "sample_runs" / "ddp4_straggler" / "traces",
    "astrasim_megatron_tp8": SHARED / "astrasim_megatron_tp8",
    "param_dlrm_ddp8": SHARED / "param_dlrm_ddp8",
}
SYNTHETIC_RANKS = 16_384
# the gpudiag whose code is `today` and the reference: the one imported (PYTHONPATH)
TODAY = Path(__import__("gpudiag").__file__).resolve().parents[1]
READS = ["rank", "pg_name", "seq", "index", "op", "bytes", "start_ns", "dur_ms"]
READS += ["busbw_gbs", "peak_gbs", "step"]

SUMMARY_SQL = """
SELECT coalesce(op, 'unknown') AS op, pg_name,
       count(*) / count(DISTINCT rank) AS count,
       median(bytes) AS bytes,
       fsum(dur_ms) / count(DISTINCT rank) AS total_ms,
       median(busbw_gbs) AS busbw_gbs_median,
       max(peak_gbs) AS peak_gbs,
       count(DISTINCT rank) AS ranks
FROM {src} GROUP BY ALL ORDER BY op, pg_name
"""
# key: the seq where the whole group has one, else the call's index (matching.match_key)
SKEW_SQL = """
WITH keyed AS (
  SELECT rank, pg_name, start_ns,
         CASE WHEN count(seq) OVER (PARTITION BY pg_name) = count(*) OVER (PARTITION BY pg_name)
              THEN seq ELSE index END AS key
  FROM {src}),
arrivals AS (
  SELECT rank, start_ns,
         min(start_ns) OVER w AS first, max(start_ns) OVER w AS last,
         count(*) OVER w AS n,
         row_number() OVER (PARTITION BY pg_name, key ORDER BY start_ns DESC, rank DESC) AS back
  FROM keyed WINDOW w AS (PARTITION BY pg_name, key))
SELECT rank, count(*) AS calls,
       fsum((start_ns - first) / 1e6) / count(*) AS mean_skew_ms,
       count(*) FILTER (WHERE back = 1) AS last_count,
       fsum((last - start_ns) / 1e6) AS wait_ms
FROM arrivals WHERE n >= 2 GROUP BY rank ORDER BY rank
"""

CHILD = r"""
import json, sys, time
engine, path, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
def rss_mib():  # VmHWM: ru_maxrss would keep the parent's peak from before the fork
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
if engine == "duckdb":
    import duckdb
    def work():
        con = duckdb.connect()
        con.execute("SET memory_limit = '1GB'")
        con.execute("SET enable_progress_bar = false")
        src = f"read_parquet('{path}')"
        s = con.execute(SUMMARY_SQL.format(src=src)).df()
        k = con.execute(SKEW_SQL.format(src=src)).df()
        con.close()
        return s, k
elif engine == "polars":
    import polars as pl
    def work():
        t = pl.scan_parquet(path)
        n_ranks = pl.col("rank").n_unique()
        s = (t.with_columns(pl.col("op").fill_null("unknown"))
             .group_by("op", "pg_name")
             .agg((pl.len() / n_ranks).alias("count"), pl.col("bytes").median(),
                  (pl.col("dur_ms").sum() / n_ranks).alias("total_ms"),
                  pl.col("busbw_gbs").median().alias("busbw_gbs_median"),
                  pl.col("peak_gbs").max(), n_ranks.alias("ranks"))
             .sort("op", "pg_name").collect().to_pandas())
        has_seq = pl.col("seq").count().over("pg_name") == pl.len().over("pg_name")
        keyed = t.with_columns(pl.when(has_seq).then(pl.col("seq"))
                               .otherwise(pl.col("index").cast(pl.Float64)).alias("key"))
        w = ["pg_name", "key"]
        last_rank = (pl.struct("start_ns", "rank").sort_by(["start_ns", "rank"]).last()
                     .over(w).struct.field("rank"))
        a = keyed.with_columns(
            (pl.col("start_ns") - pl.col("start_ns").min().over(w)).alias("skew"),
            (pl.col("start_ns").max().over(w) - pl.col("start_ns")).alias("wait"),
            pl.len().over(w).alias("n"), (last_rank == pl.col("rank")).alias("is_last"))
        k = (a.filter(pl.col("n") >= 2).group_by("rank")
             .agg(pl.len().alias("calls"), (pl.col("skew") / 1e6).mean().alias("mean_skew_ms"),
                  pl.col("is_last").sum().alias("last_count"),
                  (pl.col("wait") / 1e6).sum().alias("wait_ms"))
             .sort("rank").collect().to_pandas())
        return s, k
elif engine == "pyarrow":
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    def work():
        t = ds.dataset(path).to_table(columns=READS)
        t = t.set_column(t.schema.get_field_index("op"), "op", pc.fill_null(t["op"], "unknown"))
        g = t.group_by(["op", "pg_name"]).aggregate(
            [([], "count_all"), ("rank", "count_distinct"), ("bytes", "approximate_median"),
             ("dur_ms", "sum"), ("busbw_gbs", "approximate_median"), ("peak_gbs", "max")])
        s = g.to_pandas().sort_values(["op", "pg_name"], ignore_index=True)
        s = s.rename(columns={"bytes_approximate_median": "bytes", "peak_gbs_max": "peak_gbs",
                              "busbw_gbs_approximate_median": "busbw_gbs_median",
                              "rank_count_distinct": "ranks"})
        s["count"] = s["count_all"] / s["ranks"]
        s["total_ms"] = s["dur_ms_sum"] / s["ranks"]
        return s, None  # no window functions: the skew is not expressible
else:  # today: gpudiag's spill file and out-of-core matching, built untimed
    import numpy as np, pandas as pd, pyarrow.parquet as pq
    from gpudiag.analysis import comms, stragglers
    from gpudiag.analysis.exact import compensated_means
    from gpudiag.analysis.spill import SpilledTable, SpillFile
    spill = SpillFile()
    pieces = (b.to_pandas() for b in pq.ParquetFile(path).iter_batches(1 << 16))
    table = SpilledTable.build(pieces, spill)
    def work():
        try:  # a checkout before the call store (store.py)
            s = comms.collective_summary(table, spill)
        except TypeError:  # with it: a store of the table, made in the query's time
            s = comms.collective_summary(table)
        skew = pd.concat(stragglers.arrival_skew_pieces(table, spill), ignore_index=True)
        codes, ranks = pd.factorize(skew["rank"], sort=True)
        k = pd.DataFrame({"rank": ranks, "calls": np.bincount(codes),
                          "mean_skew_ms": compensated_means(codes, skew["skew_ms"].to_numpy(float), len(ranks)),
                          "last_count": np.bincount(codes, weights=skew["is_last"].to_numpy(float)),
                          "wait_ms": compensated_means(codes, skew["wait_ms"].to_numpy(float), len(ranks)) * np.bincount(codes)})
        return s.sort_values(["op", "pg_name"], ignore_index=True), k
base = rss_mib()
times = []
for _ in range(reps):
    t0 = time.perf_counter()
    s, k = work()
    times.append(time.perf_counter() - t0)
out = {"times": times, "base_mib": base, "peak_mib": rss_mib(),
       "summary": s.to_dict("list"), "skew": None if k is None else k.to_dict("list")}
print("RESULT " + json.dumps(out, default=float))
"""


def collective_table(trace_dir: Path) -> pd.DataFrame:
    """The set's collective table as `gpudiag analyze` makes it from the traces."""
    from gpudiag.analysis import comms
    from gpudiag.analysis.ingest import find_traces, load_traces

    traces = load_traces(find_traces(trace_dir), warnings=[], workers=1)
    return comms.collective_table(traces)


def replicated(table: pd.DataFrame, ranks: int) -> pd.DataFrame:
    """SYNTHETIC: rank r holds the rows of recorded rank r % K (K ranks in ``table``)."""
    sources = sorted(table["rank"].unique())
    parts = []
    for r in range(ranks):
        part = table[table["rank"] == sources[r % len(sources)]]
        parts.append(part.assign(rank=r))
    return pd.concat(parts, ignore_index=True)


def one_group(calls: int, seed: int = 0) -> pd.DataFrame:
    """SYNTHETIC: one all-reduce group of ``calls`` calls over 16,384 ranks."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, 10**9, calls)
    dur = rng.integers(1_000, 5_000_000, calls)
    return pd.DataFrame(
        {
            "rank": np.arange(calls) % SYNTHETIC_RANKS,
            "pg_name": "0",
            "seq": (np.arange(calls) // SYNTHETIC_RANKS).astype(float),
            "index": np.arange(calls) // SYNTHETIC_RANKS,
            "op": "all_reduce",
            "bytes": rng.choice([2.0**20, 2.0**22, 2.0**25], calls),
            "start_ns": start,
            "dur_ms": dur / 1e6,
            "busbw_gbs": rng.lognormal(3, 1, calls),
            "peak_gbs": 300.0,
        }
    )


def reference(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Today's numbers: the whole table in memory through gpudiag's own functions."""
    from gpudiag.analysis import comms, stragglers
    from gpudiag.analysis.exact import compensated_means

    s = comms.collective_summary(table).sort_values(["op", "pg_name"], ignore_index=True)
    skew = stragglers.arrival_skew(table)
    codes, ranks = pd.factorize(skew["rank"], sort=True)
    n = np.bincount(codes)
    k = pd.DataFrame(
        {
            "rank": ranks,
            "calls": n,
            "mean_skew_ms": compensated_means(codes, skew["skew_ms"].to_numpy(float), len(n)),
            "last_count": np.bincount(codes, weights=skew["is_last"].to_numpy(float)),
            "wait_ms": compensated_means(codes, skew["wait_ms"].to_numpy(float), len(n)) * n,
        }
    )
    return s, k


def differences(got: dict | None, want: pd.DataFrame) -> tuple[int, int, float]:
    """(numbers compared, numbers not the same float, largest relative difference)."""
    if got is None:
        return 0, -1, math.nan
    seen = differ = 0
    worst = 0.0
    for column in want.columns:
        if column not in got or column in ("op", "pg_name"):
            continue
        a = np.asarray(want[column], dtype=float)
        b = np.asarray([math.nan if v is None else v for v in got[column]], dtype=float)
        if len(a) != len(b):
            return len(a), len(a), math.inf
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        seen += len(a)
        differ += int((~same).sum())
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.abs(a - b) / np.maximum(np.abs(a), 1e-300)
        worst = max(worst, float(np.nanmax(np.where(same, 0.0, rel), initial=0.0)))
    return seen, differ, worst


def run_child(engine: str, path: Path, reps: int) -> dict:
    code = f"SUMMARY_SQL = {SUMMARY_SQL!r}\nSKEW_SQL = {SKEW_SQL!r}\nREADS = {READS!r}\n" + CHILD
    done = subprocess.run(
        [sys.executable, "-c", code, engine, str(path), str(reps)],
        capture_output=True,
        text=True,
        timeout=3600,
        env={"PYTHONPATH": str(TODAY), "PATH": "/usr/bin:/bin"},
        cwd=TODAY,  # `python -c` puts the working directory first on sys.path
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()
        return {"error": tail[-1] if tail else f"exit {done.returncode}"}
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line.removeprefix("RESULT "))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="runs per (engine, table), one process")
    ap.add_argument("--processes", type=int, default=1, help="fresh processes per pair")
    ap.add_argument("--engines", default="today,duckdb,polars,pyarrow")
    ap.add_argument("--big-group", type=int, default=0, help="calls of one synthetic group")
    ap.add_argument("--keep", type=Path, help="write the Parquet tables here")
    ap.add_argument("--sets", default=",".join([*SETS, "synthetic16384"]))
    args = ap.parse_args(argv)
    out = args.keep or Path(tempfile.mkdtemp(prefix="store_engines_"))
    out.mkdir(parents=True, exist_ok=True)
    wanted = args.sets.split(",")
    tables: dict[str, pd.DataFrame] = {}
    for name, path in SETS.items():
        if name in wanted or (name == "astrasim_megatron_tp8" and "synthetic16384" in wanted):
            tables[name] = collective_table(path)[READS]
    if "synthetic16384" in wanted:
        tables["synthetic16384"] = replicated(tables["astrasim_megatron_tp8"], SYNTHETIC_RANKS)
    if args.big_group:
        tables[f"one_group{args.big_group}"] = one_group(args.big_group)
    tables = {k: v for k, v in tables.items() if k in wanted or k.startswith("one_group")}
    print(
        "engine   table                    calls  time s median [min-max]   "
        "peak RSS MiB (above imports)   summary same/numbers  skew same/numbers"
    )
    for name, table in tables.items():
        path = out / f"{name}.parquet"
        table.to_parquet(path, row_group_size=1 << 16, index=False)
        want_s, want_k = reference(table)
        for engine in args.engines.split(","):
            runs = [run_child(engine, path, args.reps) for _ in range(args.processes)]
            bad = [r for r in runs if "error" in r]
            if bad:
                print(f"{engine:<8} {name:<22} error: {bad[0]['error']}")
                continue
            times = [t for r in runs for t in r["times"]]
            above = [r["peak_mib"] - r["base_mib"] for r in runs]
            ns, ds, ws = differences(runs[0]["summary"], want_s)
            nk, dk, wk = differences(runs[0]["skew"], want_k)
            skew = "n/a (no windows)" if dk < 0 else f"{nk - dk}/{nk} (max rel {wk:.1e})"
            print(
                f"{engine:<8} {name:<22} {len(table):>9,} {statistics.median(times):8.3f} "
                f"[{min(times):.3f}-{max(times):.3f}]  "
                f"{max(r['peak_mib'] for r in runs):7.0f} ({statistics.median(above):6.0f})"
                f"   {ns - ds}/{ns} (max rel {ws:.1e})  {skew}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
