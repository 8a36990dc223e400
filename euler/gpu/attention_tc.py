"""Causal grouped-query FlashAttention on TF32 tensor cores (mma.sync m16n8k8, see mma.py).

Same interface, layouts and results (to TF32 rounding) as attention.attention_forward and
attention_backward: qkv (B, T, (H + 2G) E) holds q heads, then k heads, then v heads; query
head h reads kv head h // (H / G); lse (B, H, T) is the natural-log logsumexp of the scaled
scores. Operands are rounded to TF32 (10 mantissa bits) as they are staged, products
accumulate in float32, softmax and its statistics stay in float32.

FlashAttention-2 structure, 128 threads (4 warps) per block, 64-row tiles:

forward: a block owns 64 query rows of one (b, h), warp w rows 16w..16w+15, held as A
  fragments in registers for the whole kernel. Per 64-key tile (K, V in shared memory):
  S = Q K^T into C fragments (each lane: rows g and g + 8, 16 columns), causal mask on the
  diagonal tile, online softmax on the fragments (row max over the 4 lanes of a quad by
  shuffles; row sums stay per lane until the end), then O += P V.
backward_dq: per 64 query rows, D = rowsum(dO O) (saved to dsum), then per key tile
  S = Q K^T, dP = dO V^T, dS = P (dP - D) with P = exp(S - lse), dQ += dS K.
backward_dkv: per 64 key rows of one kv head, over the query tiles of every head of its
  group: S^T = K Q^T, dP^T = V dO^T, dV += P^T dO, dK += dS^T Q.
Each kernel owns what it writes (no atomics, deterministic) unless ATOMIC_DQ (below).

P and dS go from C fragments straight into the next product's A fragments, with no
shared-memory round trip: the 8 keys of a C fragment's column block are summed over in
the next product, and the order of a sum's terms is free, so lane (g, t) feeds its c0,
c2, c1, c3 (keys 2t, 2t, 2t + 1, 2t + 1) as a0..a3 (k = t, t, t + 4, t + 4), and the B
fragment reads key 2t as k = t and key 2t + 1 as k = t + 4. Tiles in shared memory are
row-major with rows padded to E + 4 floats, which makes every fragment load free of bank
conflicts: lane (g, t) reads row g, column t (banks 4g + t) or, permuted, row 2t, column
g (banks 8t + g). The backward processes a tile's 64 columns in two halves of 32, which
keeps the E = 64 kernels near 128 registers.

As in attention_tiles, register tiles must be scalars (an array indexed in a loop would
live in local memory), so the kernel source is generated with the fragment loops written
out, once per head size E (8, 16, 32 or 64), and shared-memory offsets are uint64 (numba
then emits no negative-index test per load). The simulator has no warp shuffles: there
the quad reductions go through shared memory (the generated source differs only there).

Generation knobs (module constants, read when kernels() builds; the defaults are the
fastest combination measured, bench/attention_tc_gpu.py --variants):

PIPELINE: the loop's tiles go through cp.async (async_copy.py) into two buffers: at the
  top of iteration j a thread waits for its copies of tile j, a barrier, then it issues
  tile j + 1 into the other buffer (free: every warp passed the barrier, so is done with
  tile j - 1) and computes on tile j while those copies fly. The first tile's copies are
  issued before the once-per-block staging (Q; Q, dO; K, V) into the second buffer (K into
  its own tile with ATOMIC_DQ).
  The copies carry raw float32, so the B fragment loads round to TF32 (one cvt.rna per
  value, as the staging did) and nothing can be scaled on the way: the dkv kernel scales
  K at its staging instead of Q, and dK as it is written. dkv's loop runs over (head,
  query tile) pairs, so the next tile may be the next head's; lse and dsum come with
  4-byte copies. Shared memory is dynamic (shared_bytes, over 48 KB at E = 64: the
  launcher raises the limit as attention.py does), and tiles must start on 16 bytes.
ATOMIC_DQ: no dq kernel: attention.backward_prep writes dsum and zeroes dQ, and
  the dkv kernel, after dS^T of a tile pair, stores it to shared memory ([key][query],
  rows padded to 68) and each warp adds dQ = dS K (scaled) for 16 queries into dqkv
  with atomics: 5 tile products per tile pair instead of 7, nondeterministic sums.
ATOMIC_WIDTH: those atomics 1, 2 or 4 (the default) columns a request (vector.atomic_add2,
  atomic_add4); for 4 dQ's product reads K^T with its column blocks interleaved in pairs,
  so each lane holds 4 adjacent columns of a row.
SPLIT_TF32 (3xTF32): each operand x becomes hi = tf32(x) and lo = tf32(x - hi), and each
  product three mma (lo hi, hi lo, hi hi): fp32-level errors (2e-7 of the values' scale in
  the simulator, against 4e-4 for TF32: bench/labs/attention_tc_sim.py; 4e-6 in out and 9e-5
  in dqkv on the H200). Its forward beats the exact kernels' (below), its backward does
  not; ptxas 13 at E = 64: forward 211 registers, no spills; the backward kernels spill
  (264-492 bytes) in every arrangement tried.
FAST_EXP: probabilities through ex2.approx (approx.py) instead of libdevice's expf; the
  forward's Q carries log2(e) in its scale, so its exponentials are 2^x, one instruction.
HEAVY_FIRST: the backward's grid has heads on its fast axis, tiles heaviest first on its
  slow one, so the last blocks dispatched are the lightest of the grid.
HEAVY_FIRST_FORWARD: the same for the forward's grid.
ADD_ROUND: the raw tiles' B fragments rounded by one integer add (mma.tf32_operand), not
  cvt.rna (a test and an add in SASS).
WIDE: forward blocks of 128 query rows, 32 a warp (two A tiles per B fragment).
MIN_BLOCKS: launch_bounds (128, MIN_BLOCKS) to cap registers, as attention_tiles.
ASYNC_Q: the forward's Q by cp.async too, scaled and rounded as its fragments load.
STAGED_OUT: out, dK and dV leave through the free buffer, 16 bytes a lane (_store_staged).
ASYNC_KV: dkv's K and V by cp.async, K scaled and rounded in place by its copier.
FLAT: whole tiles' copies and dQ's atomics by one flat index a tile, stepped a row block a
  copy (clamped 3-d indices for a partial tile only).
EXP2_DKV: dkv's probabilities as 2^x (log2(e) in K's A fragments and in each tile's lse).
LDSM: the nt products' B fragments (over K in the forward, Q and dO in dkv) four at a time
  by ldmatrix (mma.ldmatrix_x4).
LDSM_DQ: dkv's dQ = dS K by ldmatrix as well, from K^T (made once a block) and dS stored
  [query][key].
PREP_BLOCKS: no prep kernel: the dkv grid's first row writes dsum and dQ's zeros, unit by
  unit, while the dkv blocks run, each waiting for a tile's flag (flags.py) before its
  copies; PREP_SPAN, PREP_STAGES, PREP_FLAG_EVERY shape those blocks; PREP_READY_LOOP
  gives the blocks of prepared pairs a loop without the flags.
Whatever the knobs, probabilities and score gradients round by mma.tf32_finite (an add
and a mask) and row maxima are trees of branchless.fmax.

Measured on an H200 (bench/attention_tc_gpu.py --variant NAME, B=32, H=12, G=4, E=64;
errors against a float64 reference within 4e-4 of the values' scale), forward and
backward ms at T=512 (T=2048). Since 2026-11-30 each figure is the device's time alone (10
calls back to back behind a spinning kernel, bench/gpu_timing.py); the rows below the first
six were one call between CUDA events, the host's launch (40-90 us) included:
  default (2026-11-30, session 17: PREP_BLOCKS, ATOMIC_WIDTH 4, PREP_READY_LOOP)
                                     0.134 0.318 (1.63 4.08)  96 (125) TFLOP/s, bwd 2.38x
  default (2026-11-30, session 13: FLAT, EXP2_DKV, LDSM)
                                     0.134 0.351 (1.62 4.43)  96 (127) TFLOP/s forward
  default (2026-11-30, session 10: the prep kernel indexed by shifts, 0.040 ms from 0.059)
                                     0.142 0.361 (1.79 4.73)  90 (115) TFLOP/s forward
  default (2026-11-30, session 9: ASYNC_Q, STAGED_OUT, ASYNC_KV, the 16-byte prep kernel)
                                     0.143 0.379 (1.79 4.73)  90 (115) TFLOP/s forward
  default (2026-11-30: ATOMIC_WIDTH 2, ADD_ROUND and HEAVY_FIRST_FORWARD on)
                                     0.169 0.467 (1.88 5.10)  76 (110) TFLOP/s forward
  default of 2026-11-29 (ATOMIC_WIDTH 1, cvt.rna, tiles first in the forward, e^x)
                                     0.207 0.564 (2.24 6.46)  62 (92) TFLOP/s forward
  PIPELINE, ATOMIC_DQ, FAST_EXP, HEAVY_FIRST  0.300 0.649 (2.33 7.27)  43 (88) TFLOP/s
  PIPELINE, ATOMIC_DQ, FAST_EXP       0.296 0.744 (2.49 7.05)  44 TFLOP/s forward (83)
  PIPELINE and ATOMIC_DQ             0.311 0.782 (2.51 7.46)   41 TFLOP/s forward (82)
  3xTF32 (SPLIT_TF32, libdevice exp) 0.659 2.133 (6.19 21.4)   errors 4e-6 (out), 9e-5 (dqkv)
  PIPELINE alone                     0.312 0.881 (2.52 7.72)
  neither (staged loads, dq kernel)  0.401 1.059 (3.91 9.98)
Launch-free in one run (2026-11-30, results/attention-table-launchfree-s10-2026-11-30-h200.json):
this module 0.144 and 0.365 (1.79 4.58), 3xTF32 0.381 1.143, the exact fp32 kernels
(attention_tiles) 0.460 1.032 (6.32 14.2), torch SDPA fp32 0.488 1.276 (6.13 15.5).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32
from numba.cuda.cudadrv.driver import device_memset

from euler.gpu import attention
from euler.gpu.approx import LOG2E
from euler.gpu.async_copy import check_aligned
from euler.gpu.generated import Source, compile_generated
from euler.gpu.mma import SIMULATOR

THREADS = 128  # 4 warps
TILE = 64  # rows per tile, 16 per warp
HALF = 4  # 8-column blocks per pass of the backward (32 of a tile's 64 columns)
# Staging loads in flight per tile before their stores. A chunk costs one memory latency
# (with 8, an E = 64 tile took four), so forward and dq issue a whole tile's at once; dkv,
# with K, V, dK and dV fragments live, keeps to 8 for registers.
LOAD_CHUNK = 32
LOAD_CHUNK_DKV = 8
SIM_RED = 2 * THREADS  # floats of shared scratch for the simulator's quad reductions
LDS = TILE + 4  # padded row of ATOMIC_DQ's 64 x 64 dS^T tile
# Generation knobs (bench/attention_tc_gpu.py --variants measures their combinations):
# PIPELINE: the loop's tiles (K, V in forward and dq; Q, dO, lse, dsum in dkv) are copied
# with cp.async into two buffers, tile j + 1 landing while tile j's products run; staged
# raw, so their fragment loads round to TF32. Two buffers need dynamic shared memory over
# 48 KB at E = 64 (shared_bytes).
PIPELINE = True
# ATOMIC_DQ: no dq kernel; the dkv kernel writes its tile's dS to shared memory and adds
# dQ = dS K (scaled) into dqkv with atomics, after attention.backward_prep has zeroed
# dQ and written dsum: 5 tile products per tile pair instead of 7. The dkv blocks doing
# the prep's work themselves, each 64-row unit claimed by compare-and-swap, took the
# backward to 0.430 ms at T=512 from 0.362: the heaviest blocks, first to need most units,
# prepared them on the critical path (commit 687c9ff, results/fused-prep-s11-*).
ATOMIC_DQ = True
# ATOMIC_WIDTH: ATOMIC_DQ's adds take 1, 2 or 4 adjacent columns a request (vector.py's
# atomic_add2 and atomic_add4: red.global.add.v2.f32, .v4.f32). A lane's C fragment holds
# columns 2t and 2t + 1 of rows g and g + 8. For 4 (from E = 16; E = 8 takes 2) dQ's
# product reads K^T (transposed in place once a block, as LDSM_DQ's) with its column
# blocks interleaved in pairs (_atomic_dq), so a lane holds 4 adjacent columns of each row
# and loads its B values 8 bytes at a time; no shuffle, no extra pass. One float atomic a
# value makes 57 million requests a call at T=512, which the L2's atomic units serve one by
# one. On the H200 at T=512 (T=2048): 0.538 (6.08) ms with 1, 0.479 (5.23) with 2 (results/
# attention-tc-launchfree-r4-*, -r5-*); in session 17, 4 interleaved 0.3223, 0.3224 against
# 2's 0.3408, 0.3403 (4.146-4.155 against 4.446-4.472), and with PREP_READY_LOOP 0.3184,
# 0.3179 (4.069-4.086): 2.38x the forward (results/attention-tc-s17-call3-*). The loop: 254
# registers, no spill, 2,256 SASS instructions a tile against 2,276 for 2's. Four columns
# by other means lost: the lanes of a pair swapping halves by shuffles (0.493 against 0.479,
# a register spilled), a staging pass through shared memory (0.376 against 0.363; commit
# 9cb7083, results/staged-dq-s11-*). dQ's product over 16 or 64 columns a pass instead of
# 32: 0.370 and 0.391 against 0.363 (dq-blocks-s11-*).
ATOMIC_WIDTH = 4
# SPLIT_TF32 (3xTF32): every operand x is split into hi = tf32(x) and lo = tf32(x - hi), and
# a product takes three mma: lo hi + hi lo + hi hi (lo lo, 2^-22 of it, is dropped). Tiles
# are staged and P, dS kept unrounded for it; errors fall to fp32's level at 3x the mma.
SPLIT_TF32 = False
# FAST_EXP: probabilities from ex2.approx (approx.py) instead of math.exp (libdevice, about
# 9 instructions): the forward's 64 x 64 exps per tile are a large share of its
# instructions, and their results are rounded to TF32 anyway. The forward takes log2(e) into
# Q's scale and exponentiates 2^x (exp2_approx: one instruction, no multiply).
FAST_EXP = True
# HEAVY_FIRST: the backward's grid runs over heads on its fast axis and over tiles on its
# slow one, heaviest first (the key tiles with the most queries), so the blocks dispatched
# last, which run while others idle, are the lightest of the whole grid rather than of one
# head. On the H200 at T=512: backward 0.62-0.70 ms against 0.74 (at T=2048 even;
# results/attention-tc-heavy-first-ab-*).
HEAVY_FIRST = True
# HEAVY_FIRST_FORWARD: the forward's grid in that order too. Launch-free on the H200
# (bench/gpu_timing.py): forward 0.194 ms at T=512 against 0.207 tiles first, 2.20 against
# 2.24 at T=2048 (results/attention-tc-launchfree-r1-*); the single-call A/B of 2026-11-29,
# which had it 4% slower at T=2048, timed the host's launches too.
HEAVY_FIRST_FORWARD = True
# ADD_ROUND: the cp.async tiles' B fragments rounded by mma.tf32_operand (one integer add,
# the tensor core truncating) instead of cvt.rna, which ptxas compiles to a test for inf
# and NaN plus that add: 256 of the forward loop's 1,176 PTX instructions a tile are those
# conversions, and ADD_ROUND takes the forward's FSETP from 355 to 99, dkv's from 640 to 128,
# registers unchanged (bench/ptx_registers.py --census). On the H200: forward 0.187 ms,
# backward 0.541 at T=512 against 0.207 and 0.564 with cvt.rna (launch-free,
# results/attention-tc-launchfree-r1-*).
ADD_ROUND = True
# WIDE (with PIPELINE, not SPLIT_TF32): the forward's blocks take 128 query rows, 32 a
# warp, so each B fragment loaded from shared memory feeds two mma (the forward's shared
# loads a product halve); key tiles stay 64 wide, taken WIDE_KEYS at a time (the online
# softmax per step: 255 registers, no spills in the loop, two blocks a multiprocessor). On
# the H200: 0.170 ms at T=512 against 0.167, 1.69 at T=2048 against 1.88 (16 keys a step:
# 0.182, 1.84; results/attention-tc-launchfree-r3-*). Off: the model trains at T=512.
WIDE = False
WIDE_KEYS = 32  # keys of a key tile taken per online-softmax step by WIDE (8, 16, 32 or 64)
MIN_BLOCKS = 0  # launch bound: blocks per multiprocessor to fit (0: no register cap)
# ASYNC_Q (with PIPELINE): the forward copies Q raw by cp.async (with K, V tile 0) and scales
# and rounds it as its A fragments load, instead of staging it through registers (64 x 64
# loads, then stores and a barrier). Removing that staging outright took the forward from
# 0.167 ms to 0.149 at T=512 on the H200 (bench/labs/attention_tc_ablation.py, no-q-stage); the
# knob took it to 0.143 with STAGED_OUT, against 0.157 without (variant q-staged).
ASYNC_Q = True
# STAGED_OUT (with PIPELINE): the forward's output and dkv's dK, dV go through the free
# buffer in shared memory, each warp its own 16 rows, and leave in 16-byte stores of whole
# rows, instead of 4-byte stores scattered two per 32-byte sector. Removing the forward's
# stores outright took it from 0.167 ms to 0.143 at T=512 (ablation no-store); the knob
# took it to 0.143 with ASYNC_Q, against 0.155 without, and the backward to 0.387 from 0.398
# (variant out-scattered; results/attention-tc-launchfree-s9-*).
STAGED_OUT = True
# ASYNC_KV (with PIPELINE): the dkv kernel's K and V come by cp.async with query tile 0 (K
# then scaled and rounded in place by the thread that copied it, V rounded at its fragment
# loads), not through registers 8 rows at a time (LOAD_CHUNK_DKV: 8 memory latencies).
# Backward 0.379 ms at T=512 against 0.386 (variant kv-staged), dkv 235 registers from 249.
# Rounding dkv's Q and dO tiles in place once a tile (after each thread's wait, before the
# barrier) instead of at each B fragment load lost: 0.407 ms (253 registers; commit
# ca6410e, results/attention-tc-launchfree-s9c-*). So did the same for dkv's Q and dO and
# the forward's K and V in the iteration before their use (after the products, behind a
# cp.async wait for the copies issued at its top): forward 0.148 ms against 0.134, backward
# 0.373 against 0.351 (commit 67d79fa, results/attention-tc-s13-call4-*): the wait exposes
# the copies' latency that a whole iteration hides, though the loops' adds fall from 256 to
# 96 a tile (forward) and from 458 to 134 (dkv). So did Q and dO rounded by others: the
# forward writing its Q tile back rounded, the prep kernel dO (commit 09f4469): dkv's loop
# fell from 2,199 SASS instructions a tile to 1,687 and dkv from 0.310 ms to 0.301, but the
# forward rose from 0.133 to 0.140 and the backward from 0.351 to 0.355 at T=512 (the
# write-back of dO, 50 MB, costs the dkv kernel after it 0.014 ms), though at T=2048 the
# backward fell from 4.56-4.58 to 4.35 (results/attention-tc-s14-call1-*).
ASYNC_KV = True
# Warpgroup products (wgmma.py) for dkv's S^T = K Q^T and dP^T = V dO^T lost: m64n32k8 a
# half, K and V as register A fragments, Q and dO read by the tensor core from tiles in its
# core-matrix layout, rounded in place as they landed, each half's products waited for at
# once (249 registers). Backward 0.436 ms at T=512 against 0.363, 5.53 against 4.76 at T=2048
# (commit 20bf121, results/wgmma-s12-*); of dkv's 0.393 ms the rounding took 0.029 and the
# proxy fence 0.004, and without both it still took 0.364 against mma.sync's 0.326
# (results/wgmma-ablation-s12-*). Hiding the products behind other work needs a second set
# of accumulators, which 255 registers do not hold at two blocks a multiprocessor.


# FLAT (with PIPELINE): the loops' copies of whole tiles and dQ's atomics address global
# memory by one flat element index per tile, stepped a row block at a time
# (async_copy.cp_async16_flat, vector.atomic_add2_flat), behind one test that the tile lies
# within the sequence; a partial tile keeps the clamped 3-d indices. Each clamped copy cost
# about ten instructions (64-bit compares, selects, the index product): the forward loop's
# issue of the next tile takes 76 SASS instructions, not 192, of its 1,159 a tile
# (bench/ptx_registers.py --census --sass DIR, with FLAT=1 and FLAT=0). On the
# H200 at T=512 (T=2048), launch-free: forward 0.1397-0.1406 ms against 0.1432-0.1439
# (1.744 against 1.792), backward alone 0.366-0.369 against 0.361 (4.67-4.69 against
# 4.63-4.66); with LDSM and EXP2_DKV the backward gains (below). Results:
# results/attention-tc-s13-*.
FLAT = True
# EXP2_DKV (with PIPELINE and FAST_EXP): dkv's probabilities as 2^x, as the forward's: K's
# A fragments carry log2(e) (rounded once more as they load, once a block) and each tile's
# lse is multiplied by log2(e) in place by the thread that copied it, before the loop's top
# barrier; exp_approx's multiply per score (32 a lane and tile) goes.
EXP2_DKV = True
# LDSM: the B fragments of the products over a [n][k] tile (S = Q K^T in the forward, S^T
# = K Q^T and dP^T = V dO^T in dkv) four at a time by mma.ldmatrix_x4 (two 8-column blocks'
# b0 and b1), one instruction for four 32-bit shared loads, the same bytes. On the H200 at
# T=512 (T=2048): LDSM alone, forward 0.1383-0.1389 ms, backward 0.3521-0.3522 (1.70,
# 4.48-4.49); with FLAT and EXP2_DKV (the defaults since), forward 0.1333-0.1341 (96.4-96.7
# TFLOP/s), backward 0.3506-0.3525 (1.624-1.625, 4.43-4.48); the kernels before them 0.1426-
# 0.1439 and 0.3610-0.3635 (1.792, 4.63-4.66). For dQ = dS K by ldmatrix as well see
# LDSM_DQ.
LDSM = True
# LDSM_DQ (with LDSM, ATOMIC_DQ and ASYNC_KV): dkv's dQ = dS K by ldmatrix too: K is
# transposed in place once a block (after its A fragments load), so the product's B
# fragments are rows of K^T, and dS is stored [query][key], so its A fragments are rows
# (one ldmatrix_x4 for four 32-bit loads of each operand, keys in their natural order).
# The transpose reads K 16 bytes a lane, 32 keys a warp, and writes rows of K^T whole, both
# free of bank conflicts (the first try, commit 44c0f63, stored each thread's own copies,
# 8-way conflicted: backward 0.3555-0.3560 at T=512, a loss). On the H200, backward
# 0.3516, 0.3520 ms at T=512 against 0.3531, 0.3534 (4.378, 4.372 at T=2048 against 4.417,
# 4.412; 255 registers, no spills; results/attention-tc-s13-call5-*), equal errors against
# float64 at T=100, 512, 2048.
# Off: in session 14 it moved the backward by -0.6% and +1% beside other knobs (calls 1
# and 2), within the calls' spread; the simulator checks it at E = 8, 16 and 32.
LDSM_DQ = False
# PREP_BLOCKS (with PIPELINE, ATOMIC_DQ, HEAVY_FIRST, ASYNC_KV; T a multiple of 64): no prep
# kernel: the dkv grid's first row (one block per batch element and kv head, dispatched
# before every dkv block) writes dsum and dQ's zeros for the query heads of its kv head,
# 64-row unit by unit in the order the heaviest dkv blocks use them, raising a flag a unit
# (after a fence); a dkv block's thread 0 waits for a tile's flag before the barrier that
# precedes its copies, having read it an iteration ahead. The prep's bytes then move while
# the first dkv blocks compute, not before them. The flags are zeroed by a memset a call.
# Unlike the claimed units of session 11 (ATOMIC_DQ's comment), no dkv block prepares.
# On the H200 (session 16, results/attention-tc-s16-call3-*): backward 0.3405, 0.3408 ms at
# T=512 against 0.3506, 0.3508 with the prep kernel (2.55x the forward against 2.63x);
# 4.445, 4.469 at T=2048 against 4.414, 4.432 (0.7% lost: its 64 prep blocks hold their
# slots 0.19 ms there). The prep blocks alone: 0.053 ms at T=512 (0.070 with the pairs'
# batch elements and heads divided out a unit, 3-d copies). Counted by list scheduling,
# most of what is left is packing: the grid's makespan grows by 3 dkv iterations (17 us)
# with the prep blocks in it, against 2.2 of their slot-time (bench/notes_gpu.md).
PREP_BLOCKS = True
PREP_SPAN = 2  # PREP_BLOCKS: kv heads (b, g) a prep block serves; the others exit at once
PREP_STAGES = 3  # units in shared memory at once: two in flight while one is summed
# PREP_FLAG_EVERY: units a prep block's thread 0 raises after one release fence (the first
# two units' at once, then every PREP_FLAG_EVERY). The fence waits for that thread's copies
# in flight, about a unit's latency: on the H200 64 prep blocks alone took 0.061 ms at
# T=512 with 1 (1.3 us a unit); 2 gained 0.5% over 1, 4 nothing over 2 (session 16).
PREP_FLAG_EVERY = 2
# PREP_MAX_T: longer sequences take the prep kernel (dkv's prep = 0), which lost more at
# T=2048 (4.490-4.497 ms, session 16's call 2) than the prep blocks do
PREP_MAX_T = 1 << 30
# PREP_READY_LOOP: dkv's loop twice, with the flags' code and without: a block whose pair's
# last unit is flagged when it starts (all its units prepared) runs the second. The loop's
# flag code costs 77 SASS instructions a tile; ptxas 13 makes the two loops 2,272 and
# 2,177 (254 registers; 2,276 for PREP_BLOCKS's one loop, 2,199 without PREP_BLOCKS).
# At T=512 the first wave's 200 blocks (a third of the iterations) start before the prep
# ends. On the H200 (session 17) with 2-column atomics: 0.3394, 0.3398 ms at T=512 against
# 0.3422, 0.3412, and 0.3390, 0.3390 against 0.3408, 0.3403 in the next call; with 4-column
# ones 0.3184, 0.3179 against 0.3223, 0.3224 (results/attention-tc-s17-call{1,3}-*). The
# heavier compile (here, ptxas on dkv: 94 s against 32-36 with one loop, ptx_registers.py
# --census) is paid once, on first use.
PREP_READY_LOOP = True


# dQ's tile added by bulk reductions of its rows instead (cp.reduce.async.bulk .add.f32 from
# the tile's Q buffer, free after the barrier before dQ; 16 lanes a warp one row each, the
# next iteration's top waiting for their reads) lost: backward 0.3612-0.3616 ms at T=512
# against 0.3509 with the atomics, though 4.48 against 4.59 at T=2048 (commit 9eac9e1,
# results/attention-tc-s14-call2-*). So did dkv blocks of 128 keys, 8 warps, one a
# multiprocessor (a query tile's copies serving twice the keys, dQ summed over 128 keys
# before its atomics, which halved: 0.024 ms of dkv against 0.039): backward 0.396 ms at
# T=512 against 0.351, 4.49 at T=2048 against 4.51-4.54; dkv without its atomics took 0.332
# against 0.271 (session 13's parts), its first query tile wholly masked for half the warps,
# no second block to run through a block's barriers (commit ff2949d,
# results/attention-tc-s14-call4-*). So did dQ without zeros (TICKET_DQ): each query tile's
# first dkv block stored its dS K and the others added after it, ordered by a relaxed
# ticket and a flag a block and tile (thread 0 taking them at the loop's top, reading them
# at the dQ stage; the first's threads fencing before the next top barrier, then raising
# the flag; bounded waits). Correct (`pytest -m gpu tests/test_gpu_device.py` 31 passed),
# and the prep fell from 0.040 ms to 0.027, but dkv rose from 0.310 to 0.356 (0.310
# without its dQ writes, against 0.271): backward 0.387-0.388 at T=512 against 0.350
# (commit f5c40f7, results/attention-tc-s14-call5-*).


def _ldsm_dq() -> bool:
    """Whether dkv's dQ product reads its operands by ldmatrix (LDSM_DQ and what it needs)."""
    return LDSM_DQ and LDSM and ATOMIC_DQ and PIPELINE and ASYNC_KV and not SPLIT_TF32


