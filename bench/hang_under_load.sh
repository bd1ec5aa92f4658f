#!/usr/bin/env bash
# The hang tests (tests/test_hang.py, tests/test_hang_trace.py) N times in a row with two
# CPU-spinning processes beside them, as on a shared training host (docs/reliability.md).
# Usage: bash bench/hang_under_load.sh [N]   (default 10); one line per repetition.
set -u
cd "$(dirname "$0")/.."
reps=${1:-10}
python -c 'while 1: pass' & hog1=$!
python -c 'while 1: pass' & hog2=$!
trap 'kill $hog1 $hog2 2>/dev/null' EXIT
for i in $(seq 1 "$reps"); do
    log=$(mktemp)
    python -m pytest -q -m "" -p no:randomly -p no:cacheprovider \
        tests/test_hang.py tests/test_hang_trace.py >"$log" 2>&1
    echo "rep $i: $(tail -1 "$log") (load $(cut -d' ' -f1 /proc/loadavg))"
    rm -f "$log"
done
