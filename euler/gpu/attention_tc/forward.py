"""The forward kernel's source: out and lse of 64 query rows of one (b, h) a block.

Warp w owns query rows i0 + 16w..16w+15, held as A fragments in registers for the whole
kernel. Q lands by cp.async in buffer 1 together with key tile 0's K and V in buffer 0; Q
is scaled (by 1/sqrt(E) log2(e)) and rounded as its fragments load. Then, per 64-key tile
j0 <= i0, while tile j0 + 64 lands in the other buffer: S = Q K^T into C fragments (lane
(g, t): rows g and g + 8, columns 2t and 2t + 1 of each 8-column block), the causal mask
on the diagonal tile, one online-softmax step on the fragments (row maxima over the 4
lanes of a quad, row sums kept per lane until the end), then O += P V. The scores are in
log2 units, so a probability is 2^(s - m), one ex2.approx (approx.exp2_approx), rounded
to TF32 as it becomes P V's A fragment. out = O / l leaves through the free buffer 16
bytes a lane (Gen.store_staged); lse = m ln 2 + ln l (natural log).

The grid is (B H, T / 64), heads on the fast axis, the longest rows (the most key tiles)
first.
"""

from __future__ import annotations

import math

from euler.gpu.attention_tc.fragments import TILE, Gen, max_tree
from euler.gpu.attention_tc.fragments_bf16 import make_gen
from euler.gpu.attention_tc.options import TcOptions


def _online_softmax(gen: Gen, s: str, o: str, cols) -> None:
    """One step of the online softmax for a warp's 16 rows over key blocks cols: the scores
    s{n}_{k} (log2 units) become TF32 probabilities, the row statistics m{r}, l{r} (r = 0
    for row g, 1 for g + 8) and the output o{n}_{k} are rescaled by 2^(m_old - m_new).

    That factor is the CPU kernel's layer_math.online_softmax_rescale, exp(m_old - m_new),
    in log2 units, and not a call of it: the helper takes an exact exp (about nine
    instructions on the GPU) in natural-log units and tests for the first step's m_old =
    -inf, where one ex2.approx (approx.exp2_approx: relative error about 2^-22, and 2^-inf =
    0) does both, as it does for each of a tile's 4,096 probabilities."""
    w, NE = gen.w, gen.NE
    rows = ((0, 1), (2, 3))  # the C fragment's values of rows g and g + 8
    for r, (i, j) in enumerate(rows):
        w(f"mx{r} = {max_tree([f'{s}{n}_{k}' for n in cols for k in (i, j)])}")
    gen.quad("max", ["mx0", "mx1"], gen.layout["forward"])
    sc = gen.scale  # on the scores here if not on Q (positive: the maximum commutes with it)
    for r, (i, j) in enumerate(rows):
        # mn is finite (a row's first step has a key at or before it), so the first step's
        # m = -inf gives al = 2^-inf = 0
        m, l = f"m{r}", f"l{r}"
        w(f"mn = max({m}, mx{r}{sc})", f"al = exp2_approx({m} - mn)")
        for n in cols:
            p = (
                f"{s}{n}_{k} = {gen.rnd(f'exp2_approx({s}{n}_{k}{sc} - mn)', finite=True)}"
                for k in (i, j)
            )
            w(*p)
        w(f"{l} = {l} * al + " + " + ".join(f"{s}{n}_{k}" for n in cols for k in (i, j)))
        w(f"{m} = mn")
        w(*(f"{o}{n}_{k} *= al" for n in range(NE) for k in (i, j)))


def _forward_out(gen: Gen, o: str) -> None:
    """Store a warp's 16 rows: out = o / l through shared memory (Gen.store_staged), lse =
    m ln 2 + ln l (m in log2 units) from lane t = 0."""
    w = gen.w
    gen.quad("sum", ["l0", "l1"], gen.layout["forward"])
    w("r0 = i0 + 16 * wp + g")
    w("inv0 = T(1.0) / l0", "inv1 = T(1.0) / l1")
    gen.store_staged([(o, "qo", " * inv{r}")], "out", "i0")
    for r in range(2):
        w(f"if r0 + {8 * r} < Tn:")
        w.indent()
        m = f"m{r} * T({math.log(2.0)!r})"
        w("if t == 0:", f"    lse[b, h, r0 + {8 * r}] = {m} + math.log(l{r})")
        w.indent(-1)


def forward_source(options: TcOptions) -> str:
    """The source of forward_tc_kernel(out, lse, qkv, H, G, scale) for options."""
    gen = make_gen(options)
    w, E, NE, LD = gen.w, gen.E, gen.NE, gen.LD
    KS, VS, BUF = 0, TILE * LD, gen.buffers["forward"]
    gen.prologue(
        "forward_tc_kernel",
        "out, lse, qkv, H, G, scale",
        f"out (B, T, H E), lse (B, H, T) from qkv; grid _grid(T / {TILE}, B H), 128 threads; "
        f"scale multiplies {'the scores' if options.bf16 else 'Q'} and carries log2(e).",
    )
    head, tile = gen.block("head"), gen.block("tile")
    w("rep = H // G", f"b = {head} // H", f"h = {head} % H")
    w(f"qo = h * {E}", f"ko = H * {E} + (h // rep) * {E}", f"vo = ko + G * {E}")
    w(f"nt = (Tn + {TILE - 1}) // {TILE}", f"i0 = (nt - 1 - {tile}) * {TILE}")
    # Q lands in buffer 1, then K, V tile 0 in buffer 0
    gen.stage_async([(0, "i0", "qo", "qkv")], gen.u(BUF))
    w("cp_async_commit()")
    gen.stage_async(gen.kv_tiles("0"), gen.u(0))
    w("cp_async_commit()")
    w("cp_async_wait(1)  # Q's copies (K, V tile 0's may still fly)")
    w("cuda.syncthreads()")
    gen.load_a("qa", BUF, raw=" * scale")
    w("m0 = T(-math.inf)", "m1 = T(-math.inf)", "l0 = T(0.0)", "l1 = T(0.0)")
    gen.zero("o", range(NE))
    w("cur = uint64(0)  # tile j0's buffer")
    w("for j0 in range(0, i0 + 64, 64):")
    w.indent()
    tiles = gen.kv_tiles("j0 + 64")
    gen.pipeline_top("j0 < i0", BUF, lambda: gen.stage_tiles(tiles, "nxt", "j0 + 128 <= Tn"))
    gen.zero("s", range(8))
    gen.product_nt("s", "qa", KS, range(8))
    w("if j0 == i0:")
    w.indent()
    gen.mask("s", range(8), rows_are_queries=True)
    w.indent(-1)
    _online_softmax(gen, "s", "o", range(8))
    gen.operands("s", range(8))
    gen.product_nn("o", "s", VS, range(8))
    w("cur = nxt")
    w.indent(-1)
    _forward_out(gen, "o")
    return w.text()
