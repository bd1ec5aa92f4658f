#!/usr/bin/env bash
# Everything issue 32 asks of one short GPU lease, as one command (about 5 minutes on an
# H200). Records, under $WORK/runs (default /tmp/gpu_session):
#   the four runs of tools/gpu_validate.sh (and its verdict),
#   single_gpu_bf16 / single_gpu_fp16   the single_gpu job with autocast (AMP detection),
#   big_fp32 / big_bf16                 a compute-bound job (width 8192, batch 1024): the
#                                       `amp` what-if of big_fp32 against big_bf16 measured,
#   hf_trainer_gpu / lightning_gpu      unmodified framework scripts on cuda:0 (world size 1),
# and the capture overhead: the same job bare and traced, alternated, 3 times each, small
# (launch-bound) and big (compute-bound), from the job's own TRAIN_MS_PER_STEP line.
# Phase 4 (not run by default) times the per-step capture cost alone: bare against traced
# with --no-profile, alternated, 3 times each.
# Packs it all into $OUT/gpu_session.tar.gz after each phase, so a timeout keeps what ran.
#
# usage: OUT=DIR [PHASES="1 2 3"] tools/gpu_session.sh   (on the device machine: `run` sets OUT)
set -u

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:?set OUT}
WORK=${WORK:-/tmp/gpu_session}
PHASES=" ${PHASES:-1 2 3} "
PY=${PYTHON:-python3}
TRAIN="$REPO/tools/gpu_train.py"
FW="$REPO/tests/frameworks"
export PYTHONUNBUFFERED=1 PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$WORK" && mkdir -p "$WORK/runs" "$WORK/overhead"
start=$SECONDS

pack() {
    tar -czf "$OUT/gpu_session.tar.gz" -C "$WORK" runs overhead 2>/dev/null
    echo "gpu_session: packed at $((SECONDS - start)) s"
}

trace() {  # trace NAME TIMEOUT [gpudiag trace args...]
    local name=$1 limit=$2
    shift 2
    echo "gpu_session: recording $name"
    timeout "$limit" "$PY" -m gpudiag trace --out "$WORK/runs/$name" --sample-hz 20 \
        --hang-timeout 60 --no-lint "$@" >"$WORK/runs/$name.log" 2>&1
    echo "gpu_session: $name exit code $? at $((SECONDS - start)) s"
    grep -h "TRAIN_MS_PER_STEP\|Error\|error" "$WORK/runs/$name.log" | tail -3
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit \
        --format=csv
    "$PY" -c "import torch, pynvml, sys; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
    "$PY" -m pip list 2>/dev/null | grep -i -E "^(transformers|lightning|pytorch-lightning|accelerate|nvidia-ml-py|pandas|pyarrow) "
} >"$WORK/runs/machine.txt" 2>&1
cat "$WORK/runs/machine.txt"

phase() { [[ "$PHASES" == *" $1 "* ]]; }

if phase 1; then
echo "== phase 1: tools/gpu_validate.sh"
timeout 200 bash "$REPO/tools/gpu_validate.sh" "$WORK/runs" 2>&1 | tee "$WORK/runs/validate.txt"
pack
fi

if phase 2; then
echo "== phase 2: AMP, compute-bound, frameworks"
trace single_gpu_bf16 60 --profile-steps 2-4 "$TRAIN" --mode single --amp bf16
trace single_gpu_fp16 60 --profile-steps 2-4 "$TRAIN" --mode single --amp fp16
BIG=(--mode single --synthetic --width 8192 --batch 1024 --steps 30)
trace big_fp32 90 "$TRAIN" "${BIG[@]}"
trace big_bf16 90 "$TRAIN" "${BIG[@]}" --amp bf16
trace hf_trainer_gpu 120 --nproc-per-node 1 --standalone "$FW/hf_trainer.py" --gpu --steps 30
trace lightning_gpu 120 --nproc-per-node 1 --standalone "$FW/lightning_ddp.py" --gpu --steps 30
pack
fi

SMALL=(--mode single --synthetic --width 512 --batch 64 --steps 300 --warmup 20)
BIGO=(--mode single --synthetic --width 8192 --batch 1024 --steps 60 --warmup 10)
if phase 3; then
echo "== phase 3: capture overhead (bare vs traced, alternated)"
for rep in 1 2 3; do
    for size in small big; do
        if [ "$size" = small ]; then args=("${SMALL[@]}"); else args=("${BIGO[@]}"); fi
        bare=$(timeout 60 "$PY" "$TRAIN" "${args[@]}" 2>&1 | grep TRAIN_MS_PER_STEP)
        echo "$size bare $rep $bare" | tee -a "$WORK/overhead/overhead.txt"
        timeout 90 "$PY" -m gpudiag trace --out "$WORK/overhead/${size}_$rep" --no-lint \
            --sample-hz 20 "$TRAIN" "${args[@]}" >"$WORK/overhead/${size}_$rep.log" 2>&1
        traced=$(grep TRAIN_MS_PER_STEP "$WORK/overhead/${size}_$rep.log")
        echo "$size traced $rep $traced" | tee -a "$WORK/overhead/overhead.txt"
        [ "$rep" = 1 ] || rm -rf "$WORK/overhead/${size}_$rep"
    done
    pack
done
fi

if phase 4; then
echo "== phase 4: per-step capture cost (bare vs traced --no-profile, alternated)"
for rep in 1 2 3; do
    bare=$(timeout 60 "$PY" "$TRAIN" "${SMALL[@]}" 2>&1 | grep TRAIN_MS_PER_STEP)
    echo "small bare $rep $bare" | tee -a "$WORK/overhead/no_profile.txt"
    timeout 90 "$PY" -m gpudiag trace --out "$WORK/overhead/np_$rep" --no-lint --no-profile \
        --sample-hz 20 "$TRAIN" "${SMALL[@]}" >"$WORK/overhead/np_$rep.log" 2>&1
    traced=$(grep TRAIN_MS_PER_STEP "$WORK/overhead/np_$rep.log")
    echo "small traced-no-profile $rep $traced" | tee -a "$WORK/overhead/no_profile.txt"
    rm -rf "$WORK/overhead/np_$rep"
done
pack
fi
echo "gpu_session: done in $((SECONDS - start)) s"
pack
