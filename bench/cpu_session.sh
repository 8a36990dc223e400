#!/usr/bin/env bash
# One call on the lent machine's 16 Xeon cores: the CPU engine's core scaling against PyTorch.
# Run from the repository root through the device tool with carry [".whl"] (numpy 2.3.5,
# bench/device_wheels.sh); results go to $OUT. Cases:
#     bash bench/cpu_session.sh scaling   # small at 1..16 cores (eager; compile at 16), small
#                                         # at B=128 on 16, gpu preset B=4 T=512 on 16
#     bash bench/cpu_session.sh profile   # each backend method's (and PyTorch op's) ms a step
#                                         # at 1, 2, 4 and 16
#     bash bench/cpu_session.sh policy    # the profile at 2 and 16 under each OpenMP wait policy
#     bash bench/cpu_session.sh products  # bench/labs/cpu_products.py at 2, 8 and 16 threads
#     bash bench/cpu_session.sh bits      # the thread-count bit-identity test at 1..16
#     bash bench/cpu_session.sh final     # the figures the README cites, named by date, small in 3
#                                         # alternating rounds a count (near the 10-minute limit)
#     bash bench/cpu_session.sh before    # with carry ".old" too: that tree's small at 16
#     bash bench/cpu_session.sh ab        # with carry ".before44" too (the tree before the
#                                         # thread-count cut): step times at 2, then ours (two
#                                         # and one block a thread), eager, compile at 16 on
#                                         # 1..16 cores; the tree before on the same counts;
#                                         # the bits at 1..16; step times at 2 again
#     bash bench/cpu_session.sh plans     # product plans in alternating rounds, one process a
#                                         # thread count (labs/cpu_plans.py): small at 2..16
#                                         # cores, B=128 on 16, the gpu preset on 16
#     bash bench/cpu_session.sh cores     # which cores: the CPU topology and who else runs;
#                                         # ours and eager in alternating rounds at 2 on cores
#                                         # 0-1, then 8-9, at 1 and 4 on the first, 2 on 0 and 8
#     bash bench/cpu_session.sh rest      # one round: small at 8 and 16, B=128 and gpu preset at
#                                         # 16, then torch.compile at 16
#     bash bench/cpu_session.sh load      # each library's GFLOP/s a core with every core busy
#                                         # (labs/cpu_blas_cores.py --copies): small and gpu
#                                         # preset shapes on 1, 2 and all cores
#     bash bench/cpu_session.sh libs      # each BLAS library's GFLOP/s a core, gpu preset shapes
#                                         # on all cores, copies and threaded (labs/cpu_blas_libs.py;
#                                         # .whl with blis and scipy-openblas64: device_wheels.sh)
#     bash bench/cpu_session.sh blas      # OpenBLAS's core pick (OPENBLAS_CORETYPE) on one core
#                                         # against PyTorch's, and our step at 1, 2 under each
#     bash bench/cpu_session.sh pairs     # a backward pair's products cut as for half the threads
#                                         # (labs/cpu_plans.py pair_split=2) at 2 and at all cores
#     bash bench/cpu_session.sh two       # small at 2 cores: ours, one block a thread and eager
#                                         # in 8 rounds; then plans (default, per_thread=1,
#                                         # pair_split=2) in alternating rounds on cores 0-1
#     bash bench/cpu_session.sh lockstep  # small at 2 and 4 cores: ours and eager one step each in
#                                         # turn on the same cores (cpu_lockstep.py, 60 pairs)
#     bash bench/cpu_session.sh tiles     # one core: products whole against small tiles, which
#                                         # take OpenBLAS's unpacked kernels (labs/cpu_blas_tiles.py)
#     bash bench/cpu_session.sh warm      # does a step get faster with time? every step's ms
#                                         # of 3 engines a process (labs/cpu_step_times.py)
#                                         # on cores 0-1, 8-9, with malloc on huge pages, at 4;
#                                         # the profile at 1, 2, 4; the products lab at 4;
#                                         # ours and eager at 2 and 4 after 10 untimed steps
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$OUT/log.txt"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . 2>&1 | tail -1
lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|NUMA|L2|L3|Flags" | cut -c1-200 >"$OUT/lscpu.txt"
n=$(nproc)
# The lent image sets OPENBLAS_CORETYPE=Haswell (AVX2 kernels on its AVX-512 Xeon: our step
# ran 1.39x slower so). Unset, euler picks (euler/blas_kernels.py); that pick is exported,
# so that the labs, which load NumPy before euler, run the same kernels.
was=${OPENBLAS_CORETYPE:-}
unset OPENBLAS_CORETYPE
pick=$(python3 -c "import euler, os; print(os.environ.get('OPENBLAS_CORETYPE', ''))")
[ -n "$pick" ] && export OPENBLAS_CORETYPE=$pick
echo "OPENBLAS_CORETYPE was '$was', now '$pick' (euler's pick)" | tee -a "$OUT/log.txt"
for case in "$@"; do
    case "$case" in
    scaling)
        log "small, B=16 x T=128, 1..$n cores"
        python3 bench/cpu_scaling.py --threads 1,2,4,8,$n --compile-at $n \
            --json "$OUT/cpu-scaling-small.json" --plot "$OUT/cpu-scaling-small.png" 2>&1 | tee -a "$OUT/log.txt"
        log "small, B=128 x T=128, $n cores"
        python3 bench/cpu_scaling.py --threads $n --batch-size 128 --steps 5 \
            --json "$OUT/cpu-scaling-small-b128.json" 2>&1 | tee -a "$OUT/log.txt"
        log "gpu preset, B=4 x T=512, $n cores"
        python3 bench/cpu_scaling.py --threads $n --preset gpu --batch-size 4 --seq-len 512 --steps 3 \
            --untimed-steps 1 --json "$OUT/cpu-scaling-gpu.json" 2>&1 | tee -a "$OUT/log.txt"
        ;;
    profile)
        for t in 1 2 4 $n; do
            log "profile at $t threads"
            for engine in ours torch; do
                NUMBA_NUM_THREADS=$t OMP_NUM_THREADS=$t taskset -c 0-$((t - 1)) \
                    python3 bench/labs/cpu_step_profile.py --engine $engine 2>&1 | tail -1 |
                    tee -a "$OUT/profile.jsonl"
            done
        done
        ;;
    policy)
        for pol in "OMP_WAIT_POLICY=PASSIVE" "GOMP_SPINCOUNT=10000" "GOMP_SPINCOUNT=100000" \
            "GOMP_SPINCOUNT=300000" "OMP_WAIT_POLICY=ACTIVE"; do
            for t in 2 $n; do
                log "profile at $t threads, $pol"
                env $pol NUMBA_NUM_THREADS=$t OMP_NUM_THREADS=$t taskset -c 0-$((t - 1)) \
                    python3 bench/labs/cpu_step_profile.py 2>&1 | tail -1 | tee -a "$OUT/policy.jsonl"
            done
        done
        ;;
    products)
        for t in 2 8 $n; do
            log "products lab at $t threads"
            NUMBA_NUM_THREADS=$t OMP_NUM_THREADS=$t taskset -c 0-$((t - 1)) \
                python3 bench/labs/cpu_products.py 2>&1 | tee -a "$OUT/products.jsonl" | cut -c1-60
        done
        log "products lab, gpu preset B=4 x T=512, $n threads"
        python3 bench/labs/cpu_products.py --preset gpu --batch-size 4 --seq-len 512 --reps 5 2>&1 \
            | tee -a "$OUT/products.jsonl" | cut -c1-60
        log "profile, gpu preset B=4 x T=512, $n threads"
        python3 bench/labs/cpu_step_profile.py --preset gpu --batch-size 4 --seq-len 512 --steps 2 2>&1 \
            | tail -1 | tee -a "$OUT/profile.jsonl"
        ;;
    bits)
        log "bits at 1..$n threads"
        EULER_TEST_THREADS=1,2,4,8,$n python3 -m pytest -q -p no:cacheprovider \
            tests/test_engine.py -k thread_count 2>&1 | tail -3 | tee -a "$OUT/log.txt"
        ;;
    final)
        d=$(date -u +%F)
        log "small, B=16 x T=128, 1..$n cores, 3 rounds of 20 steps after 10 untimed"
        python3 bench/cpu_scaling.py --threads 1,2,4,8,$n --compile-at $n --steps 20 \
            --untimed-steps 10 --rounds 3 --json "$OUT/cpu-scaling-small-xeon$n-$d.json" \
            --plot "$OUT/cpu-scaling-small-xeon$n-$d.png" 2>&1 | tee -a "$OUT/log.txt"
        log "small, B=128 x T=128, $n cores"
        python3 bench/cpu_scaling.py --threads $n --batch-size 128 --steps 5 --rounds 3 \
            --json "$OUT/cpu-scaling-small-b128-xeon$n-$d.json" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        log "gpu preset, B=4 x T=512, $n cores"
        python3 bench/cpu_scaling.py --threads $n --preset gpu --batch-size 4 --seq-len 512 --steps 3 \
            --untimed-steps 1 --json "$OUT/cpu-scaling-gpu-xeon$n-$d.json" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        log "bits at 1..$n threads"
        EULER_TEST_THREADS=1,2,4,8,$n python3 -m pytest -q -p no:cacheprovider \
            tests/test_engine.py -k thread_count 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        ;;
    rest)
        d=$(date -u +%F)
        log "small at 8 and $n cores, B=128 and the gpu preset at $n, torch.compile at $n"
        python3 bench/cpu_scaling.py --threads 8,$n --steps 20 --untimed-steps 10 \
            --json "$OUT/cpu-scaling-small-8-$n-xeon$n-$d.json" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        python3 bench/cpu_scaling.py --threads $n --batch-size 128 --steps 5 \
            --json "$OUT/cpu-scaling-small-b128-xeon$n-$d.json" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        python3 bench/cpu_scaling.py --threads $n --preset gpu --batch-size 4 --seq-len 512 --steps 3 \
            --untimed-steps 1 --json "$OUT/cpu-scaling-gpu-xeon$n-$d.json" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        python3 bench/cpu_scaling.py --threads $n --compile-at $n --steps 20 --untimed-steps 10 \
            --json "$OUT/cpu-scaling-small-compile-xeon$n-$d.json" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        ;;
    quick)
        log "small at 2 and $n, B=128 and the gpu preset at $n (eager only)"
        python3 bench/cpu_scaling.py --threads 2,$n --json "$OUT/quick-small.json" 2>&1 | tail -2
        python3 bench/cpu_scaling.py --threads $n --batch-size 128 --steps 5 2>&1 | tail -1
        python3 bench/cpu_scaling.py --threads $n --preset gpu --batch-size 4 --seq-len 512 --steps 3 \
            --untimed-steps 1 2>&1 | tail -1
        ;;
    ab)
        d=$(date -u +%F)
        NUMBA_NUM_THREADS=2 OMP_NUM_THREADS=2 taskset -c 0-1 python3 bench/labs/cpu_step_times.py \
            --engines 3 2>&1 | tee -a "$OUT/step-times.jsonl" | cut -c1-150
        log "small, B=16 x T=128, 1..$n cores, 20 steps after 10 untimed"
        python3 bench/cpu_scaling.py --threads 1,2,4,8,$n --compile-at $n --steps 20 \
            --untimed-steps 10 --ab-per-thread 1 --json "$OUT/cpu-scaling-small-xeon$n-$d.json" \
            --plot "$OUT/cpu-scaling-small-xeon$n-$d.png" 2>&1 | tee -a "$OUT/log.txt"
        log "the tree before (.before44): small on 1, 2, 4, 8, $n cores, no peer"
        (cd .before44 && PYTHONPATH="$PWD:/tmp/site" python3 bench/cpu_scaling.py --threads 1,2,4,8,$n \
            --no-peer --steps 20 --untimed-steps 10 --json "$OUT/cpu-scaling-small-before-xeon$n-$d.json") 2>&1 \
            | tail -8 | tee -a "$OUT/log.txt"
        log "bits at 1..$n threads"
        EULER_TEST_THREADS=1,2,3,4,8,$n python3 -m pytest -q -p no:cacheprovider \
            tests/test_engine.py -k "thread_count or blocked_products or product_plans" 2>&1 | tail -2 | tee -a "$OUT/log.txt"
        python3 bench/labs/cpu_product_bits.py 2>&1 | tail -3 | tee -a "$OUT/log.txt"
        NUMBA_NUM_THREADS=2 OMP_NUM_THREADS=2 taskset -c 0-1 python3 bench/labs/cpu_step_times.py \
            --engines 2 2>&1 | tee -a "$OUT/step-times.jsonl" | cut -c1-150
        ;;
    plans)
        # two, one and four blocks a thread at every count, 16 blocks at any count, larger blocks
        plans=${PLANS:-many_threads=1048576,per_thread=1,per_thread=4+many_threads=1048576,fixed16,block_macs=4194304+many_threads=1048576}
        for t in 2 4 8 $n; do
            log "plans, small, $t cores"
            NUMBA_NUM_THREADS=$t OMP_NUM_THREADS=$t taskset -c 0-$((t - 1)) python3 \
                bench/labs/cpu_plans.py --plans "$plans" 2>&1 | tee -a "$OUT/plans.jsonl" | cut -c1-400
        done
        log "plans, small B=128, $n cores"
        python3 bench/labs/cpu_plans.py --plans "$plans" --batch-size 128 --rounds 4 --steps 5 \
            2>&1 | tee -a "$OUT/plans.jsonl" | cut -c1-400
        log "plans, gpu preset B=4 x T=512, $n cores"
        python3 bench/labs/cpu_plans.py --plans many_threads=1048576,per_thread=1,fixed16 --preset gpu \
            --batch-size 4 --seq-len 512 --rounds 3 --steps 2 --untimed-steps 1 2>&1 \
            | tee -a "$OUT/plans.jsonl" | cut -c1-400
        ;;
    pairs)
        # a backward's pair of products cut as for half the threads (dX whole on one thread at
        # 2 while the other takes dW's sum pieces), against the default and one block a thread
        for cores in 0-1 2-3; do
            log "pair splits, small, 2 cores ($cores)"
            NUMBA_NUM_THREADS=2 OMP_NUM_THREADS=2 taskset -c $cores python3 bench/labs/cpu_plans.py \
                --plans default,per_thread=1,pair_split=2,per_thread=1+pair_split=2 --rounds 8 \
                --steps 8 2>&1 | tee -a "$OUT/pairs.jsonl" | cut -c1-400
        done
        log "pair splits, small, $n cores"
        python3 bench/labs/cpu_plans.py --plans default,pair_split=2 --rounds 6 --steps 8 2>&1 \
            | tee -a "$OUT/pairs.jsonl" | cut -c1-400
        ;;
    two)
        # the one target still open at 2 cores: ours (and one block a thread) against eager in
        # 8 rounds, then the plans lab's alternating rounds on the same cores
        d=$(date -u +%F)
        log "small at 2 cores, 8 rounds, one block a thread beside the default"
        python3 bench/cpu_scaling.py --threads 2 --rounds 8 --steps 20 --untimed-steps 10 \
            --ab-per-thread 1 --json "$OUT/cpu-scaling-small-2-xeon$n-$d.json" 2>&1 | tee -a "$OUT/log.txt"
        log "plans at 2 cores (0-1)"
        NUMBA_NUM_THREADS=2 OMP_NUM_THREADS=2 taskset -c 0-1 python3 bench/labs/cpu_plans.py \
            --plans default,per_thread=1,pair_split=2 --rounds 8 --steps 8 2>&1 \
            | tee -a "$OUT/pairs.jsonl" | cut -c1-400
        ;;
    lockstep)
        # ours and eager one step each in turn on the same cores (bench/cpu_lockstep.py)
        d=$(date -u +%F)
        for t in 2 4; do
            log "lockstep, small at $t cores, 60 pairs"
            python3 bench/cpu_lockstep.py --threads $t --steps 60 --untimed-steps 10 \
                --json "$OUT/cpu-lockstep-small-$t-xeon$n-$d.json" 2>&1 | tail -1 | tee -a "$OUT/log.txt"
        done
        ;;
    tiles)
        # OpenBLAS's unpacked small-matrix and direct kernels (small tiles) against whole calls
        NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 taskset -c 2 python3 bench/labs/cpu_blas_tiles.py \
            --reps 30 | tee -a "$OUT/tiles.jsonl" | cut -c1-400
        ;;
    warm)
        { cat /sys/kernel/mm/transparent_hugepage/enabled /sys/kernel/mm/transparent_hugepage/defrag
          uptime; ps -eo pcpu,psr,comm --sort=-pcpu | head -8; } 2>&1 | tee -a "$OUT/log.txt"
        times() {  # label, cores, threads, then env assignments
            local label=$1 cores=$2 t=$3
            shift 3
            log "step times: $label"
            env "$@" NUMBA_NUM_THREADS=$t OMP_NUM_THREADS=$t taskset -c "$cores" \
                python3 bench/labs/cpu_step_times.py --engines 3 2>&1 |
                sed "s/^{/{\"label\": \"$label\", /" | tee -a "$OUT/step-times.jsonl" | cut -c1-150
        }
        times "2 threads, cores 0-1" 0-1 2
        times "2 threads, cores 8-9" 8-9 2
        times "2 threads, cores 0-1, malloc on huge pages" 0-1 2 GLIBC_TUNABLES=glibc.malloc.hugetlb=1
        times "4 threads, cores 0-3" 0-3 4
        for t in 1 2 4; do
            log "profile at $t threads"
            NUMBA_NUM_THREADS=$t OMP_NUM_THREADS=$t taskset -c 0-$((t - 1)) \
                python3 bench/labs/cpu_step_profile.py 2>&1 | tail -1 | tee -a "$OUT/profile.jsonl" | cut -c1-150
        done
        log "products lab at 4 threads"
        NUMBA_NUM_THREADS=4 OMP_NUM_THREADS=4 taskset -c 0-3 \
            python3 bench/labs/cpu_products.py 2>&1 | tee -a "$OUT/products.jsonl" | cut -c1-60
        log "ours and eager at 2 and 4 cores, 20 steps after 10 untimed"
        python3 bench/cpu_scaling.py --threads 2,4 --steps 20 --untimed-steps 10 \
            --json "$OUT/cpu-scaling-small-2-4.json" 2>&1 | tail -4 | tee -a "$OUT/log.txt"
        times "2 threads, cores 0-1, at the end" 0-1 2
        ;;
    cores)
        { for c in 0 1 2 8; do
              echo "cpu$c: siblings $(cat /sys/devices/system/cpu/cpu$c/topology/thread_siblings_list)," \
                  "core $(cat /sys/devices/system/cpu/cpu$c/topology/core_id)," \
                  "package $(cat /sys/devices/system/cpu/cpu$c/topology/physical_package_id)," \
                  "MHz $(grep MHz /proc/cpuinfo | sed -n "$((c + 1))p" | cut -d: -f2)"
          done
          uptime; ps -eo pcpu,psr,nice,comm --sort=-pcpu | head -6; } 2>&1 | tee -a "$OUT/log.txt"
        rounds() {  # label, cpu list, thread counts
            log "ours and eager in alternating rounds: $1"
            taskset -c "$2" python3 bench/cpu_scaling.py --threads "$3" --rounds 3 --steps 20 \
                --untimed-steps 10 --json "$OUT/rounds-$1.json" 2>&1 | tee -a "$OUT/log.txt"
        }
        rounds cores-0-1 0-15 2
        rounds cores-8-9 8-15 2
        rounds first-cores 0-15 1,4
        rounds cores-0-and-8 0,8 2
        ;;
    load)
        for preset in small gpu; do
            for c in 1 2 $n; do
                log "GFLOP/s a core, $preset shapes, $c copies at once"
                taskset -c 0-$((n - 1)) python3 bench/labs/cpu_blas_cores.py --cores default \
                    --preset $preset --copies $c --reps 10 2>&1 | tee -a "$OUT/blas-load.jsonl"
            done
        done
        ;;
    libs)
        log "GFLOP/s a core, gpu preset shapes, $n copies at once and one call on $n threads"
        python3 bench/labs/cpu_blas_libs.py --preset gpu --copies $n --threaded --reps 3 \
            --libraries numpy,openblas,blis,torch \
            --openblas /tmp/site/scipy_openblas64/lib/libscipy_openblas64_.so 2>&1 | tee -a "$OUT/blas-libs.jsonl"
        ;;
    blas)
        grep -m4 -E "^(vendor_id|cpu family|model|model name)" /proc/cpuinfo | tee -a "$OUT/log.txt"
        log "OpenBLAS's core pick and its products on one core against PyTorch's"
        python3 bench/labs/cpu_blas_cores.py 2>&1 | tee -a "$OUT/blas-cores.jsonl"
        for core in HASWELL SKYLAKEX SAPPHIRERAPIDS; do
            log "ours at 1 and 2 cores, OpenBLAS core $core"
            OPENBLAS_CORETYPE=$core python3 bench/cpu_scaling.py \
                --threads 1,2 --no-peer --steps 20 --untimed-steps 10 2>&1 | tee -a "$OUT/log.txt"
        done
        ;;
    before)
        log "the .old tree: small at $n cores, no peer"
        (cd .old && PYTHONPATH="$PWD:/tmp/site" python3 bench/cpu_scaling.py --threads $n --no-peer) 2>&1 \
            | tee -a "$OUT/log.txt"
        ;;
    esac
done
