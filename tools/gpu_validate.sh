#!/usr/bin/env bash
# GPU validation of `gpudiag trace` on a one-GPU machine (torch+CUDA and nvidia-ml-py
# installed, no network needed). Under 8 minutes. Records four small runs and checks
# NVML samples, CUDA kernels and NCCL records, then prints a verdict:
#   single_gpu               one process on cuda:0
#   ddp_nccl_ws1             DDP, world size 1, NCCL
#   gloo_cuda_2rank          DDP, 2 ranks, gloo on CUDA tensors (both on GPU 0)
#   dp_two_replicas_one_gpu  nn.DataParallel(device_ids=[0, 0]), if torch accepts it
# The run directories (each <= 2 MB) are left in $1 (default tests/fixtures/gpu_runs, where
# tests/test_gpu_recordings.py reads them) so they can be committed as test fixtures.
#
# usage: tools/gpu_validate.sh [OUT_DIR]
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${1:-$REPO/tests/fixtures/gpu_runs}
PY=${PYTHON:-python3}
TRAIN="$REPO/tools/gpu_train.py"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# use this checkout even where `pip install -e .` was not run
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" - <<'PYEOF'
import importlib, sys
missing = [m for m in ("torch", "pynvml", "pandas", "orjson", "psutil") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_validate: missing Python packages: {', '.join(missing)}")
import torch
if not torch.cuda.is_available():
    sys.exit(f"gpu_validate: torch {torch.__version__} sees no CUDA device")
print(f"gpu_validate: torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}")
PYEOF
then
    exit 2
fi

trace() {  # trace NAME [gpudiag trace args...]
    local name=$1
    shift
    rm -rf "${OUT:?}/$name"
    echo "gpu_validate: recording $name"
    timeout 150 "$PY" -m gpudiag trace --out "$OUT/$name" --profile-steps 2-4 \
        --sample-hz 20 --hang-timeout 60 --no-lint "$@" >"$OUT/$name.log" 2>&1
    echo "gpu_validate: $name exit code $?"
}

start=$SECONDS
trace single_gpu "$TRAIN" --mode single
trace ddp_nccl_ws1 --nproc-per-node 1 --standalone "$TRAIN" --mode ddp --backend nccl
trace gloo_cuda_2rank --nproc-per-node 2 --standalone "$TRAIN" --mode ddp --backend gloo
trace dp_two_replicas_one_gpu "$TRAIN" --mode dp
echo "gpu_validate: recorded in $((SECONDS - start)) s"

"$PY" "$REPO/tools/gpu_validate_check.py" "$OUT"
