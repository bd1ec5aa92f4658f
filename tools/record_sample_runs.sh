#!/usr/bin/env bash
# Re-record sample_runs/ with the reference trainers, under `gpudiag trace`.
#
#   bash tools/record_sample_runs.sh            # every CPU sample run (about 2-3 minutes on 2 cores)
#   bash tools/record_sample_runs.sh ddp2_healthy bench_cpu   # only those
#
# Each run directory is replaced. Keep runs small: few steps, a 3-step profiled window.
# Afterwards update the "recorded" lines in sample_runs/README.md (date, machine, torch).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/sample_runs"
PY="${PYTHON:-python}"
cd "$REPO"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

trace() {  # trace NAME NPROC [trainer args...]
  local name="$1" nproc="$2"
  shift 2
  rm -rf "${OUT:?}/$name"
  echo "== $name" >&2
  "$PY" -m gpudiag trace --out "$OUT/$name" --profile-steps 5-7 \
    --nproc-per-node "$nproc" --master-port "$(free_port)" \
    -m gpudiag.reference --quiet "$@"
}

ddp2_healthy() {  # a healthy 2-rank DDP run
  trace ddp2_healthy 2 --mode ddp --model mlp --steps 15 --batch-size 512 --seed 0
}

ddp4_straggler() {  # 4 ranks, rank 2 sleeps 40 ms in every forward
  trace ddp4_straggler 4 --mode ddp --model mlp --steps 15 --batch-size 32 --seed 0 \
    --slow-rank 2 --slow-ms 40
}

ddp2_dataloader_bound() {  # every batch takes 30 ms to collate, no DataLoader workers
  trace ddp2_dataloader_bound 2 --mode ddp --model mlp --steps 15 --batch-size 32 --seed 0 \
    --slow-data-ms 30 --num-workers 0
}

bench_cpu() {  # single vs DDP at two per-device batch sizes (no DataParallel without CUDA)
  rm -rf "${OUT:?}/bench_cpu"
  echo "== bench_cpu" >&2
  "$PY" -m gpudiag bench --out "$OUT/bench_cpu" --model mlp --steps 15 --batch-sizes 32,128 \
    --nproc-per-node 2 --device cpu --profile-steps 5-7
}

ALL=(ddp2_healthy ddp4_straggler ddp2_dataloader_bound bench_cpu)
for what in "${@:-${ALL[@]}}"; do
  "$what"
done
du -sh "$OUT"/*/ >&2
