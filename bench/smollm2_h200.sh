#!/usr/bin/env bash
# SmolLM2-135M-Instruct (issue 45) on a lent H200, in one or two device calls:
#     bash bench/smollm2_h200.sh gpu   # import; GPU logits (fp32/tf32/bf16) against
#                                      # transformers; euler eval --instructions, euler sft
#                                      # in bf16, eval again; GPU decoding at batch 1/8/32,
#                                      # ours against transformers' generate (fp32, bf16)
#     bash bench/smollm2_h200.sh cpu   # decoding at batch 1/8/32 on the host's 16 cores,
#                                      # ours (16 and 1 Numba threads) against transformers
#     bash bench/smollm2_h200.sh test  # tests/test_smollm2.py's gpu-marked test (the GPU
#                                      # logits' bounds on 512 tokens), needs GGUF alone
# Needs GGUF (the file, default /tmp/smol.gguf; never committed) and, but for test, DATA,
# a folder holding sft/ (`euler data prepare-sft` of the shared Alpaca records for the
# imported run, as docs/pretrained.md prepares them), heldout20.json (its first 20 held-out
# records) and book.txt (Through the Looking-Glass, pg12). A second call on the same warm
# machine keeps the import and replaces the earlier steps' results (--overwrite). Each
# step's JSON goes to /tmp/smol-work and all of them, merged, to $OUT/results-CASE.json
# after each step; the log to $OUT/log-CASE.txt. Steps end by a deadline BUDGET_S (585)
# seconds after the start, inside a call's 600. The 98 MB file travels xz-compressed in two
# pieces (a call carries at most 64 MiB); docs/pretrained.md gives the calls of 2026-12-04
# and their results.
set -u
cd "$(dirname "$0")/.."
case=${1:?gpu, cpu or test}
OUT=${OUT:-/tmp/out}
GGUF=${GGUF:-/tmp/smol.gguf}
case $case in
gpu | cpu) DATA=${DATA:?a folder with sft/, heldout20.json and book.txt} ;;
test) ;;
*) echo "error: the case is gpu, cpu or test, not $case" >&2; exit 2 ;;
esac
W=/tmp/smol-work
RUNS=/tmp/smol-runs
mkdir -p "$OUT" "$W" "$RUNS"
export PYTHONUNBUFFERED=1 EULER_SMOLLM2_GGUF="$GGUF"
deadline=$((SECONDS + ${BUDGET_S:-585}))
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/log-$case.txt"; }
left() {  # seconds for a step: at most $1, and no later than the deadline (at least 1)
    local l=$((deadline - SECONDS))
    l=$((l < $1 ? l : $1))
    echo $((l < 1 ? 1 : l))
}
step() {  # step NAME SECONDS CMD...: run CMD under its time limit, log it, merge the JSONs
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    log "$name: $*"
    timeout "$(left "$limit")" "$@" 2>&1 | grep --line-buffered -v Warning | tee -a "$OUT/log-$case.txt"
    log "$name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
    python3 -c 'import json, pathlib, sys
w = pathlib.Path(sys.argv[1])
merged = {p.stem: json.loads(p.read_text()) for p in sorted(w.glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(merged, indent=1, ensure_ascii=False) + "\n")' \
        "$W" "$OUT/results-$case.json"
}
[ "$case" = test ] || [ -e "$RUNS/smol" ] || step import 120 euler import --format gguf "$GGUF" --out "$RUNS/smol" \
    --context 2048
if [ "$case" = gpu ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv | tee -a "$OUT/log-$case.txt"
    step logits 150 python3 bench/smollm2_check.py --gguf "$GGUF" --device cuda \
        --book "$DATA/book.txt" --json "$W/logits.json"
    step eval-before 90 euler eval --checkpoint "$RUNS/smol" --instructions "$DATA/heldout20.json" \
        --max-tokens 64 --device cuda --json "$W/eval-before.json" --overwrite
    step sft 150 euler sft --checkpoint "$RUNS/smol" --data "$DATA/sft" --out "$RUNS/smol-sft" \
        --device cuda --precision bf16 --steps 200 --batch-size 8 --lr 2e-5 --min-lr 2e-6 \
        --warmup-steps 10 --weight-decay 0 --eval-every 50 --ckpt-every 200 --overwrite
    cp "$RUNS/smol-sft/metrics.jsonl" "$OUT/sft-metrics.jsonl"
    step eval-after 90 euler eval --checkpoint "$RUNS/smol-sft" \
        --instructions "$DATA/heldout20.json" --max-tokens 64 --device cuda \
        --json "$W/eval-after.json" --overwrite
    step decode-ours 90 python3 bench/decode_batch.py --checkpoint "$RUNS/smol" --device cuda \
        --batches 1 8 32 --steps 64 --rounds 3 --json "$W/decode-gpu-ours.json"
    for dt in fp32 bf16; do
        step "decode-transformers-$dt" 60 python3 bench/smollm2_eval.py decode --device cuda \
            --dtype "$dt" --batches 1 8 32 --steps 64 --rounds 3 --json "$W/decode-gpu-hf-$dt.json"
    done
elif [ "$case" = cpu ]; then
    # the host's 16 cores, as on an idle machine: nothing else runs in the call
    step decode-ours-cpu 200 env NUMBA_NUM_THREADS=16 taskset -c 0-15 python3 \
        bench/decode_batch.py --checkpoint "$RUNS/smol" --threads 16 1 --batches 1 8 32 \
        --steps 32 --rounds 3 --json "$W/decode-cpu-ours.json"
    step decode-transformers-cpu 200 taskset -c 0-15 python3 bench/smollm2_eval.py decode \
        --batches 1 8 32 --steps 32 --rounds 3 --json "$W/decode-cpu-hf.json"
else  # test: the gpu-marked test imports the file itself (EULER_SMOLLM2_GGUF, exported above)
    step pytest-gpu 300 python3 -m pytest -q -m gpu tests/test_smollm2.py
fi
log done
