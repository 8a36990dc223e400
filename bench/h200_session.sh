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
#     bash bench/h200_session.sh speed      # euler bench in bf16 and in tf32 (PyTorch eager and
#                                           # compiled), bf16 attention against torch SDPA's flash
#                                           # backend, each precision's device-only step profile
#     bash bench/h200_session.sh bf16curves # tf32 and bf16 trainings side by side (same seed,
#                                           # data, steps: CURVE_STEPS, 4500), pytest -m gpu beside
#     bash bench/h200_session.sh gputests   # pytest -m gpu on every file holding gpu tests
#     bash bench/h200_session.sh pipeline   # issue 33 run 3: the gpu preset (116M) pretrained
#                                           # (PIPE_SECONDS, 270), fine-tuned, evaluated, chatting;
#                                           # carry .whl (bench/device_wheels.sh) and .carry
#                                           # (the data tarball, and instructions/*.json)
#     bash bench/h200_session.sh decode     # issue 33 run 4: the GPU KV-cache tests, the decode
#                                           # attention and product labs, tokens/s at batch 1,
#                                           # 8, 32 (CUDA graphs and launched) against the
#                                           # recompute decoder; euler serve --device cuda with
#                                           # 32 clients (on runs/sft after `pipeline`, else a
#                                           # 2-step model; carry .whl with fastapi's wheels)
#     bash bench/h200_session.sh norm       # the bf16 step with RMSNorm rows held and read
#                                           # twice, in turn; cuBLASLt's algorithms for each
#                                           # bf16 product (cublaslt_bf16_algos_gpu.py)
#     bash bench/h200_session.sh serve      # decode_linear_gpu.py, then decode's euler serve
#     bash bench/h200_session.sh algos      # gpu tests, the bf16 step with the fastest
#                                           # cuBLASLt algorithms against the first, euler bench
# Results go to $OUT (the device tool brings them back); every step appends to $OUT/log.txt,
# so a call cut short still returns what it finished. `speed`, `bf16curves` and `gputests`
# end their steps by a deadline BUDGET_S (585) seconds after the script started, inside a
# call's 600.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/log.txt"; }
keep() { grep --line-buffered -v Warning | tee -a "$OUT/log.txt"; }  # a step's whole output
deadline=$((SECONDS + ${BUDGET_S:-585}))
# every file with tests marked gpu: a bare `pytest -m gpu` stops at collection on this image,
# which lacks the duckdb and rouge_score that other test files import
GPU_TESTS=(tests/test_gpu_device.py tests/test_gpu_bf16.py tests/test_gpu_tc.py
    tests/test_distributed.py)
# seconds for a step: at most $1, and no later than the deadline (at least 1: timeout 0 is none)
left() {
    local l=$((deadline - SECONDS))
    l=$((l < $1 ? l : $1))
    echo $((l < 1 ? 1 : l))
}

log setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/log.txt"

# euler serve on the fine-tuned runs/sft of `pipeline` if this machine still holds it, else
# on a 2-step model: serving speed does not depend on the weights (the gpu preset trained 2
# steps on the embedded corpus; no --data: its 4,096-token tokenizer is trained first)
serve_clients() {
    local serve=runs/sft
    if [ ! -f runs/sft/checkpoint.safetensors ]; then
        log "no runs/sft: the gpu preset, 2 steps on the embedded corpus, stands in for it"
        serve=runs/quick
        timeout "$(left 120)" python3 -m euler.cli train --device cuda --preset gpu --steps 2 \
            --batch-size 8 --eval-every 1000 --sample-tokens 0 --out runs/quick \
            >"$OUT/quick-train.txt" 2>&1
    fi
    log "euler serve --device cuda ($serve), 32 streaming clients beside one alone"
    timeout "$(left 200)" python3 bench/serve_load.py --checkpoint $serve --device cuda \
        --json "$OUT/serve-load.json" 2>&1 | keep
}

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
        --lr 1e-3 --min-lr 1e-4 --warmup-steps 100 --eval-every 250 --eval-batches 20
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
gputests)
    # two pytest processes at once (the tests wait mostly on the CPU: references, compiles)
    log "pytest -m gpu on the files holding gpu tests, test_gpu_device.py beside the others"
    timeout "$(left 580)" python3 -m pytest -q -m gpu "${GPU_TESTS[0]}" \
        >"$OUT/pytest-gpu-device.txt" 2>&1 &
    timeout "$(left 580)" python3 -m pytest -q -m gpu "${GPU_TESTS[@]:1}" \
        >"$OUT/pytest-gpu-others.txt" 2>&1
    wait
    grep -hE "passed|failed|error" "$OUT"/pytest-gpu-*.txt | tee -a "$OUT/log.txt"
    ;;
