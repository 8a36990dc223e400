#!/usr/bin/env bash
# Two trees' GPU training steps in one lent-H200 call, alternating, so that a redesign is
# held against the tree before it on the same machine at the same time (issue 46's "no
# slower"). Run from the repository root through the device tool:
#     git archive REV | tar -x -C .before     # the tree before, git-ignored
#     bash bench/gpu_before_after.sh .before  # carry [".whl", ".before"]
# Each round times `euler bench --device cuda --preset gpu --no-peer` in bf16 and tf32 for
# the tree before, then this tree (ROUNDS rounds, 2 by default; the first also compiles).
# First, if this tree has it, the readable FlashAttention beside the exact tiles and the
# tensor cores (bench/attention_exact_gpu.py, at most ATTENTION_S seconds, 270; 0 skips
# it). Results: $OUT/before-after.jsonl (one line per run: tree, precision, round,
# tokens/s), $OUT/attention-exact.json, every step's output in $OUT/log.txt.
set -u
BEFORE=${1:?the tree before, e.g. .before}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/log.txt"; }

log setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-compile \
    --target /tmp/before "$BEFORE" 2>&1 | tail -1
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/log.txt"

# tree (before|after), precision, round: one `euler bench`, its tokens/s into the JSONL
bench() {
    local path=/tmp/site
    [ "$1" = before ] && path=/tmp/before:/tmp/site
    log "$1 $2 round $3"
    local json="$OUT/$1-$2-$3.json"
    (cd /tmp && PYTHONPATH=$path timeout 240 python3 -m euler.cli bench --device cuda \
        --preset gpu --precision "$2" --steps 20 --no-peer --json "$json") 2>&1 |
        grep --line-buffered -v Warning | tee -a "$OUT/log.txt"
    python3 - "$json" "$1" "$2" "$3" >>"$OUT/before-after.jsonl" <<'EOF'
import json, sys
path, tree, precision, rnd = sys.argv[1:]
try:
    runs = json.load(open(path))
except (OSError, ValueError) as e:
    print(json.dumps({"tree": tree, "precision": precision, "round": int(rnd), "error": str(e)}))
    raise SystemExit
print(json.dumps({"tree": tree, "precision": precision, "round": int(rnd), "result": runs}))
EOF
}

if [ -f bench/attention_exact_gpu.py ] && [ "${ATTENTION_S:-270}" != 0 ]; then
    log "readable FlashAttention beside the exact tiles and the tensor cores"
    PYTHONPATH=/tmp/site timeout "${ATTENTION_S:-270}" python3 bench/attention_exact_gpu.py \
        --json "$OUT/attention-exact.json" 2>&1 | grep --line-buffered -v Warning | tee -a "$OUT/log.txt"
fi
for r in $(seq 1 "${ROUNDS:-2}"); do
    for p in ${PRECISIONS:-bf16 tf32}; do
        bench before "$p" "$r"
        bench after "$p" "$r"
    done
done
log done
