#!/usr/bin/env bash
# One lent H200 call of the plan in bench/notes_gpu.md ("Left for the next session").
# Run from the repository root through the device tool, with carry [".whl"] (numpy 2.3.5:
# the image's numpy 2.5 breaks numba-cuda) and, for `curves`, "runs/gpu-data":
#     bash bench/h200_session.sh check      # gpu tests, per-method times, euler bench (~9 min)
#     bash bench/h200_session.sh variants   # tensor-core attention variants (~8 min)
#     bash bench/h200_session.sh curves     # TF32-attention training run, 8 minutes
# Results go to $OUT (the device tool brings them back); every step appends to $OUT/log.txt,
# so a call cut short still returns what it finished.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/log.txt"; }

log setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/log.txt"

case "${1:-check}" in
check)
    log "euler bench (ours, ours_cuda_graph, torch eager)"
    timeout 240 python3 -m euler.cli bench --device cuda --preset gpu --steps 10 --no-compile \
        --json "$OUT/bench.json" 2>&1 | tail -60 | tee -a "$OUT/log.txt"
    log "gpu tests"
    timeout 230 python3 -m pytest -q -m gpu tests/test_gpu_device.py 2>&1 | tail -25 \
        | tee -a "$OUT/log.txt"
    log "bench_gpu (per-method times)"
    python3 bench/bench_gpu.py --out "$OUT/gpu.json" 2>&1 | tail -40 | tee -a "$OUT/log.txt"
    ;;
variants)
    log "matmul layer check, in full"
    timeout 60 python3 -m pytest -q -m gpu tests/test_gpu_device.py -k "layer and matmul" \
        2>&1 | grep -E "Error|passed|failed" | tee -a "$OUT/log.txt"
    for v in pipeline-atomic-dq pipeline; do
        log "tensor-core variant $v"
        timeout 270 python3 bench/attention_tc_gpu.py --variant $v --out "$OUT/attention-tc-$v.json" \
            2>&1 | tail -20 | tee -a "$OUT/log.txt"
    done
    ;;
curves)
    log "TF32-attention run (Ctrl-C at 9 minutes: a checkpoint, then --resume; --exact-attention for the other curve)"
    timeout -s INT 540 python3 -m euler.cli train --device cuda --preset gpu --data runs/gpu-data \
        --batch-size 32 --out "$OUT/tf32" --log-every 50 2>&1 | tail -30 | tee -a "$OUT/log.txt"
    ;;
*)
    echo "usage: $0 check|variants|curves" >&2
    exit 2
    ;;
esac
log done