speed)
    # issue 33, run 1: each engine's step in bf16 and in tf32 with the PyTorch peer (eager and
    # compiled, each in its own process), per-layer kernels and peak memory; the attention
    # alone in bf16 against torch SDPA (flash); where a step's device time goes, per method
    for p in bf16 tf32; do
        log "euler bench --precision $p (ours, ours_cuda_graph, torch eager, torch compiled)"
        timeout "$(left 200)" python3 -m euler.cli bench --device cuda --preset gpu --precision $p \
            --steps 10 --json "$OUT/bench-$p.json" 2>&1 | keep | tail -3
    done
    log "bf16 attention against torch SDPA (flash backend), T=512 and 2048"
    timeout "$(left 150)" python3 bench/attention_tc_gpu.py --precision bf16 \
        --out "$OUT/attention-bf16.json" 2>&1 | keep | tail -3
    for p in bf16 tf32; do
        log "device-only per-method profile of the $p step"
        timeout "$(left 100)" python3 bench/bench_gpu.py --profile-only --precision $p \
            --out "$OUT/profile-$p.json" 2>&1 | keep | tail -3
    done
    ;;
bf16curves)
    # issue 33, runs 2 and 5: the gpu preset in tf32 and in bf16, the same seed, data order
    # and steps, side by side on the one GPU (each gets part of it), with pytest -m gpu
    # beside them (niced). The data travels compressed: .carry/gpu-data.tar.xz (euler data
    # prepare --books ../shared/data/books --web ../shared/data/web --vocab-size 4096
    # --out gpu-data; tar -cJf .carry/gpu-data.tar.xz gpu-data). A run still going at the
    # deadline gets Ctrl-C (SIGINT: it saves a checkpoint and stops).
    mkdir -p runs && tar -C runs -xJf .carry/gpu-data.tar.xz
    common=(--device cuda --preset gpu --data runs/gpu-data --batch-size 32
        --steps "${CURVE_STEPS:-4500}" --lr 1e-3 --min-lr 1e-4 --warmup-steps 100 --eval-every 500
        --eval-batches 20 --sample-tokens 0 --ckpt-every 100000 --log-every 50)
    log "curves: tf32 and bf16 side by side, ${CURVE_STEPS:-4500} steps each"
    for p in tf32 bf16; do
        timeout -s INT "$(left 575)" python3 -m euler.cli train "${common[@]}" --precision $p \
            --out /tmp/runs/$p >"$OUT/train-$p.txt" 2>&1 &
    done
    log "pytest -m gpu, beside the trainings"
    timeout "$(left 560)" nice -n 5 python3 -m pytest -q -m gpu "${GPU_TESTS[@]}" \
        >"$OUT/pytest-gpu.txt" 2>&1
    grep -E "passed|failed|error" "$OUT/pytest-gpu.txt" | tail -5 | tee -a "$OUT/log.txt"
    wait
    for p in tf32 bf16; do
        cp /tmp/runs/$p/metrics.jsonl "$OUT/metrics-$p.jsonl"
        cp /tmp/runs/$p/run.json "$OUT/run-$p.json"
        tail -6 "$OUT/train-$p.txt" | tee -a "$OUT/log.txt"
    done
    ;;
