#!/usr/bin/env bash
# One lent H200 call: the GPU tests and benchmarks, by case (docs/gpu.md cites their results).
# Run from the repository root through the device tool, with carry [".whl"] (numpy 2.3.5:
# the image's numpy 2.5 breaks numba-cuda) and, for `curves`, ".carry" (the data, xz):
#     bash bench/h200_session.sh check      # gpu tests, per-method times (~9 min)
#     bash bench/h200_session.sh attention  # attention alone: tensor cores, exact fp32, torch SDPA
#     bash bench/h200_session.sh exact      # the exact kernels' lab (attention_lab_gpu.py), 5 min
#     bash bench/h200_session.sh parts      # the tc backward's parts (prep, dkv) alone, 1 min
#     bash bench/h200_session.sh prep       # prep_variants.py (the prep's schedules), then parts
#     bash bench/h200_session.sh overlap    # gpu tests, then the step with each knob (~9 min)
#     bash bench/h200_session.sh labs       # gemm_lab_gpu.py and cublaslt_lab_gpu.py, 2 min
#     bash bench/h200_session.sh curves     # TF32 and exact-attention runs side by side, 9 min
#     bash bench/h200_session.sh final      # euler bench with torch.compile, then the gpu tests
#     bash bench/h200_session.sh defaults   # gpu tests, then euler bench --no-peer (~5 min)
#     bash bench/h200_session.sh bf16       # the bf16 gpu tests, then euler bench in bf16 (~8 min)
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
    log "gpu tests"
    timeout 330 python3 -m pytest -q -m gpu tests/test_gpu_device.py 2>&1 \
        | grep -E "Error|passed|failed" | tee -a "$OUT/log.txt"
    log "bench_gpu (per-method times, launched and device only)"
    timeout 200 python3 bench/bench_gpu.py --out "$OUT/gpu.json" 2>&1 | tail -40 \
        | tee -a "$OUT/log.txt"
    ;;
exact)
    log "exact attention lab: TileOptions variants, launch-free, T=512 and 2048"
    timeout 400 python3 bench/labs/attention_lab_gpu.py --out "$OUT/attention-lab.json" 2>&1 \
        | grep -v Warning | tail -12 | tee -a "$OUT/log.txt"
    if [ -f scratch/time_old.py ]; then  # an uncommitted A/B against older kernels
        log "older kernels (scratch)"
        timeout 150 python3 scratch/time_old.py 2>&1 | grep -v Warning | tail -4 \
            | tee -a "$OUT/log.txt"
    fi
    ;;
prep)
    log "prep variants (prep_variants.py), T=512 and 2048"
    timeout 200 python3 bench/labs/prep_variants.py --out "$OUT/prep.json" 2>&1 \
        | grep '"variant"' | tee -a "$OUT/log.txt"
    ;&
parts)
    log "tc backward parts (attention_backward_parts.py), T=512 and 2048"
    timeout 200 python3 bench/labs/attention_backward_parts.py --out "$OUT/parts.json" 2>&1 \
        | grep '"part"' | tee -a "$OUT/log.txt"
    ;;
attention)
    log "attention table: tc, exact, torch SDPA, naive at T=512 and 2048"
    timeout 500 python3 bench/attention_tc_gpu.py --out "$OUT/attention-tc.json" 2>&1 \
        | grep -v Warning | tail -40 | tee -a "$OUT/log.txt"
    ;;
curves)
    # TF32 attention and exact attention, the same steps, side by side on the one GPU (each
    # gets about half of it): 9 minutes, then Ctrl-C (each saves a checkpoint and stops).
    # The data travels compressed: .carry/gpu-data.tar.xz (tar -C runs -cJf ... gpu-data).
    mkdir -p runs && tar -C runs -xJf .carry/gpu-data.tar.xz
    common=(--device cuda --preset gpu --data runs/gpu-data --batch-size 32 --steps 4000
        --lr 1e-3 --min-lr 1e-4 --warmup 100 --eval-every 250 --eval-batches 20
        --ckpt-every 100000 --log-every 50)
    log "curves: tf32 and exact attention, side by side, 9 minutes"
    for run in tf32 exact; do
        flag=$([ $run = exact ] && echo --exact-attention || echo --no-exact-attention)
        timeout -s INT 535 python3 -m euler.cli train "${common[@]}" $flag --out /tmp/runs/$run \
            >"$OUT/train-$run.txt" 2>&1 &
    done
    wait
    for run in tf32 exact; do
        cp /tmp/runs/$run/metrics.jsonl "$OUT/metrics-$run.jsonl"
        tail -5 "$OUT/train-$run.txt" | tee -a "$OUT/log.txt"
    done
    ;;
overlap)
    log "gpu tests (the side stream, CublasLt, fused-residual steps against the CPU)"
    timeout 330 python3 -m pytest -q -m gpu tests/test_gpu_device.py 2>&1 \
        | grep -E "Error|passed|failed" | tee -a "$OUT/log.txt"
    log "trainer steps: side stream, in line, transposed weight gradients, fused residual"
    timeout 200 python3 bench/bench_gpu.py --steps-only --steps 20 --out "$OUT/steps.json" 2>&1 \
        | grep -v Warning | tail -12 | tee -a "$OUT/log.txt"
    ;;
labs)
    log "gemm lab and cuBLASLt lab"
    timeout 60 python3 bench/labs/gemm_lab_gpu.py --out "$OUT/gemm-lab.json" 2>&1 \
        | grep one_sided | tee -a "$OUT/log.txt"
    timeout 100 python3 bench/labs/cublaslt_lab_gpu.py --out "$OUT/cublaslt-lab.json" 2>&1 \
        | grep -v Warning | tail -30 | tee -a "$OUT/log.txt"
    ;;
final)
    log "euler bench (ours, ours_cuda_graph, torch eager and compiled)"
    timeout 280 python3 -m euler.cli bench --device cuda --preset gpu --steps 10 \
        --json "$OUT/bench.json" 2>&1 | tail -45 | tee -a "$OUT/log.txt"
    log "gpu tests"
    timeout 200 python3 -m pytest -q -m gpu tests/test_gpu_device.py 2>&1 \
        | grep -E "Error|passed|failed" | tee -a "$OUT/log.txt"
    ;;
defaults)
    # the whole gpu suite, then the step (ours only)
    log "gpu tests"
    timeout 330 python3 -m pytest -q -m gpu tests/test_gpu_device.py 2>&1 \
        | grep -E "Error|passed|failed" | tee -a "$OUT/log.txt"
    log "euler bench (ours only)"
    timeout 150 python3 -m euler.cli bench --device cuda --preset gpu --steps 10 --no-peer \
        --json "$OUT/bench.json" 2>&1 | tail -20 | tee -a "$OUT/log.txt"
    ;;
bf16)
    log "bf16 gpu tests: each layer against the CPU emulation, 20 steps, attention vs float64"
    timeout 260 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_bf16.py \
        tests/test_gpu_tc.py 2>&1 | grep -E "Error|passed|failed" | tee -a "$OUT/log.txt"
    log "euler bench --precision bf16 (ours, ours_cuda_graph, torch autocast eager, compiled)"
    timeout 300 python3 -m euler.cli bench --device cuda --preset gpu --precision bf16 \
        --steps 10 --json "$OUT/bench-bf16.json" 2>&1 | tail -60 | tee -a "$OUT/log.txt"
    ;;
*)
    echo "usage: $0 check|exact|prep|parts|attention|overlap|labs|curves|final|defaults|bf16" >&2
    exit 2
    ;;
esac
log done