def _quads(E: int) -> bool:
    """Whether dkv's dQ atomics take 4 columns a request (ATOMIC_DQ, ATOMIC_WIDTH 4 and what
    it needs: two column blocks to interleave; not with SPLIT_TF32 or LDSM_DQ, which take 2)."""
    return ATOMIC_DQ and ATOMIC_WIDTH == 4 and E >= 16 and not SPLIT_TF32 and not _ldsm_dq()


def _wide() -> bool:
    """Whether the forward is WIDE's (_forward_wide_source)."""
    return WIDE and PIPELINE and not SPLIT_TF32


def _forward_rows() -> int:
    """Query rows of a forward block."""
    return 2 * TILE if _wide() else TILE


def supports(E: int) -> bool:
    """Head sizes these kernels are generated for (E divides the 128 threads' staging)."""
    return E in (8, 16, 32, 64)


class _Gen:
    """Source generator for head size E: shared-memory layout and the fragment helpers.

    A product reads its B tile at sm[base + region + constant], base one of the lane's
    fragment offsets (lb for [n][k] tiles, lp for [k][n] ones) or, with PIPELINE, that
    offset plus the current buffer's (bn, bp: set once per tile). raw: the tile was copied
    by cp.async as float32, so each fragment value is rounded to TF32 as it is loaded.
    """

    def __init__(self, E: int):
        self.E, self.NE, self.LD = E, E // 8, E + 4
        self.w = Source()
        self.presplit: set[str] = set()  # A fragments held as hi and lo (SPLIT_TF32)

    def u(self, n: int) -> str:
        return f"uint64({n})"

    def rnd(self, expr: str, finite: bool = False) -> str:
        """expr rounded to TF32 where it becomes an operand (by tf32_finite if finite: a
        probability or a score gradient, never inf or NaN); unrounded with SPLIT_TF32,
        whose products split it themselves."""
        return expr if SPLIT_TF32 else f"tf32{'_finite' if finite else ''}({expr})"

    def exp(self, expr: str) -> str:
        """e^expr: exp_approx with FAST_EXP, else math.exp."""
        return f"exp_approx({expr})" if FAST_EXP else f"math.exp({expr})"

    def block(self, of: str, heavy_first: bool) -> str:
        """The block index over tiles (of="tile") or heads (of="head"): tiles on the slow
        axis (y) if heavy_first (HEAVY_FIRST, HEAVY_FIRST_FORWARD), else on the fast one."""
        return "cuda.blockIdx." + ("y" if (of == "tile") == heavy_first else "x")

    def split(self, names: list[str]) -> None:
        """With SPLIT_TF32: each name's hi (name + "h") and lo (name + "l") TF32 parts."""
        if SPLIT_TF32:
            for n in names:
                self.w(f"{n}h = tf32({n})", f"{n}l = tf32({n} - {n}h)")

    def prologue(self, name: str, args: str, doc: str, smem: int, dynamic: bool) -> None:
        """smem: floats of shared memory (the simulator's scratch goes after them); dynamic:
        allocated at launch (shared_bytes), which is needed over 48 KB."""
        w, LD = self.w, self.LD
        w(f"def {name}({args}):")
        w.indent()
        w(f'"""{doc}"""')
        w("B, Tn, _ = qkv.shape", "T = qkv.dtype.type")
        if not dynamic:
            w(f"sm = cuda.shared.array({smem + (SIM_RED if SIMULATOR else 0)}, float32)")
        elif SIMULATOR:  # which takes no alignment
            w("sm = cuda.shared.array(0, float32)")
        else:  # cp.async writes 16-byte blocks: the array must start on one
            w("sm = cuda.shared.array(0, float32, alignment=16)")
        w("tid = cuda.threadIdx.x", "wp = tid // 32", "g = (tid % 32) // 4", "t = tid % 4")
        w(f"la = uint64((16 * wp + g) * {LD} + t)  # A fragments: rows of this warp")
        w(f"lb = uint64(g * {LD} + t)  # B fragments of a [n][k] tile")
        w(f"lp = uint64(2 * t * {LD} + g)  # B fragments of a [k][n] tile, keys permuted")
        if LDSM:
            # this lane's ldmatrix row: row lane % 8 (+ 8 if lane & 16), 4 words on if lane & 8
            w(f"lm = uint64(((tid & 7) + 8 * ((tid >> 4) & 1)) * {LD} + 4 * ((tid >> 3) & 1))")
        w("dg = 2 * t - 16 * wp - g  # column minus row of c0, less the fragment's offsets")
        w(f"ee = tid % {self.E}", f"rb = tid // {self.E}  # staging: column ee of rows rb + ...")
        if PIPELINE:
            q = self.E // 4
            w(
                f"ra = tid // {q}",
                f"cc = 4 * (tid % {q})  # cp.async: columns cc..cc+3 of rows ra + ...",
            )
            w(f"ca = uint64(ra * {LD} + cc)")

    def stage(self, tiles: list[tuple], chunk: int = LOAD_CHUNK, branchless: bool = True) -> None:
        """Stage 64-row tiles (region, row0, col, src, scale) of src (B, T, C) at sm[region]
        as row-major [row][e], TF32-rounded; rows past the sequence are zeros.

        Thread tid takes column tid % E of rows tid // E + 128 / E * it; a chunk's loads are
        all issued before its stores, so their latencies overlap (a row past the end reads
        the last row, and its store writes zero instead: through select(), which halves the
        kernel's compile time, unless branchless is False).
        """
        w, E, LD = self.w, self.E, self.LD
        step, n = THREADS // E, TILE * E // THREADS
        for k, tile in enumerate(tiles):
            w(f"sb{k} = uint64({tile[0]} + rb * {LD} + ee)")
        for it0 in range(0, n, chunk):
            its = range(it0, min(n, it0 + chunk))
            for k, (_, row0, col, src, scale) in enumerate(tiles):
                for it in its:  # clamped rows: no branch between the loads
                    row = f"min({row0} + rb + {it * step}, Tn - 1)"
                    w(f"v{k}_{it} = {src}[b, {row}, {col} + ee]{scale}")
            for k in range(len(tiles)):
                for it in its:
                    row = f"{tiles[k][1]} + rb + {it * step}"
                    dst = f"sm[sb{k} + {self.u(it * step * LD)}]"
                    value = self.rnd(f"v{k}_{it}")
                    if branchless:
                        w(f"{dst} = select({row} < Tn, {value}, T(0.0))")
                    else:
                        w(f"{dst} = {value} if {row} < Tn else T(0.0)")

    def stage_async(self, tiles: list[tuple], buf: str) -> None:
        """Start cp.async copies of 64-row tiles (region, row0, col, src) of src (B, T, C) to
        sm[buf + region], row-major [row][e], raw float32; rows past the sequence read no
        bytes and land as zeros. Thread tid copies columns cc..cc+3 of rows ra + 512 / E * it
        (E / 8 copies of 16 bytes per tile); the caller commits them as a group."""
        for region, row0, col, src in tiles:
            for rows, at in self.async_chunks(region):
                row = f"{row0} + ra + {rows}"
                dst = f"{buf} + ca + {self.u(at)}"
                src_at = f"{src}, b, min({row}, Tn - 1), {col} + cc"
                self.w(f"cp_async16(sm, {dst}, {src_at}, select({row} < Tn, 16, 0))")

    def stage_async_flat(self, tiles: list[tuple], buf: str) -> None:
        """stage_async for tiles whose 64 rows all lie within the sequence (FLAT): one flat
        index into src a tile, stepped by 512 / E rows a copy."""
        step = 4 * THREADS // self.E
        for region, row0, col, src in tiles:
            self.w(f"fx = (b * Tn + {row0} + ra) * {src}.shape[2] + {col} + cc")
            for k, (_, at) in enumerate(self.async_chunks(region)):
                if k:
                    self.w(f"fx += {step} * {src}.shape[2]")
                self.w(f"cp_async16_flat(sm, {buf} + ca + {self.u(at)}, {src}, fx)")

    def flat_or_clamped(self, whole: str, emit) -> None:
        """emit(flat) writes a tile's copies by flat indices (flat True) or clamped ones:
        with FLAT, the first where the condition `whole` (the tile lies within the
        sequence) holds and the second elsewhere; without, the second alone."""
        if not FLAT:
            emit(False)
            return
        for head, flat in ((f"if {whole}:", True), ("else:", False)):
            self.w(head)
            self.w.indent()
            emit(flat)
            self.w.indent(-1)

    def stage_tiles(self, tiles: list[tuple], buf: str, whole: str) -> None:
        """stage_async, through stage_async_flat where `whole` holds (flat_or_clamped)."""
        self.flat_or_clamped(
            whole, lambda flat: (self.stage_async_flat if flat else self.stage_async)(tiles, buf)
        )

    def async_chunks(self, region: int) -> list[tuple[int, int]]:
        """This thread's 16-byte chunks of a 64-row tile at sm[region] (stage_async's
        copies): (row offset past ra, shared offset past ca) of each of its E / 8."""
        step = 4 * THREADS // self.E
        return [(it * step, region + it * step * self.LD) for it in range(self.E // 8)]

    def kv_tiles(self, row0: str) -> list[tuple]:
        """The K and V tiles of rows row0.. (region, row0, col, src), at sm[0] and sm[64 LD]."""
        return [(0, row0, "ko", "qkv"), (TILE * self.LD, row0, "vo", "qkv")]

    def key_tile_loop(self, buf: int) -> tuple[str, str]:
        """Open the loop over the causal key tiles j0 <= i0 with tile j0's K and V in shared
        memory (with PIPELINE, copied ahead into the buffers at sm[0] and sm[buf]); returns
        the names of the B-fragment temporaries for product_nt and product_nn."""
        w = self.w
        if PIPELINE:
            w("cur = uint64(0)  # tile j0's buffer")
        w("for j0 in range(0, i0 + 64, 64):")
        w.indent()
        if PIPELINE:
            tiles = self.kv_tiles("j0 + 64")
            self.pipeline_top(
                "j0 < i0", buf, lambda: self.stage_tiles(tiles, "nxt", "j0 + 128 <= Tn")
            )
        else:
            self.stage([(*tile, "") for tile in self.kv_tiles("j0")])
            w("cuda.syncthreads()")
        return ("bn", "bp") if PIPELINE else ("lb", "lp")

    def pipeline_top(self, more: str, buf: int, issue, landed: tuple[str, ...] = ()) -> None:
        """Start of a pipelined loop iteration: wait for this tile (the one group in flight),
        the statements `landed` (on this thread's own copies), a barrier (every thread's
        copies visible; every warp done with the other buffer), then if `more`, issue()
        starts the next tile's copies into the other buffer, nxt."""
        w = self.w
        w("cp_async_wait(0)", *landed, "cuda.syncthreads()")
        w(f"nxt = {self.u(buf)} - cur", f"if {more}:")
        w.indent()
        issue()
        w("cp_async_commit()")
        w.indent(-1)
        w("bn = lb + cur", "bp = lp + cur  # this tile's buffer")
        if LDSM:
            w("bm = lm + cur")

    def load_a(
        self, name: str, region: int, presplit: bool = False, raw: str | None = None
    ) -> None:
        """name{kk}_{i}: this warp's A fragments of the [row][e] tile at sm[region]; with
        SPLIT_TF32 and presplit, held as their hi and lo parts (fewer instructions, more
        registers: the forward's one A operand fits, the dkv kernel's two spill). raw (a
        suffix, "" or " * scale"): the tile came by cp.async, so each value takes the suffix
        and is rounded here."""
        LD = self.LD
        for kk in range(self.NE):
            names = [f"{name}{kk}_{i}" for i in range(4)]
            for x, off in zip(names, (0, 8 * LD, 4, 8 * LD + 4), strict=True):
                v = f"sm[la + {self.u(region + 8 * kk + off)}]"
                self.w(f"{x} = {v if raw is None else self.rnd(v + raw)}")
            if presplit and SPLIT_TF32:
                self.split(names)
                self.presplit.update(names)

    def zero(self, acc: str, cols) -> None:
        self.w(*(f"{acc}{n}_{i} = T(0.0)" for n in cols for i in range(4)))

    def _mma(self, acc: str, n: int, a: list[str], b: tuple[str, str] = ("b0", "b1")) -> None:
        """acc{n} += A B for A fragments a (names), B in b (_load_b's b0, b1). With SPLIT_TF32
        A is split here, at each product, unless load_a held it split."""
        c = ", ".join(f"{acc}{n}_{i}" for i in range(4))
        if not SPLIT_TF32:
            self.w(f"{c} = mma_tf32({', '.join(a)}, {b[0]}, {b[1]}, {c})")
            return
        if not self.presplit.issuperset(a):
            for i, x in enumerate(a):
                self.w(f"x{i} = {x}")
            a = [f"x{i}" for i in range(4)]
            self.split(a)
        for ap, bp in (("l", "h"), ("h", "l"), ("h", "h")):  # the small terms first
            frags = ", ".join([x + ap for x in a] + [f"b0{bp}", f"b1{bp}"])
            self.w(f"{c} = mma_tf32({frags}, {c})")

    def _load_b(self, at: list[str], raw: bool) -> None:
        """b0, b1 from sm[at]; raw: a cp.async copy, rounded here (by tf32_operand with
        ADD_ROUND; split with SPLIT_TF32)."""
        for k, a in enumerate(at):
            v = f"sm[{a}]"
            self.w(f"b{k} = {self._operand(v) if raw else v}")
        self.split(["b0", "b1"])

    def _operand(self, v: str) -> str:
        """A raw (cp.async) tile's value v rounded as a B operand (by tf32_operand with
        ADD_ROUND; unrounded with SPLIT_TF32, whose split rounds)."""
        return f"tf32_operand({v})" if ADD_ROUND and not SPLIT_TF32 else self.rnd(v)

    def product_nt(
        self, acc: str, a: str, region: int, cols, base="lb", raw=False, also=()
    ) -> None:
        """acc{n} += A B^T over k < E: A in fragments a{kk}_{i}, B the [n][k] tile at region;
        also: more (acc, a) pairs, other rows' products with each B fragment (WIDE)."""
        LD = self.LD
        cols = list(cols)
        if LDSM and not SPLIT_TF32 and len(cols) % 2 == 0:
            rows = {"lb": "lm", "bn": "bm"}[base]  # this lane's ldmatrix row
            for kk in range(self.NE):
                for n in cols[::2]:  # b0, b1 of blocks n and n + 1
                    at = f"{rows} + {self.u(region + 8 * n * LD + 8 * kk)}"
                    self.w(f"b0, b1, b2, b3 = ldmatrix_x4(sm, {at})")
                    if raw:
                        self.w(*(f"b{k} = {self._operand(f'b{k}')}" for k in range(4)))
                    for acc_, a_ in ((acc, a), *also):
                        for m, b in ((n, ("b0", "b1")), (n + 1, ("b2", "b3"))):
                            self._mma(acc_, m, [f"{a_}{kk}_{i}" for i in range(4)], b)
            return
        for kk in range(self.NE):
            for n in cols:
                off = region + 8 * n * LD + 8 * kk
                self._load_b([f"{base} + {self.u(off)}", f"{base} + {self.u(off + 4)}"], raw)
                for acc_, a_ in ((acc, a), *also):
                    self._mma(acc_, n, [f"{a_}{kk}_{i}" for i in range(4)])

    def product_nn(self, acc: str, p: str, region: int, ks, base="lp", raw=False, also=()) -> None:
        """acc{n} += P B over the keys of C fragments p{kk} (kk in ks), B the [k][n] tile at
        region, with the key permutation of the module docstring; also: as product_nt's."""
        LD = self.LD
        for kk in ks:
            for n in range(self.NE):
                off = region + 8 * kk * LD + 8 * n
                self._load_b([f"{base} + {self.u(off)}", f"{base} + {self.u(off + LD)}"], raw)
                for acc_, p_ in ((acc, p), *also):
                    self._mma(acc_, n, [f"{p_}{kk}_{i}" for i in (0, 2, 1, 3)])

    def mask(self, acc: str, cols, rows_are_queries: bool, diff="dg", shift=0) -> None:
        """-inf where the key is after the query (on the diagonal tile); column minus row
        of a fragment's c0 is diff + shift (WIDE: its own per tile and row tile)."""
        for n in cols:
            for i in range(4):
                d = 8 * n + (i & 1) - 8 * (i >> 1) + shift  # column minus row is diff + d
                cond = f"{diff} > {-d}" if rows_are_queries else f"{diff} < {-d}"
                self.w(f"{acc}{n}_{i} = select({cond}, T(-math.inf), {acc}{n}_{i})")

    def quad(self, op: str, names: list[str], red: int) -> None:
        """Each name becomes op over the 4 lanes of its quad (the lanes holding its row)."""
        w = self.w
        if SIMULATOR:  # no shuffles: meet in shared scratch at sm[red]
            w(*(f"sm[{red + k * THREADS} + tid] = {n}" for k, n in enumerate(names)))
            w("cuda.syncthreads()")
            for k, n in enumerate(names):
                terms = [f"sm[{red + k * THREADS + j} + tid - t]" for j in range(4)]
                w(f"{n} = max({', '.join(terms)})" if op == "max" else f"{n} = {' + '.join(terms)}")
            w("cuda.syncthreads()")
            return
        for n in names:
            for off in (1, 2):
                shfl = f"cuda.shfl_xor_sync(FULL_MASK, {n}, {off})"
                w(f"{n} = max({n}, {shfl})" if op == "max" else f"{n} += {shfl}")


def _store_staged(gen: _Gen, tiles: list[tuple[str, str, str]], dst: str, row0: str) -> None:
    """Store this warp's 16 rows (row0 + 16 wp..) of C-fragment tiles (acc, column, value
    suffix; the value of fragment value x is x + suffix, where suffix may use r, the row
    half) to dst[b, row, column + e] through the free buffer at sm[cur]: each warp writes
    its rows there (rows padded to E + 4), then reads them back 4 columns a lane and stores
    16 bytes at a time, whole rows a request (STAGED_OUT). No barrier but the warp's own:
    no warp reads the free buffer after the loop's last top barrier."""
    w, E, LD = gen.w, gen.E, gen.LD
    per = 16 * LD  # floats of a warp's rows of one tile
    cr = E // 4  # 16-byte chunks of a row
    w(f"so = cur + uint64((16 * wp + g) * {LD} + 2 * t)")
    for k, (acc, _, suffix) in enumerate(tiles):
        for r, (i, j) in enumerate(((0, 1), (2, 3))):
            for n in range(gen.NE):
                for c, x in ((0, i), (1, j)):
                    off = 4 * per * k + 8 * r * LD + 8 * n + c
                    w(f"sm[so + {gen.u(off)}] = {acc}{n}_{x}{suffix.format(r=r)}")
    w("cuda.syncthreads()" if SIMULATOR else "cuda.syncwarp()")
    w(f"lr = (tid % 32) // {cr}", f"lc = 4 * ((tid % 32) % {cr})  # a lane's row, column")
    w(f"sr = cur + uint64((16 * wp + lr) * {LD} + lc)")
    for k, (_, col, _) in enumerate(tiles):
        for it in range(16 * cr // 32):
            row = f"{row0} + 16 * wp + lr + {it * (32 // cr)}"
            at = gen.u(4 * per * k + it * (32 // cr) * LD)
            w(f"x0, x1, x2, x3 = load4_shared(sm, sr + {at})")
            w(f"if {row} < Tn:", f"    store4_3d({dst}, b, {row}, {col} + lc, x0, x1, x2, x3)")


def _buffers(E: int) -> dict[str, int]:
    """Floats of one buffer of each kernel's loop tiles: K, V (forward, dq); Q, dO and
    the 64 rows' lse and dsum (dkv)."""
    LD = E + 4
    return {"forward": 2 * TILE * LD, "dq": 2 * TILE * LD, "dkv": 2 * TILE * LD + 2 * TILE}


def _layout(E: int) -> dict[str, int]:
    """Floats of shared memory of each kernel (the simulator's scratch starts there): one
    buffer, two with PIPELINE; ATOMIC_DQ's dkv adds a K tile and a dS^T tile after them."""
    nbuf = 2 if PIPELINE else 1
    sizes = {k: nbuf * v for k, v in _buffers(E).items()}
    if ATOMIC_DQ:
        sizes["dkv"] += TILE * (E + 4) + TILE * LDS
    if PIPELINE and PREP_BLOCKS and PREP_READY_LOOP:
        sizes["dkv"] += 4  # whether the block's pair is prepared
    return sizes


def _dynamic(kernel: str) -> bool:
    """Whether a kernel takes its shared memory at launch: every layout but the default's
    (theirs fit the 48 KB of a static array; two buffers at E = 64 do not)."""
    return PIPELINE or (kernel == "dkv" and ATOMIC_DQ)


def shared_bytes(E: int) -> dict[str, int]:
    """Dynamic shared memory of each kernel in bytes (0: a static array)."""
    extra = SIM_RED if SIMULATOR else 0
    return {k: 4 * (v + extra) if _dynamic(k) else 0 for k, v in _layout(E).items()}


def _forward_head(gen: _Gen, rows: int) -> None:
    """The forward kernel's signature and its block's (b, h) and first query row i0, for
    blocks of `rows` query rows (64, or 128 with WIDE), the longest rows first."""
    w, E = gen.w, gen.E
    gen.prologue(
        "forward_tc_kernel",
        "out, lse, qkv, H, G, scale",
        f"out (B, T, H E), lse (B, H, T) from qkv; grid _grid(T / {rows}, B H), 128 threads; "
        "scale multiplies Q (with FAST_EXP it carries log2(e)).",
        _layout(E)["forward"],
        _dynamic("forward"),
    )
    head, tile = gen.block("head", HEAVY_FIRST_FORWARD), gen.block("tile", HEAVY_FIRST_FORWARD)
    w("rep = H // G", f"b = {head} // H", f"h = {head} % H")
    w(f"qo = h * {E}", f"ko = H * {E} + (h // rep) * {E}", f"vo = ko + G * {E}")
    w(f"nt = (Tn + {rows - 1}) // {rows}", f"i0 = (nt - 1 - {tile}) * {rows}")


def _online_softmax(gen: _Gen, s: str, o: str, st: str, cols) -> None:
    """One step of the online softmax for a warp's 16 rows over key blocks cols: the
    scores s{n}_{k} become TF32 probabilities, the row statistics m{st}{r}, l{st}{r} (r = 0
    for row g, 1 for g + 8) and the output o{n}_{k} are rescaled. With FAST_EXP the scores
    are in units of log2 (Q carries log2(e), see attention_forward)."""
    w, NE = gen.w, gen.NE
    ex = (lambda x: f"exp2_approx({x})") if FAST_EXP else gen.exp
    rows = ((0, 1), (2, 3))  # the C fragment's values of rows g and g + 8
    for r, (i, j) in enumerate(rows):
        w(f"mx{r} = {_max_tree([f'{s}{n}_{k}' for n in cols for k in (i, j)])}")
    gen.quad("max", ["mx0", "mx1"], _layout(gen.E)["forward"])
    for r, (i, j) in enumerate(rows):
        # mn is finite (a row's first step has a key at or before it), so the first step's
        # m = -inf gives al = exp(-inf) = 0
        m, l = f"m{st}{r}", f"l{st}{r}"
        w(f"mn = max({m}, mx{r})", f"al = {ex(f'{m} - mn')}")
        for n in cols:
            w(*(f"{s}{n}_{k} = {gen.rnd(ex(f'{s}{n}_{k} - mn'), True)}" for k in (i, j)))
        w(f"{l} = {l} * al + " + " + ".join(f"{s}{n}_{k}" for n in cols for k in (i, j)))
        w(f"{m} = mn")
        w(*(f"{o}{n}_{k} *= al" for n in range(NE) for k in (i, j)))


def _forward_out(gen: _Gen, o: str, st: str, row: str, staged: bool = False) -> None:
    """Store a warp's 16 rows from row `row` on: out = o / l (columns oc + 8n, + 1 of
    lane t; staged: through shared memory, _store_staged), lse = m + ln l from lane t = 0
    (natural log; m in log2 units with FAST_EXP)."""
    w = gen.w
    gen.quad("sum", [f"l{st}0", f"l{st}1"], _layout(gen.E)["forward"])
    w(f"r0 = {row}")
    if staged:
        w(f"inv0 = T(1.0) / l{st}0", f"inv1 = T(1.0) / l{st}1")
        _store_staged(gen, [(o, "qo", " * inv{r}")], "out", "i0")
    for r, (i, j) in enumerate(((0, 1), (2, 3))):
        w(f"if r0 + {8 * r} < Tn:")
        w.indent()
        if not staged:
            w(f"inv = T(1.0) / l{st}{r}")
            for n in range(gen.NE):
                w(f"out[b, r0 + {8 * r}, oc + {8 * n}] = {o}{n}_{i} * inv")
                w(f"out[b, r0 + {8 * r}, oc + {8 * n + 1}] = {o}{n}_{j} * inv")
        m = f"m{st}{r} * T({math.log(2.0)!r})" if FAST_EXP else f"m{st}{r}"
        w("if t == 0:", f"    lse[b, h, r0 + {8 * r}] = {m} + math.log(l{st}{r})")
        w.indent(-1)


def _forward_source(E: int) -> str:
    gen = _Gen(E)
    w, NE, LD = gen.w, gen.NE, gen.LD
    KS, VS, BUF = 0, TILE * LD, _buffers(E)["forward"]
    _forward_head(gen, TILE)
    async_q = PIPELINE and ASYNC_Q
    if async_q:  # Q lands in buffer 1, then K, V tile 0 in buffer 0
        gen.stage_async([(0, "i0", "qo", "qkv")], gen.u(BUF))
        w("cp_async_commit()")
    if PIPELINE:  # K, V tile 0 lands in buffer 0 while Q is staged in buffer 1
        gen.stage_async(gen.kv_tiles("0"), gen.u(0))
        w("cp_async_commit()")
    qs = BUF if PIPELINE else KS
    if async_q:
        w("cp_async_wait(1)  # Q's copies (K, V tile 0's may still fly)")
    else:
        gen.stage([(qs, "i0", "qo", "qkv", " * scale")])
    w("cuda.syncthreads()")
    gen.load_a("qa", qs, presplit=True, raw=" * scale" if async_q else None)
    if not PIPELINE:
        w("cuda.syncthreads()  # Q is in registers; its space takes K")
    w("m0 = T(-math.inf)", "m1 = T(-math.inf)", "l0 = T(0.0)", "l1 = T(0.0)")
    gen.zero("o", range(NE))
    bn, bp = gen.key_tile_loop(BUF)
    gen.zero("s", range(8))
    gen.product_nt("s", "qa", KS, range(8), bn, PIPELINE)
    w("if j0 == i0:")
    w.indent()
    gen.mask("s", range(8), rows_are_queries=True)
    w.indent(-1)
    _online_softmax(gen, "s", "o", "", range(8))
    gen.product_nn("o", "s", VS, range(8), bp, PIPELINE)
    if PIPELINE:
        w("cur = nxt")
    else:
        w("cuda.syncthreads()")
    w.indent(-1)
    staged = PIPELINE and STAGED_OUT
    if not staged:
        w("oc = qo + 2 * t")
    _forward_out(gen, "o", "", "i0 + 16 * wp + g", staged)
    return w.text()


def _forward_wide_source(E: int) -> str:
    """The WIDE forward: 128 query rows a block, 32 a warp (two 16-row A tiles, m = 0, 1,
    sharing every B fragment), key tiles of 64 taken WIDE_KEYS at a time (the online
    softmax runs per step, so 32 keys' scores take 32 registers a lane, not 64). A warp
    skips a key tile after all its rows; the block's last two key tiles are masked."""
    gen = _Gen(E)
    w, NE, LD = gen.w, gen.NE, gen.LD
    KS, VS, BUF = 0, TILE * LD, _buffers(E)["forward"]
    _forward_head(gen, 2 * TILE)
    w("jend = min(i0 + 128, Tn)  # past the last key tile")
    w(f"la = uint64((32 * wp + g) * {LD} + t)  # A fragments: this warp's 32 rows")
    gen.stage_async(gen.kv_tiles("0"), gen.u(0))  # K, V tile 0 lands while Q is staged
    w("cp_async_commit()")
    gen.stage([(BUF + KS, "i0", "qo", "qkv", " * scale"), (BUF + VS, "i0 + 64", "qo", "qkv",
               " * scale")])  # fmt: skip
    w("cuda.syncthreads()")
    rows = range(2)  # the warp's two 16-row tiles
    for m in rows:
        gen.load_a(f"qa{m}_", BUF + 16 * m * LD)
        w(*(f"m{m}{r} = T(-math.inf)" for r in range(2)), *(f"l{m}{r} = T(0.0)" for r in range(2)))
        gen.zero(f"o{m}_", range(NE))
    w("cur = uint64(0)  # tile j0's buffer", "for j0 in range(0, jend, 64):")
    w.indent()
    gen.pipeline_top("j0 + 64 < jend", BUF, lambda: gen.stage_async(gen.kv_tiles("j0 + 64"), "nxt"))
    w("if j0 <= i0 + 32 * wp + 31:  # a key of the tile at or before one of the warp's rows")
    w.indent()
    step = WIDE_KEYS // 8  # 8-key blocks a step
    for half in range(8 // step):
        cols = range(step * half, step * half + step)
        for m in rows:
            gen.zero(f"s{m}_", cols)
        gen.product_nt("s0_", "qa0_", KS, cols, "bn", True, also=[("s1_", "qa1_")])
        w("if j0 >= i0:  # keys after rows: column minus row is dw + (the offsets below)")
        w.indent()
        w("dw = j0 - i0 + 2 * t - 32 * wp - g")
        for m in rows:
            gen.mask(f"s{m}_", cols, rows_are_queries=True, diff="dw", shift=-16 * m)
        w.indent(-1)
        for m in rows:
            _online_softmax(gen, f"s{m}_", f"o{m}_", str(m), cols)
        gen.product_nn("o0_", "s0_", VS, cols, "bp", True, also=[("o1_", "s1_")])
    w.indent(-1)
    w("cur = nxt")
    w.indent(-1)
    w("oc = qo + 2 * t")
    for m in rows:
        _forward_out(gen, f"o{m}_", str(m), f"i0 + 32 * wp + {16 * m} + g")
    return w.text()


def _max_tree(names: list[str]) -> str:
    """The largest of names as a balanced tree of branchless.fmax (one FMNMX each; max() of
    floats costs a compare and a select)."""
    while len(names) > 1:
        pairs = [f"fmax({a}, {b})" for a, b in zip(names[::2], names[1::2], strict=False)]
        names = pairs + (names[-1:] if len(names) % 2 else [])
    return names[0]


def _dq_source(E: int) -> str:
    gen = _Gen(E)
    w, NE, LD = gen.w, gen.NE, gen.LD
    KS, VS, BUF, RED = 0, TILE * LD, _buffers(E)["dq"], _layout(E)["dq"]
    gen.prologue(
        "backward_dq_tc_kernel",
        "dqkv, dsum, dout, qkv, out, lse, H, G, scale",
        "dQ part of dqkv, dsum (B, H, T) = rowsum(dO O); grid _grid(T / 64, B H), 128 threads.",
        RED,
        _dynamic("dq"),
    )
    head, tile = gen.block("head", HEAVY_FIRST), gen.block("tile", HEAVY_FIRST)
    w("rep = H // G", f"b = {head} // H", f"h = {head} % H")
    w(f"qo = h * {E}", f"ko = H * {E} + (h // rep) * {E}", f"vo = ko + G * {E}")
    w("nt = (Tn + 63) // 64", f"i0 = (nt - 1 - {tile}) * 64")

    if PIPELINE:  # K, V tile 0 lands in buffer 0 while Q, dO are staged in buffer 1
        gen.stage_async(gen.kv_tiles("0"), gen.u(0))
        w("cp_async_commit()")
    qs, dos = (BUF + KS, BUF + VS) if PIPELINE else (KS, VS)
    gen.stage([(qs, "i0", "qo", "qkv", " * scale"), (dos, "i0", "qo", "dout", "")])
    w("cuda.syncthreads()")
    gen.load_a("qa", qs)
    gen.load_a("da", dos)
    if not PIPELINE:
        w("cuda.syncthreads()  # Q, dO are in registers; their space takes K, V")
    w("r0 = i0 + 16 * wp + g")
    for r in range(2):  # D of rows g and g + 8: a quarter of the columns per lane, exact fp32
        w(f"d{r} = T(0.0)", f"ls{r} = T(0.0)", f"if r0 + {8 * r} < Tn:")
        w.indent()
        w(f"ls{r} = lse[b, h, r0 + {8 * r}]", f"for e in range(qo + t, qo + {E}, 4):")
        w(f"    d{r} += dout[b, r0 + {8 * r}, e] * out[b, r0 + {8 * r}, e]")
        w.indent(-1)
    gen.quad("sum", ["d0", "d1"], RED)
    for r in range(2):
        w(f"if t == 0 and r0 + {8 * r} < Tn:", f"    dsum[b, h, r0 + {8 * r}] = d{r}")
    gen.zero("q", range(NE))
    bn, bp = gen.key_tile_loop(BUF)
    for half in range(8 // HALF):
        cols = range(half * HALF, (half + 1) * HALF)
        _scores(gen, cols, ("qa", KS), ("da", VS), bn, rows_are_queries=True)
        for n in cols:
            for i in range(4):
                r = i >> 1
                e = gen.exp(f"s{n}_{i} - ls{r}")
                w(f"s{n}_{i} = {gen.rnd(f'{e} * (p{n}_{i} - d{r})', True)}")
        gen.product_nn("q", "s", KS, cols, bp, PIPELINE)
    if PIPELINE:
        w("cur = nxt")
    else:
        w("cuda.syncthreads()")
    w.indent(-1)
    w("oc = qo + 2 * t")
    for r, (i, j) in enumerate(((0, 1), (2, 3))):
        w(f"if r0 + {8 * r} < Tn:")
        for n in range(NE):
            w(f"    dqkv[b, r0 + {8 * r}, oc + {8 * n}] = q{n}_{i} * scale")
            w(f"    dqkv[b, r0 + {8 * r}, oc + {8 * n + 1}] = q{n}_{j} * scale")
    return w.text()


def _dkv_source(E: int) -> str:
    """The dkv kernel. Without PIPELINE, Q is staged scaled (S^T = K (Q scale)^T, and dK =
    dS^T (Q scale) needs no scale); cp.async cannot scale, so with PIPELINE K is scaled as
    it is staged instead, and dK takes the scale as it is written. With ATOMIC_DQ the K tile
    stays in shared memory for dQ = dS K, which then needs the scale unless K carries it."""
    gen = _Gen(E)
    w, NE, LD = gen.w, gen.NE, gen.LD
    QS, DOS, LS, DD = 0, TILE * LD, 2 * TILE * LD, 2 * TILE * LD + TILE
    BUF, RED = _buffers(E)["dkv"], _layout(E)["dkv"]
    ready_loop = PIPELINE and PREP_BLOCKS and PREP_READY_LOOP
    READY = RED - 4 if ready_loop else RED  # PREP_READY_LOOP's slot ends the layout
    KK, DS = READY - TILE * (LD + LDS), READY - TILE * LDS  # ATOMIC_DQ: K, dS^T [key][query]
    ksc, qsc = (" * scale", "") if PIPELINE else ("", " * scale")
    gen.prologue(
        "backward_dkv_tc_kernel",
        "dqkv, dsum, dout, qkv, lse, H, G, scale" + (", out, flags, prep" if PREP_BLOCKS else ""),
        f"dK, dV{', dQ (atomic)' if ATOMIC_DQ else ''} parts of dqkv; grid _grid(T / 64, B G), "
        "128 threads; rows are keys.",
        RED,
        _dynamic("dkv"),
    )
    head, tile = gen.block("head", HEAVY_FIRST), gen.block("tile", HEAVY_FIRST)
    w("rep = H // G", f"b = {head} // G", f"kvh = {head} % G")
    if PREP_BLOCKS:  # prep: 1 where the grid's first row prepares (PREP_BLOCKS), else 0
        w("nt = (Tn + 63) // 64", f"if {tile} < prep:")
        w.indent()
        _prep_units(gen, head)
        w("return")
        w.indent(-1)
        tile = f"({tile} - prep)"
    w(f"ko = H * {E} + kvh * {E}", f"vo = ko + G * {E}")
    w(f"j0 = {tile} * 64  # the first key tiles see the most queries")

    def issue_rows(i: str, h: str, buf: str, flat: bool, parts: str) -> None:
        """issue's copies, flat (FLAT: the tile lies within the sequence) or clamped."""
        tiles = [(QS, i, f"{h} * {E}", "qkv"), (DOS, i, f"{h} * {E}", "dout")]
        if "tiles" in parts:
            (gen.stage_async_flat if flat else gen.stage_async)(tiles, buf)
        if flat:
            w(f"fl = (b * H + {h}) * Tn + {i} + (tid & 63)")
        rows = [r for r in ((LS, "lse", 0), (DD, "dsum", TILE)) if r[1] in parts]
        for region, src, lo in rows:  # one float per thread
            w("if tid < 64:" if lo == 0 else "else:" if len(rows) == 2 else "if tid >= 64:")
            at = f"{buf} + uint64({region - lo} + tid)"
            if flat:
                w(f"    cp_async4_flat(sm, {at}, {src}, fl)")
                continue
            row = f"{i} + tid - {lo}"
            n = f"select({row} < Tn, 4, 0)"
            w(f"    cp_async4(sm, {at}, {src}, b, {h}, min({row}, Tn - 1), {n})")

    def issue(i: str, h: str, buf: str, parts: str = "tiles lse dsum") -> None:
        """cp.async of query tile i of head h (Q, dO, and lse, dsum: those named in parts)
        into buffer buf."""
        emit = lambda flat: issue_rows(i, h, buf, flat, parts)  # noqa: E731
        gen.flat_or_clamped(f"{i} + 64 <= Tn", emit)

    ks = KK if ATOMIC_DQ else (BUF + QS if PIPELINE else QS)
    vs = BUF + DOS if PIPELINE else DOS
    async_kv = PIPELINE and ASYNC_KV
    if PREP_BLOCKS:  # thread 0 reads query tile 0's flag (fidx: of tile fi) as K, V copy
        w("fv = 1", "fidx = 0", "fi = 0")
        if ready_loop:  # and the pair's last unit's: set, all its units are prepared
            w("fa = 1")
        w("if prep and tid == 0:", "    fi = j0 >> 6", "    fidx = (b * H + kvh * rep) * nt + fi")
        w("    fv = flag_read(flags, fidx)")
        if ready_loop:
            w("    fa = flag_read(flags, (b * H + kvh * rep + rep) * nt - 1)")
    if async_kv:  # K, V land (K at ks, V in buffer 1), then query tile 0 in buffer 0
        gen.stage_async([(ks, "j0", "ko", "qkv"), (vs, "j0", "vo", "qkv")], gen.u(0))
        w("cp_async_commit()")
    if PIPELINE:  # query tile 0 lands in buffer 0 while K, V are staged
        issue("j0", "kvh * rep", gen.u(0), "tiles lse" if PREP_BLOCKS else "tiles lse dsum")
        w("cp_async_commit()")
    if async_kv:
        w("cp_async_wait(1)  # K's and V's copies (query tile 0's may still fly)")
        for _, off in gen.async_chunks(ks):  # K scaled and rounded in place by its copier
            at = f"ca + {gen.u(off)}"
            w(*(f"sm[{at} + {k}] = {gen.rnd(f'sm[{at} + {k}]{ksc}')}" for k in range(4)))
    else:  # ptxas 13 spills 20 bytes of this kernel (255 registers) if this uses select()
        gen.stage([(ks, "j0", "ko", "qkv", ksc), (vs, "j0", "vo", "qkv", "")], branchless=False)
    if PREP_BLOCKS:  # tile 0's unit prepared before the barrier, then its dsum; tile 1's flag
        w("if prep and tid == 0:", "    while fv == 0:", "        fv = flag_read(flags, fidx)")
        w("    if fi + 1 < nt or rep > 1:")
        _next_flag(gen, " " * 8)
        if ready_loop:
            w("if tid == 0:", f"    sm[uint64({READY})] = T(fa)")
    w("cuda.syncthreads()")
    if PREP_BLOCKS:
        issue("j0", "kvh * rep", gen.u(0), "dsum")
        w("cp_async_commit()")
    exp2 = PIPELINE and FAST_EXP and EXP2_DKV
    gen.load_a("ka", ks, raw=f" * T({LOG2E!r})" if exp2 else None)
    gen.load_a("va", vs, raw="" if async_kv else None)
    ldsm_dq, quads = _ldsm_dq(), _quads(E)
    if ldsm_dq or quads:  # K^T [e][key] over K: a warp reads 32 keys' 16 bytes, writes rows
        per = E // 8  # 4-column chunks a thread: thread tid takes key tid % 64
        w(f"kr = uint64((tid & 63) * {LD} + (tid >> 6) * {4 * per})  # its first chunk")
        for c in range(per):
            w(f"x{c}_0, x{c}_1, x{c}_2, x{c}_3 = load4_shared(sm, kr + {gen.u(KK + 4 * c)})")
        w(
            "cuda.syncthreads()  # every warp has its K fragments and chunks",
            f"kt = uint64((tid >> 6) * {4 * per * LDS} + (tid & 63))  # K^T's rows padded as dS's",
        )
        w(*(f"sm[kt + {gen.u(KK + (4 * c + k) * LDS)}] = x{c}_{k}" for c in range(per)
            for k in range(4)))  # fmt: skip
    if quads:  # dQ's B pairs: keys 2t, 2t + 1 of K^T's row 2g (and 2g + 1), _atomic_dq's
        w(f"lpair = uint64(2 * g * {LDS} + 2 * t)")
    if ldsm_dq:
        row = "16 * wp + (tid & 7) + 8 * ((tid >> 3) & 1)"  # this lane's ldmatrix row of dS
        w(f"ld = uint64(({row}) * {LDS} + 4 * ((tid >> 4) & 1))")
        row = "(tid & 7) + 8 * ((tid >> 4) & 1)"  # and of K^T (lm's, at dS's padding)
        w(f"lk = uint64(({row}) * {LDS} + 4 * ((tid >> 3) & 1))", f"lk8 = uint64(g * {LDS} + t)")
    if not PIPELINE:
        w("cuda.syncthreads()  # K, V are in registers; their space takes Q, dO")
    gen.zero("dk", range(NE))
    gen.zero("dv", range(NE))
    w(f"lc = uint64({LS} + 2 * t)  # this lane's columns' lse; dsum at lc + {TILE}")
    if ATOMIC_DQ:
        w(f"ls = uint64((16 * wp + g) * {LDS} + 2 * t)  # this lane's c0 in the dS^T tile")
        w(f"lt = uint64(2 * t * {LDS} + 16 * wp + g)  # A fragments of dS, keys permuted")

    def tile_body(bn: str, bp: str, lcb: str) -> None:
        """One (head, query tile) pair: S^T and dP^T, P and dS, dV and dK; dQ's adds."""
        for half in range(8 // HALF):
            cols = range(half * HALF, (half + 1) * HALF)
            _scores(gen, cols, ("ka", QS), ("va", DOS), bn, rows_are_queries=False)
            for n in cols:
                for j in range(2):  # the lane's two columns of block n
                    off = 8 * n + j
                    w(f"lq = sm[{lcb} + {gen.u(off)}]", f"dd = sm[{lcb} + {gen.u(off + TILE)}]")
                    for i in (j, j + 2):
                        e = f"exp2_approx(s{n}_{i} - lq)" if exp2 else gen.exp(f"s{n}_{i} - lq")
                        w(f"s{n}_{i} = {e}")
                        w(f"p{n}_{i} = {gen.rnd(f's{n}_{i} * (p{n}_{i} - dd)', True)}")
                        w(f"s{n}_{i} = {gen.rnd(f's{n}_{i}', True)}")
            if ldsm_dq:  # dS [query][key] for dQ: lane (g, t) stores rows 2t, 2t + 1 of block n
                for n in cols:
                    for i in range(4):
                        off = DS + (8 * n + (i & 1)) * LDS + 8 * (i >> 1)
                        w(f"sm[lt + {gen.u(off)}] = p{n}_{i}")
            elif ATOMIC_DQ:  # dS^T [key][query] for dQ; 2-way bank conflicts, 16 stores a half
                for n in cols:
                    for i in range(4):
                        off = DS + 8 * n + (i & 1) + 8 * LDS * (i >> 1)
                        w(f"sm[ls + {gen.u(off)}] = p{n}_{i}")
            gen.product_nn("dv", "s", DOS, cols, bp, PIPELINE)
            gen.product_nn("dk", "p", QS, cols, bp, PIPELINE)
        if ATOMIC_DQ:
            _atomic_dq(gen, KK, DS, "" if PIPELINE else " * scale")

    def pipelined_tile(waits: bool) -> None:
        """A pipelined iteration: this tile landed, the next one's copies issued (after its
        unit's flag, if waits), the tile's work."""
        w(f"qo = h * {E}", "i1 = i0 + 64", "wrap = i1 >= Tn  # then the next head's first tile")
        w("i1 = select(wrap, j0, i1)", "h1 = h + select(wrap, 1, 0)")
        scaled = ("if tid < 64:", f"    sm[cur + uint64({LS} + tid)] *= T({LOG2E!r})")
        landed = scaled if exp2 else ()
        if waits:  # tile it + 1's unit prepared before anyone copies it
            landed += ("if prep and tid == 0 and it + 1 < nit:", "    while fv == 0:",
                       "        fv = flag_read(flags, fidx)")  # fmt: skip
        gen.pipeline_top("it + 1 < nit", BUF, lambda: issue("i1", "h1", "nxt"), landed)
        if waits:  # tile it + 2's flag, read an iteration ahead of its wait
            w("if prep and tid == 0 and it + 2 < nit:")
            _next_flag(gen)
        w("lcb = lc + cur")
        tile_body("bn", "bp", "lcb")
        w("cur = nxt", "i0 = i1", "h = h1")

    if PIPELINE:  # one loop over (head, query tile) pairs: the next tile may be the next head's
        w(f"nit = rep * ((Tn + 63) // 64 - {tile})  # query tiles of the group's heads")
        w("i0 = j0", "h = kvh * rep  # this iteration's query tile and head")
        w("cur = uint64(0)  # this tile's buffer")
        loops = [("range(nit)", PREP_BLOCKS)]
        if ready_loop:  # all iterations wait on flags, or none (the block's pair is prepared)
            w(f"nw = select(sm[uint64({READY})] == T(0.0), nit, 0)")
            loops = [("range(nw)", True), ("range(nw, nit)", False)]
        for iterations, waits in loops:
            w(f"for it in {iterations}:")
            w.indent()
            pipelined_tile(waits)
            w.indent(-1)
    else:
        w("for hh in range(rep):")
        w.indent()
        w("h = kvh * rep + hh", f"qo = h * {E}")
        w("for i0 in range(j0, Tn, 64):")
        w.indent()
        tiles = [(QS, "i0", "qo", "qkv", qsc), (DOS, "i0", "qo", "dout", "")]
        gen.stage(tiles, LOAD_CHUNK_DKV, branchless=False)
        w("if tid < 64:")
        w(f"    sm[{LS} + tid] = lse[b, h, i0 + tid] if i0 + tid < Tn else T(0.0)")
        w(f"    sm[{DD} + tid] = dsum[b, h, i0 + tid] if i0 + tid < Tn else T(0.0)")
        w("cuda.syncthreads()")
        tile_body("lb", "lp", "lc")
        w("cuda.syncthreads()")
        w.indent(-2)
    dk_scale = " * scale" if PIPELINE else ""
    if PIPELINE and STAGED_OUT:
        _store_staged(gen, [("dk", "ko", dk_scale), ("dv", "vo", "")], "dqkv", "j0")
        return w.text()
    w("r0 = j0 + 16 * wp + g", "kc = ko + 2 * t", "vc = vo + 2 * t")
    for r, (i, j) in enumerate(((0, 1), (2, 3))):
        w(f"if r0 + {8 * r} < Tn:")
        for n in range(NE):
            for col, acc, sc in (("kc", "dk", dk_scale), ("vc", "dv", "")):
                w(f"    dqkv[b, r0 + {8 * r}, {col} + {8 * n}] = {acc}{n}_{i}{sc}")
                w(f"    dqkv[b, r0 + {8 * r}, {col} + {8 * n + 1}] = {acc}{n}_{j}{sc}")
    return w.text()


def _scores(gen: _Gen, cols, s: tuple[str, int], p: tuple[str, int], bn: str,
            rows_are_queries: bool) -> None:  # fmt: skip
    """The backward's two products of a tile pair over column blocks cols: s = A B^T and
    p = A B^T from (A fragments, B's shared region) s and p, B's lane offset bn; s masked
    on the diagonal tile (j0 == i0)."""
    for name, (a, region) in (("s", s), ("p", p)):
        gen.zero(name, cols)
        gen.product_nt(name, a, region, cols, bn, PIPELINE)
    gen.w("if j0 == i0:")
    gen.w.indent()
    gen.mask("s", cols, rows_are_queries=rows_are_queries)
    gen.w.indent(-1)


def _prep_units(gen: _Gen, head: str) -> None:
    """PREP_BLOCKS: a prep block's work, what attention.backward_prep does for the query
    heads of PREP_SPAN consecutive (batch element, kv head) pairs: dsum = rowsum(dO O) and
    dQ zeroed, 64-row units (head, query tile) in the order of the heaviest dkv blocks'
    loop. Each unit's dO and O come by cp.async into one of PREP_STAGES buffers, two units
    ahead of its sums, and each thread reads back only its own copies (no barrier for the
    buffers). A unit ends in a barrier; thread 0 raises the units' flags (flags.py) every
    PREP_FLAG_EVERY units. Thread tid takes 16-byte chunk tid % (E / 4) of rows
    tid // (E / 4) + 512 / E c. The pairs' batch elements and heads are worked out once
    and picked per unit; dO, O (one shape) and dQ's zeros go by flat indices."""
    w, E = gen.w, gen.E
    lanes, span = E // 4, PREP_SPAN
    step, unit = THREADS // lanes, 2 * TILE * E  # rows a chunk apart; floats a buffer
    w(f"if {head} % {span}:", "    return  # served by the block before")
    w(f"pr = tid // {lanes}", f"pc = 4 * (tid % {lanes})", "z = T(0.0)")
    w(f"pa = uint64(pr * {E} + pc)  # this thread's first chunk in a buffer")
    w(f"ns = min({span}, B * G - {head})  # pairs served", "nu = ns * rep * nt  # units")
    w(
        f"rs = {step} * H * {E}  # dO's and O's flat step a chunk",
        f"zs = {step} * (H + 2 * G) * {E}",
    )
    for k in range(span):  # pair k's batch element and first query head
        w(f"pb{k} = ({head} + {k}) // G", f"ph{k} = (({head} + {k}) % G) * rep")

    def pick(d: str, name: str) -> str:  # pair d's value of name{k}, by selects
        expr = f"{name}{span - 1}"
        for k in reversed(range(span - 1)):
            expr = f"select({d} == {k}, {name}{k}, {expr})"
        return expr

    def fields(p: str) -> None:  # unit p's batch element, head, this thread's first row
        w(f"{p}b = {pick(p + 'd', 'pb')}", f"{p}h = {pick(p + 'd', 'ph')} + {p}hh")
        w(f"{p}r = {p}b * Tn + {p}i * 64 + pr  # row of the (B T) rows")

    def advance(p: str) -> None:  # unit p's counters to the next unit (pair, tile, head)
        w(f"{p}d += 1", f"if {p}d == ns:", f"    {p}d = 0", f"    {p}i += 1")
        w(f"if {p}i == nt:", f"    {p}i = 0", f"    {p}hh += 1")

    def issue(stage: str) -> None:  # unit q's copies into buffer stage
        fields("q")
        w(f"qo = uint64({stage} * {unit}) + pa", f"qk = (qr * H + qh) * {E} + pc")
        for c in range(E // 8):
            for k, src in enumerate(("dout", "out")):
                at = f"qo + {gen.u(k * TILE * E + c * step * E)}"
                w(f"cp_async16_flat(sm, {at}, {src}, qk + {c} * rs)")
        advance("q")

    w("qd = 0", "qi = 0", "qhh = 0  # the next unit to copy")
    issue("0")
    w("cp_async_commit()", "if nu > 1:")
    w.indent()
    issue("1")
    w.indent(-1)
    w("cp_async_commit()", "ud = 0", "ui = 0", "uhh = 0  # the unit summed", "us = 0", "qs = 2")
    if PREP_FLAG_EVERY > 1:  # units summed whose flags wait for thread 0's next fence
        w("nf = 0", *(f"p{k} = 0" for k in range(1, PREP_FLAG_EVERY)))  # their flags' indices
    w("for v in range(nu):")
    w.indent()
    w("if v + 2 < nu:")
    w.indent()
    issue("qs")
    w.indent(-1)
    w("cp_async_commit()", "cp_async_wait(2)  # unit v's copies (this thread's) landed")
    fields("u")
    w(f"uo = uint64(us * {unit}) + pa", f"uz = (ur * (H + 2 * G) + uh) * {E} + pc")
    for c in range(E // 8):
        at = [f"uo + {gen.u(k * TILE * E + c * step * E)}" for k in range(2)]
        w(
            f"d0, d1, d2, d3 = load4_shared(sm, {at[0]})",
            f"o0, o1, o2, o3 = load4_shared(sm, {at[1]})",
        )
        w(f"ps{c} = d0 * o0 + d1 * o1 + d2 * o2 + d3 * o3")
        w(f"store4_flat(dqkv, uz + {c} * zs, z, z, z, z)")
    scratch = PREP_STAGES * unit  # the simulator's group sums meet past the buffers
    assert scratch + THREADS <= _layout(E)["dkv"], "PREP_STAGES: more than dkv's shared memory"
    w(*(f"ps{c} = group_sum(ps{c}, sm[{scratch}:], z, {lanes})" for c in range(E // 8)))
    w("ut = ui * 64 + pr", "if pc == 0:")
    w(*(f"    dsum[ub, uh, ut + {c * step}] = ps{c}" for c in range(E // 8)))
    w("fu = (ub * H + uh) * nt + ui")
    w("cuda.syncthreads()  # every thread's stores before the flags' release")
    _raise_flags(gen, PREP_FLAG_EVERY)
    advance("u")
    w(
        f"us = select(us == {PREP_STAGES - 1}, 0, us + 1)",
        f"qs = select(qs == {PREP_STAGES - 1}, 0, qs + 1)",
    )
    w.indent(-1)


def _raise_flags(gen: _Gen, every: int) -> None:
    """PREP_BLOCKS: a prep block's thread 0 raises the flag of unit v (fu), and those of the
    nf units before it (p1 the last, p2, ...), after one release fence: after units 1 (a
    two-pair block's first tiles), 1 + every, 1 + 2 every, ... and the last."""
    assert every & (every - 1) == 0, "PREP_FLAG_EVERY: a power of two"
    w, prev = gen.w, [f"p{k}" for k in range(1, every)]
    if every == 1:
        w("if tid == 0:", "    flag_release()", "    flag_raise(flags, fu)")
        return
    w("if tid == 0:")
    w.indent()
    w(f"if v & {every - 1} == 1 or v + 1 == nu:", "    flag_release()")
    for k, p in enumerate(prev, 1):
        w(f"    if nf >= {k}:", f"        flag_raise(flags, {p})")
    w("    flag_raise(flags, fu)", "    nf = 0", "else:", "    nf += 1")
    shift = list(zip(prev, ["fu"] + prev[:-1], strict=True))[::-1]  # p2 = p1 before p1 = fu
    w(*(f"{a} = {b}" for a, b in shift))
    w.indent(-1)


def _next_flag(gen: _Gen, pad: str = "    ") -> None:
    """PREP_BLOCKS (thread 0 of a dkv block, statements indented by pad): fidx and fi step
    to the flag of the next tile of the loop's order (the next query tile of this head, or
    the next head's first, j0's), whose read fv starts here; the loop's top waits on it."""
    gen.w(*(pad + x for x in ("fi += 1", "wr = fi == nt", "fidx += select(wr, 1 + (j0 >> 6), 1)")))
    gen.w(*(pad + x for x in ("fi = select(wr, j0 >> 6, fi)", "fv = flag_read(flags, fidx)")))


def _atomic_dq(gen: _Gen, KK: int, DS: int, scale: str) -> None:
    """dQ += dS K for this query tile, added to dqkv with atomics (ATOMIC_DQ).

    Warp w takes queries 16w..16w+15: A = dS [query][key] read from the dS^T tile at
    sm[DS] with the keys permuted as the P V product's (k = t is key 2t, k = t + 4 key
    2t + 1; lane (g, t) reads row 2t, column g: banks 8t + g, no conflicts), B = the K
    tile at sm[KK] through lp. HALF column blocks at a time keep the accumulators few. The
    loop's next barrier keeps the next tile's dS^T stores after these reads. With LDSM_DQ
    the tile at sm[DS] is dS [query][key] and the one at sm[KK] K^T [e][key], both read
    by ldmatrix, the keys in their natural order. With _quads the tile at sm[KK] is K^T
    too, and the column blocks 2m and 2m + 1 interleave: block 2m's column c is K's column
    16m + 2c, block 2m + 1's 16m + 2c + 1. Lane (g, t) loads a block's b0, b1 (keys 2t,
    2t + 1 of a K^T row) by one 8-byte load (a half warp's banks 8g + 4h + 2t, + 1: no
    conflicts) and holds, of each of its rows, dQ's columns 16m + 4t .. 16m + 4t + 3: one
    16-byte atomic request.
    """
    w, LD, NE = gen.w, gen.LD, gen.NE
    quads = _quads(gen.E)
    w("cuda.syncthreads()  # every warp's dS^T is in shared memory")
    w("rq = i0 + 16 * wp + g", f"qc = qo + {4 if quads else 2} * t")
    flat = FLAT and ATOMIC_WIDTH > 1  # (width 4 at E = 8 adds 2 columns a request)
    if flat:  # rows rq and rq + 8 of the tile as flat indices of dqkv
        w("whole = i0 + 64 <= Tn", "dq0 = (b * Tn + rq) * dqkv.shape[2] + qc")
        w("dq8 = dq0 + 8 * dqkv.shape[2]")
    a = ["a0", "a1", "a2", "a3"]
    for n0 in range(0, NE, HALF):
        cols = range(n0, min(NE, n0 + HALF))
        gen.zero("dq", cols)
        for kk in range(8):
            if _ldsm_dq():  # A: rows of dS [query][key]; B: rows of K^T [e][key]
                w(f"a0, a1, a2, a3 = ldmatrix_x4(sm, ld + {gen.u(DS + 8 * kk)})")
                for n in cols[::2]:
                    at = KK + 8 * n * LDS + 8 * kk
                    if n + 1 in cols:
                        w(f"b0, b1, b2, b3 = ldmatrix_x4(sm, lk + {gen.u(at)})")
                        gen._mma("dq", n, a)
                        gen._mma("dq", n + 1, a, ("b2", "b3"))
                    else:  # E = 8: one column block
                        gen._load_b([f"lk8 + {gen.u(at)}", f"lk8 + {gen.u(at + 4)}"], raw=False)
                        gen._mma("dq", n, a)
                continue
            for i, off in enumerate((0, 8, LDS, LDS + 8)):
                w(f"a{i} = sm[lt + {gen.u(DS + 8 * kk * LDS + off)}]")
            if quads:  # blocks n, n + 1 from K^T's rows 8n + 2g, 8n + 2g + 1
                for n in cols[::2]:
                    for pair, row in (("b0, b1", 8 * n), ("b2, b3", 8 * n + 1)):
                        x = f"lpair + {gen.u(KK + row * LDS + 8 * kk)}"
                        # (the simulator: two loads, not a device function's costly call)
                        load = f"sm[{x}], sm[{x} + 1]" if SIMULATOR else f"load2_shared(sm, {x})"
                        w(f"{pair} = {load}")
                    gen._mma("dq", n, a)
                    gen._mma("dq", n + 1, a, ("b2", "b3"))
                continue
            for n in cols:
                off = KK + 8 * kk * LD + 8 * n
                gen._load_b([f"lp + {gen.u(off)}", f"lp + {gen.u(off + LD)}"], raw=False)
                gen._mma("dq", n, a)
        rows = list(enumerate(((0, 1), (2, 3))))  # (row half r, C values (i, j) of its row)
        pair = lambda n, i, j: f"dq{n}_{i}{scale}, dq{n}_{j}{scale}"  # noqa: E731
        quad = lambda n, i, j: (  # noqa: E731
            f"dq{n}_{i}{scale}, dq{n + 1}_{i}{scale}, dq{n}_{j}{scale}, dq{n + 1}_{j}{scale}"
        )
        # (first column block, values) of each request: blocks n, n + 1 interleaved by quads
        requests = [(n, quad) for n in cols[::2]] if quads else [(n, pair) for n in cols]
        add = "atomic_add4" if quads else "atomic_add2"
        if flat:
            w("if whole:")
            for r, (i, j) in rows:
                for n, vals in requests:
                    w(f"    {add}_flat(dqkv, dq{8 * r} + {8 * n}, {vals(n, i, j)})")
            w("else:")
            w.indent()
        for r, (i, j) in rows:
            w(f"if rq + {8 * r} < Tn:")
            if ATOMIC_WIDTH > 1:
                for n, vals in requests:
                    w(f"    {add}(dqkv, b, rq + {8 * r}, qc + {8 * n}, {vals(n, i, j)})")
                continue
            for n in cols:
                for k, c in ((i, 8 * n), (j, 8 * n + 1)):
                    w(f"    cuda.atomic.add(dqkv, (b, rq + {8 * r}, qc + {c}), dq{n}_{k}{scale})")
        if flat:
            w.indent(-1)


_BUILT: dict[tuple, tuple] = {}


HEADER = """import math

from numba import cuda, float32, uint64

from euler.gpu.branchless import fmax, select
from euler.gpu.mma import ldmatrix_x4, mma_tf32, tf32, tf32_finite
from euler.gpu.reduce import FULL_MASK"""
ASYNC_IMPORT = (
    "\nfrom euler.gpu.async_copy import cp_async4, cp_async4_flat, cp_async16, cp_async16_flat,"
    " cp_async_commit, cp_async_wait"
)
EXP_IMPORT = "\nfrom euler.gpu.approx import exp2_approx, exp_approx"
ADD_ROUND_IMPORT = "\nfrom euler.gpu.mma import tf32_operand"
VECTOR_IMPORT = (
    "\nfrom euler.gpu.vector import atomic_add2, atomic_add2_flat, atomic_add4, atomic_add4_flat,"
    " load2_shared, load4_3d, load4_shared, store4_3d"
)
PREP_IMPORT = (
    "\nfrom euler.gpu.flags import flag_raise, flag_read, flag_release"
    "\nfrom euler.gpu.reduce import group_sum"
    "\nfrom euler.gpu.vector import store4_flat"
)


def _compile(name: str, src: str):
    header = HEADER + (ASYNC_IMPORT if PIPELINE else "") + (EXP_IMPORT if FAST_EXP else "")
    header += ADD_ROUND_IMPORT if ADD_ROUND else ""
    header += VECTOR_IMPORT + (PREP_IMPORT if PREP_BLOCKS else "")
    if not MIN_BLOCKS:
        return compile_generated(name, src, header)
    # Numba's disk cache keys a kernel on its file, not its launch bounds: put them in it
    header += f"\n\n# launch_bounds ({THREADS}, {MIN_BLOCKS})"
    opts = {} if SIMULATOR else {"launch_bounds": (THREADS, MIN_BLOCKS)}  # no register cap there
    return compile_generated(name, src, header, **opts)


def knobs() -> dict:
    """The generation knobs now in force (what a variant of bench/attention_tc_gpu.py sets)."""
    return dict(PIPELINE=PIPELINE, ATOMIC_DQ=ATOMIC_DQ, ATOMIC_WIDTH=ATOMIC_WIDTH,
                SPLIT_TF32=SPLIT_TF32,
                FAST_EXP=FAST_EXP, HEAVY_FIRST=HEAVY_FIRST,
                HEAVY_FIRST_FORWARD=HEAVY_FIRST_FORWARD, ADD_ROUND=ADD_ROUND,
                WIDE=WIDE, WIDE_KEYS=WIDE_KEYS, MIN_BLOCKS=MIN_BLOCKS, ASYNC_Q=ASYNC_Q,
                STAGED_OUT=STAGED_OUT, ASYNC_KV=ASYNC_KV, FLAT=FLAT, EXP2_DKV=EXP2_DKV, LDSM=LDSM,
                LDSM_DQ=LDSM_DQ, PREP_BLOCKS=PREP_BLOCKS, PREP_SPAN=PREP_SPAN,
                PREP_FLAG_EVERY=PREP_FLAG_EVERY, PREP_READY_LOOP=PREP_READY_LOOP,
                LOAD_CHUNK=LOAD_CHUNK, LOAD_CHUNK_DKV=LOAD_CHUNK_DKV)  # fmt: skip


def sources(E: int) -> dict[str, str]:
    """The generated source of each kernel for head size E and the current knobs, by kernel
    name: forward, dq (absent with ATOMIC_DQ), dkv."""
    srcs = {
        "forward_tc_kernel": _forward_wide_source(E) if _wide() else _forward_source(E),
        "backward_dq_tc_kernel": _dq_source(E),
        "backward_dkv_tc_kernel": _dkv_source(E),
    }
    if ATOMIC_DQ:
        del srcs["backward_dq_tc_kernel"]
    return srcs


def kernels(E: int):
    """(forward, dq, dkv) dispatchers, or (forward, dkv) with ATOMIC_DQ, for head size E and
    the current knobs, generated and compiled once."""
    key = (E, *knobs().values())
    if key not in _BUILT:
        assert supports(E), f"tensor-core attention needs E in (8, 16, 32, 64), not {E}"
        assert not PREP_BLOCKS or (PIPELINE and ATOMIC_DQ and HEAVY_FIRST and ASYNC_KV)
        _BUILT[key] = tuple(_compile(n, s) for n, s in sources(E).items())
    return _BUILT[key]


def _check(qkv, H, G, E) -> tuple[int, int]:
    B, Tn, C = qkv.shape
    assert C == (H + 2 * G) * E and H % G == 0 and supports(E)
    return B, Tn


def _grid(tiles: int, heads: int, heavy_first: bool) -> tuple[int, int]:
    """A launch grid over tiles and heads, in the kernel's order (Gen.block)."""
    return (heads, tiles) if heavy_first else (tiles, heads)


def _launch(kernel, grid, stream, nbytes: int, *args) -> None:
    """Launch one of these kernels (THREADS a block) with nbytes of dynamic shared memory."""
    attention.launch_dynamic(kernel, grid, THREADS, stream, nbytes, *args)


def attention_forward(out, lse, qkv, H, G, E, stream=0) -> None:
    """out (B, T, H E), lse (B, H, T), assigned, from qkv (B, T, (H + 2G) E); float32."""
    B, Tn = _check(qkv, H, G, E)
    assert out.shape == (B, Tn, H * E) and lse.shape == (B, H, Tn)
    if PIPELINE:
        check_aligned(qkv)
    # with FAST_EXP the forward's exponentials are 2^x: log2(e) rides on Q's scale
    scale = float32((LOG2E if FAST_EXP else 1.0) / math.sqrt(E))
    fwd = kernels(E)[0]
    rows = _forward_rows()
    grid = _grid((Tn + rows - 1) // rows, B * H, HEAVY_FIRST_FORWARD)
    _launch(fwd, grid, stream, shared_bytes(E)["forward"], out, lse, qkv, H, G, scale)


def attention_backward(dqkv, dout, qkv, out, lse, H, G, E, dsum, stream=0) -> None:
    """dqkv (B, T, (H + 2G) E), assigned, from dout (B, T, H E) and the saved out and lse.

    dsum (B, H, T) is scratch for D_i = rowsum(dO * O); the kv heads' gradients sum over
    the query heads of their group. Same math as attention.attention_backward.
    """
    B, Tn = _check(qkv, H, G, E)
    assert dqkv.shape == qkv.shape and dout.shape == out.shape == (B, Tn, H * E)
    assert lse.shape == dsum.shape == (B, H, Tn)
    if PIPELINE:
        check_aligned(qkv, dout)
    scale = float32(1.0 / math.sqrt(E))
    built, nbytes = kernels(E), shared_bytes(E)
    nt = (Tn + TILE - 1) // TILE
    grid = _grid(nt, B * G, HEAVY_FIRST)
    # whole units: no two share a cache line of dsum
    fused = PREP_BLOCKS and Tn % TILE == 0 and Tn <= PREP_MAX_T
    if fused:
        check_aligned(out)
    elif ATOMIC_DQ:  # dsum, and dQ zeroed for the dkv kernel's atomic adds
        attention.backward_prep(dqkv, dsum, dout, out, H, E, stream)
    else:
        args = (dqkv, dsum, dout, qkv, out, lse, H, G, scale)
        _launch(built[1], _grid(nt, B * H, HEAVY_FIRST), stream, nbytes["dq"], *args)
    args = (dqkv, dsum, dout, qkv, lse, H, G, scale)
    if PREP_BLOCKS:  # unfused (prep = 0), the kernel reads no flag: none is zeroed
        args += (out, _flags(B * H * nt if fused else 1, stream if fused else None), int(fused))
    if fused:  # the prep blocks' row first (HEAVY_FIRST: tiles on the grid's slow axis)
        grid = (grid[0], grid[1] + 1)
    _launch(built[-1], grid, stream, nbytes["dkv"], *args)


_FLAGS: dict[int, object] = {}


def _flags(n: int, stream) -> object:
    """PREP_BLOCKS's flags, one a (b, h, query tile) unit, zeroed on stream (not at all if
    stream is None): an int32 device array kept per size (allocated on first use, before
    any graph capture of the step)."""
    if SIMULATOR:
        return cuda.to_device(np.zeros(n, np.int32))
    if n not in _FLAGS:
        _FLAGS[n] = cuda.device_array(n, np.int32)
    if stream is not None:
        device_memset(_FLAGS[n], 0, 4 * n, stream)
    return _FLAGS[n]