pipeline)
    # issue 33, run 3: pretrain the gpu preset in PIPE_PRECISION (bf16) for PIPE_SECONDS on
    # the carried books + web shards (4,096-token tokenizer, as bf16curves), fine-tune on the
    # carried instructions with prepare-sft's default policy, then euler eval (held-out bits
    # per byte, beside the fine-tuning on the same GPU; the held-out instruction metrics) and
    # euler chat on ten fixed instructions, greedy and sampled. Eval and chat run in
    # PIPE_EVAL_PRECISION (tf32: the KV-cache decoder is fp32; bf16 recomputes the context
    # for every token). Everything small comes back under $OUT; the checkpoints do not.
    p=${PIPE_PRECISION:-bf16}
    e=${PIPE_EVAL_PRECISION:-tf32}
    mkdir -p runs && tar -C runs -xJf .carry/gpu-data.tar.xz
    log "prepare-sft (context 512, default policy)"
    python3 -m euler.cli data prepare-sft .carry/instructions/*.json --tokenizer runs/gpu-data \
        --seq-len 512 --out runs/sft-data 2>&1 | keep
    log "pretrain: gpu preset, $p, ${PIPE_SECONDS:-270} s (Ctrl-C then: it saves and stops)"
    timeout -s INT "$(left "${PIPE_SECONDS:-270}")" python3 -m euler.cli train --device cuda \
        --preset gpu --precision "$p" --data runs/gpu-data --out runs/pre --batch-size 32 \
        --steps "${PIPE_STEPS:-9000}" --lr 1e-3 --min-lr 1e-4 --warmup-steps 100 --eval-every 1000 \
        --eval-batches 20 --ckpt-every 100000 --log-every 250 >"$OUT/pipeline-train.txt" 2>&1
    tail -3 "$OUT/pipeline-train.txt" | tee -a "$OUT/log.txt"
    log "euler eval --text on the pretrained model, beside the fine-tuning"
    timeout "$(left 200)" python3 -m euler.cli eval --checkpoint runs/pre --text runs/gpu-data --device cuda \
        --precision "$p" --json "$OUT/pipeline-eval-text.json" >"$OUT/pipeline-eval-text.txt" 2>&1 &
    # 243 windows of about 9 records (2,212 kept at context 512): 80 steps of 8 see each
    # about 2.6 times (200 steps took the training loss to 0.28 and the validation loss up)
    log "sft: ${PIPE_SFT_STEPS:-80} steps of 8 windows"
    timeout "$(left 120)" python3 -m euler.cli sft --device cuda --precision "$p" --checkpoint runs/pre \
        --data runs/sft-data --out runs/sft --batch-size 8 --steps "${PIPE_SFT_STEPS:-80}" \
        >"$OUT/pipeline-sft.txt" 2>&1
    tail -2 "$OUT/pipeline-sft.txt" | tee -a "$OUT/log.txt"
    log "euler eval: the held-out instructions ($e)"
    timeout "$(left 150)" python3 -m euler.cli eval --checkpoint runs/sft --device cuda --precision "$e" \
        --instructions runs/sft-data/val-instructions.json \
        --json "$OUT/pipeline-eval-instructions.json" 2>&1 | keep | tail -12
    log "euler chat --device cuda ($e): ten instructions, greedy, then sampled"
    for t in 0 0.8; do
        for q in "Give three tips for staying healthy." "What is the capital of France?" \
            "Write a short poem about the sea." "Explain why the sky is blue." \
            "Name three primary colors." "Describe a cat in one sentence." \
            "Translate 'good morning' into Spanish." "What is 2 plus 2?" \
            "Suggest a name for a bakery." "Summarize the story of Cinderella."; do
            printf '%s\n/reset\n' "$q"
        done | timeout "$(left 60)" python3 -m euler.cli chat --checkpoint runs/sft \
            --device cuda --precision "$e" --temperature $t --max-tokens 64 \
            >>"$OUT/pipeline-chat.txt" 2>&1
    done
    wait
    keep <"$OUT/pipeline-eval-text.txt" | tail -8
    for r in pre sft; do cp runs/$r/metrics.jsonl "$OUT/pipeline-$r-metrics.jsonl"; done
    ;;
decode)
    # issue 33, run 4: decode_batch.py on the gpu preset's random initialisation (decoding
    # speed does not depend on what the weights say: it never stops early), then euler serve
    # (serve_clients)
    log "the GPU KV-cache kernels against the CPU, graphs against launches (pytest -k kv_cache)"
    timeout "$(left 200)" python3 -m pytest -q -m gpu tests/test_gpu_device.py -k kv_cache 2>&1 \
        | grep -E "Error|passed|failed" | tee -a "$OUT/log.txt"
    log "decode attention: split keys (the package) against one key at a time (lab)"
    timeout "$(left 120)" python3 bench/labs/decode_attention_gpu.py \
        --out "$OUT/decode-attention.json" 2>&1 | keep
    log "decode products: the package's row groups against feature tiles (lab)"
    timeout "$(left 150)" python3 bench/labs/decode_linear_gpu.py \
        --out "$OUT/decode-linear.json" 2>&1 | keep
    log "decode tokens/s, batch 1, 8, 32, graphs and launched, against the recompute decoder"
    timeout "$(left 240)" python3 bench/decode_batch.py --preset gpu --device cuda \
        --rounds 3 --steps 200 --prompt-len 32 --json "$OUT/decode-batch.json" 2>&1 | keep
    serve_clients
    ;;
serve)
    log "decode products: the package's row groups against feature tiles (lab)"
    timeout "$(left 150)" python3 bench/labs/decode_linear_gpu.py \
        --out "$OUT/decode-linear.json" 2>&1 | keep
    serve_clients
    ;;
norm)
    log "each bf16 product of the step with each of cuBLASLt's heuristic algorithms (lab)"
    timeout "$(left 240)" python3 bench/labs/cublaslt_bf16_algos_gpu.py \
        --out "$OUT/cublaslt-bf16-algos.json" 2>&1 | grep -E '"kind": "(summary|error)"' | keep
    log "the bf16 step, RMSNorm rows held against read twice, 3 rounds in turn (graphs)"
    timeout "$(left 330)" python3 bench/bench_gpu.py --steps-only --precision bf16 \
        --knobs default reread_rmsnorm --rounds 3 --graph-only --steps 20 \
        --out "$OUT/steps-bf16-norm.json" 2>&1 | grep -E "^(default|reread)" | keep
    ;;
algos)
    # the cuBLASLt products on each one's fastest of 8 algorithms (GpuOptions.gemm_candidates):
    # the gpu tests, the step against the heuristic's first algorithms in turn, euler bench
    log "pytest -m gpu: device, bf16 and tensor-core attention tests"
    timeout "$(left 260)" python3 -m pytest -q -m gpu tests/test_gpu_device.py \
        tests/test_gpu_bf16.py tests/test_gpu_tc.py >"$OUT/pytest-gpu.txt" 2>&1
    grep -E "passed|failed|Error" "$OUT/pytest-gpu.txt" | tail -8 | tee -a "$OUT/log.txt"
    log "the bf16 step, fastest algorithms against the heuristic's first, 2 rounds in turn"
    timeout "$(left 100)" python3 bench/bench_gpu.py --steps-only --precision bf16 \
        --knobs default first_algorithm --rounds 2 --graph-only --steps 20 \
        --out "$OUT/steps-bf16-algos.json" 2>&1 | grep -E "^(default|first)" | keep
    log "euler bench --precision bf16 (ours, ours_cuda_graph, torch eager, torch compiled)"
    timeout "$(left 220)" python3 -m euler.cli bench --device cuda --preset gpu --precision bf16 \
        --steps 10 --json "$OUT/bench-bf16.json" 2>&1 | keep | tail -3
    ;;
*)
    echo "usage: $0 check|exact|prep|parts|attention|overlap|labs|curves|final|defaults|bf16|" \
        "speed|bf16curves|gputests|pipeline|decode|serve|norm|algos" >&2
    exit 2
    ;;
esac
log done
