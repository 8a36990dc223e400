"""The backward kernel's source: dK and dV of 64 key rows of one kv head a block, dQ by atomics.

A block owns key tile j0 of kv head kvh of batch element b; warp w its keys j0 + 16w..
16w+15, whose K and V are A fragments in registers for the whole kernel. One loop runs over
the (query head of the group, query tile at or after j0) pairs, so the next tile may be the
next head's first; each pair's Q, dO, lse and dsum come by cp.async into the buffer the
previous pair is not using. Per pair, in two halves of 32 queries (half the score
fragments live at once):

    S^T = K Q^T, dP^T = V dO^T             (product_nt, masked on the diagonal tile)
    P = 2^(S^T - lse log2 e), dS = P (dP - D)   (D = dsum, rowsum(dO O): prep.py)
    dV += P^T dO, dK += dS^T Q             (product_nn, P and dS as A fragments)
    dQ += dS K                             (after both halves, added to dqkv by atomics)

K and V land by cp.async with the first pair's tiles; K is multiplied by 1/sqrt(E) and
rounded in place by the thread that copied it, its A fragments carry log2(e) as well (the
scores come out in log2 units, so a probability is one ex2.approx), and each pair's lse is
multiplied by log2(e) in place, before the loop's top barrier, by the thread that copied
it. Q stays unscaled (cp.async cannot scale), so dK takes the scale as it is written. The
CPU kernel's P = exp(S scale - lse) is the same probability in natural-log units, through
an exact exp; its dS is layer_math.softmax_grad, which the generated source calls too.

dQ: dS^T is stored to shared memory ([key][query], rows padded to 68) and each warp adds dQ
= dS K for 16 queries of the tile into dqkv with float atomics, 4 adjacent columns a request
(2 at E = 8): from E = 16 the K tile is transposed in place once a block and dQ's product
reads K^T with its column blocks interleaved in pairs (_atomic_dq), so a lane holds 4
adjacent columns of each of its rows. So one dkv kernel does the work of FlashAttention-2's
dq and dkv kernels: 5 tile products per pair instead of 7; the sums' order, so the last
bits of dQ, varies from call to call.

dK and dV leave through the free buffer 16 bytes a lane (Gen.store_staged). The grid
is (B G, T / 64 + 1), kv heads on the fast axis, the key tiles with the most queries first,
the first row the prep blocks (prep.py) when the launcher passes prep = 1.

In bf16 (TcOptions.bf16, fragments_bf16.py) K stays as stored: the scores take scale and
log2(e) in the exponent's argument (sl), dQ's product reads K's B fragments by
ldmatrix.trans and takes scale as it is added (_atomic_dq_bf16), and dS^T is stored as
packed bf16 pairs.
"""

from __future__ import annotations

from euler.gpu.approx import LOG2E
from euler.gpu.attention_tc.fragments import HALF, LDS, TILE, Gen
from euler.gpu.attention_tc.fragments_bf16 import LDS_BF16, make_gen
from euler.gpu.attention_tc.options import TcOptions
from euler.gpu.attention_tc.prep import next_flag, prep_units


def _scores(gen: Gen, cols, s: tuple[str, int], p: tuple[str, int]) -> None:
    """The two products of a pair over column blocks cols: s = A B^T and p = A B^T from (A
    fragments, B's region of the current buffer) s and p; s masked on the diagonal tile
    (j0 == i0)."""
    for name, (a, region) in (("s", s), ("p", p)):
        gen.zero(name, cols)
        gen.product_nt(name, a, region, cols)
    gen.w("if j0 == i0:")
    gen.w.indent()
    gen.mask("s", cols, rows_are_queries=False)
    gen.w.indent(-1)


def _atomic_dq(gen: Gen, KK: int, DS: int) -> None:
    """dQ += dS K for this query tile, added to dqkv with atomics.

    Warp w takes queries 16w..16w+15: A = dS [query][key] read from the dS^T tile at
    sm[DS] with the keys permuted as the P V product's (k = t is key 2t, k = t + 4 key
    2t + 1; lane (g, t) reads row 2t, column g: banks 8t + g, no conflicts). HALF column
    blocks at a time keep the accumulators few. The loop's next barrier keeps the next
    tile's dS^T stores after these reads. From E = 16 the tile at sm[KK] is K^T and the
    column blocks 2m and 2m + 1 interleave: block 2m's column c is K's column 16m + 2c,
    block 2m + 1's 16m + 2c + 1. Lane (g, t) loads a block's b0, b1 (keys 2t, 2t + 1 of a
    K^T row) by one 8-byte load (a half warp's banks 8g + 4h + 2t, + 1: no conflicts) and
    holds, of each of its rows, dQ's columns 16m + 4t .. 16m + 4t + 3: one 16-byte atomic
    request. At E = 8 (one column block) B is the K tile through lp, 2 columns a request.
    A tile within the sequence adds by flat indices, a partial one by 3-d indices, rows
    past the end skipped.
    """
    w, LD, NE = gen.w, gen.LD, gen.NE
    quads = gen.E >= 16
    w("cuda.syncthreads()  # every warp's dS^T is in shared memory")
    w("rq = i0 + 16 * wp + g", f"qc = qo + {4 if quads else 2} * t")
    w("whole = i0 + 64 <= Tn", "dq0 = (b * Tn + rq) * dqkv.shape[2] + qc")
    w("dq8 = dq0 + 8 * dqkv.shape[2]")
    a = ["a0", "a1", "a2", "a3"]
    for n0 in range(0, NE, HALF):
        cols = range(n0, min(NE, n0 + HALF))
        gen.zero("dq", cols)
        for kk in range(8):
            for i, off in enumerate((0, 8, LDS, LDS + 8)):
                w(f"a{i} = sm[lt + {gen.u(DS + 8 * kk * LDS + off)}]")
            if quads:  # blocks n, n + 1 from K^T's rows 8n + 2g, 8n + 2g + 1
                for n in cols[::2]:
                    for pair, row in (("b0, b1", 8 * n), ("b2, b3", 8 * n + 1)):
                        x = f"lpair + {gen.u(KK + row * LDS + 8 * kk)}"
                        # (the simulator: two loads, not a device function's costly call)
                        load = (
                            f"sm[{x}], sm[{x} + 1]" if gen.simulator else f"load2_shared(sm, {x})"
                        )
                        w(f"{pair} = {load}")
                    gen.mma("dq", n, a)
                    gen.mma("dq", n + 1, a, ("b2", "b3"))
                continue
            for n in cols:
                off = KK + 8 * kk * LD + 8 * n
                gen.load_b([f"lp + {gen.u(off)}", f"lp + {gen.u(off + LD)}"], raw=False)
                gen.mma("dq", n, a)
        rows = list(enumerate(((0, 1), (2, 3))))  # (row half r, C values (i, j) of its row)
        pair = lambda n, i, j: f"dq{n}_{i}, dq{n}_{j}"  # noqa: E731
        quad = lambda n, i, j: f"dq{n}_{i}, dq{n + 1}_{i}, dq{n}_{j}, dq{n + 1}_{j}"  # noqa: E731
        # (first column block, values) of each request: blocks n, n + 1 interleaved by quads
        requests = [(n, quad) for n in cols[::2]] if quads else [(n, pair) for n in cols]
        add = "atomic_add4" if quads else "atomic_add2"
        w("if whole:")
        for r, (i, j) in rows:
            for n, vals in requests:
                w(f"    {add}_flat(dqkv, dq{8 * r} + {8 * n}, {vals(n, i, j)})")
        w("else:")
        w.indent()
        for r, (i, j) in rows:
            w(f"if rq + {8 * r} < Tn:")
            for n, vals in requests:
                w(f"    {add}(dqkv, b, rq + {8 * r}, qc + {8 * n}, {vals(n, i, j)})")
        w.indent(-1)


def _atomic_dq_bf16(gen: Gen, KK: int, DS: int) -> None:
    """_atomic_dq of the bf16 kernel: dQ += dS K scale for this query tile.

    Warp w takes queries 16w..16w+15: dS's A fragments come by ldmatrix.trans from the
    bf16 dS^T tile at sh[DS] (lt), K's B fragments by ldmatrix.trans from the K tile as
    stored (lk: keys are k, columns n), so no transpose of K: the bf16 B fragment is a pair
    of keys of one column, which .trans gathers from two rows, where TF32's needed K^T in
    shared memory. The price is 2 adjacent columns a lane and row (its C fragment), so 2
    columns an atomic request (TF32 interleaves column blocks over K^T for 4). HALF column
    blocks at a time; K's copies are unscaled (bf16 operands as stored), so the sums take
    scale as they are added.
    """
    w, LD, NE = gen.w, gen.LD, gen.NE
    w("cuda.syncthreads()  # every warp's dS^T is in shared memory")
    w("rq = i0 + 16 * wp + g", "qc = qo + 2 * t")
    w("whole = i0 + 64 <= Tn", "dq0 = (b * Tn + rq) * dqkv.shape[2] + qc")
    w("dq8 = dq0 + 8 * dqkv.shape[2]")
    for n0 in range(0, NE, HALF):
        cols = range(n0, min(NE, n0 + HALF))
        gen.zero("dq", cols)
        for kk in range(TILE // 16):  # k16 steps over the tile's keys
            w(f"a0, a1, a2, a3 = ldmatrix_x4_trans_b16(sh, lt + {gen.u(DS + 16 * kk * LDS_BF16)})")
            for n in cols[::2]:
                at = f"lk + {gen.u(KK + 16 * kk * LD + 8 * n)}"
                w(f"b0, b1, b2, b3 = ldmatrix_x4_trans_b16(sh, {at})")
                gen.mma("dq", n, ["a0", "a1", "a2", "a3"])
                gen.mma("dq", n + 1, ["a0", "a1", "a2", "a3"], ("b2", "b3"))
        rows = list(enumerate(((0, 1), (2, 3))))  # (row half r, C values (i, j) of its row)
        vals = lambda n, i, j: f"dq{n}_{i} * scale, dq{n}_{j} * scale"  # noqa: E731
        w("if whole:")
        for r, (i, j) in rows:
            for n in cols:
                w(f"    atomic_add2_flat(dqkv, dq{8 * r} + {8 * n}, {vals(n, i, j)})")
        w("else:")
        w.indent()
        for r, (i, j) in rows:
            w(f"if rq + {8 * r} < Tn:")
            for n in cols:
                w(f"    atomic_add2(dqkv, b, rq + {8 * r}, qc + {8 * n}, {vals(n, i, j)})")
        w.indent(-1)


def _transpose_k(gen: Gen, KK: int) -> None:
    """K^T [e][key] over the K tile at sm[KK] (from E = 16, for _atomic_dq), rows padded as
    dS^T's: a warp reads 32 keys' 16 bytes and writes rows of K^T whole, both free of bank
    conflicts."""
    w, LD = gen.w, gen.LD
    per = gen.E // 8  # 4-column chunks a thread: thread tid takes key tid % 64
    w(f"kr = uint64((tid & 63) * {LD} + (tid >> 6) * {4 * per})  # its first chunk")
    for c in range(per):
        w(f"x{c}_0, x{c}_1, x{c}_2, x{c}_3 = load4_shared(sm, kr + {gen.u(KK + 4 * c)})")
    w(
        "cuda.syncthreads()  # every warp has its K fragments and chunks",
        f"kt = uint64((tid >> 6) * {4 * per * LDS} + (tid & 63))  # K^T's rows padded as dS's",
    )
    w(*(f"sm[kt + {gen.u(KK + (4 * c + k) * LDS)}] = x{c}_{k}" for c in range(per)
        for k in range(4)))  # fmt: skip
    # dQ's B pairs: keys 2t, 2t + 1 of K^T's row 2g (and 2g + 1), _atomic_dq's
    w(f"lpair = uint64(2 * g * {LDS} + 2 * t)")


def dkv_source(options: TcOptions) -> str:
    """The source of backward_dkv_tc_kernel(dqkv, dsum, dout, qkv, lse, H, G, scale, out,
    flags, prep) for options."""
    gen = make_gen(options, "sl")
    w, E, NE, LD = gen.w, gen.E, gen.NE, gen.LD
    bf16 = options.bf16
    # tile offsets in tile elements (floats; bf16 for bf16, whose lse and dsum rows are 2 x
    # 64 of them a row of 64 floats: gen.floats makes a float index of any of these)
    f = 2 if bf16 else 1  # tile elements a float
    QS, DOS, LS, DD = 0, TILE * LD, 2 * TILE * LD, 2 * TILE * LD + f * TILE
    BUF, RED = gen.buffers["dkv"], gen.layout["dkv"]
    READY = RED - 4  # (floats) whether the block's pair is prepared (prep.py)
    lds = LDS_BF16 if bf16 else LDS
    KK, DS = f * READY - TILE * (LD + lds), f * READY - TILE * lds  # K, dS^T [key][query]
    gen.prologue(
        "backward_dkv_tc_kernel",
        "dqkv, dsum, dout, qkv, lse, H, G, scale, out, flags, prep",
        "dK, dV, dQ (atomic) parts of dqkv; grid _grid(T / 64, B G), 128 threads; rows are keys.",
    )
    head, tile = gen.block("head"), gen.block("tile")
    w("rep = H // G", f"b = {head} // G", f"kvh = {head} % G")
    w("nt = (Tn + 63) // 64", f"if {tile} < prep:")  # the grid's first row prepares
    w.indent()
    prep_units(gen, head)
    w("return")
    w.indent(-1)
    tile = f"({tile} - prep)"
    w(f"ko = H * {E} + kvh * {E}", f"vo = ko + G * {E}")
    w(f"j0 = {tile} * 64  # the first key tiles see the most queries")

    def issue_rows(i: str, h: str, buf: str, flat: bool, parts: str) -> None:
        """issue's copies, flat (the tile lies within the sequence) or clamped."""
        tiles = [(QS, i, f"{h} * {E}", "qkv"), (DOS, i, f"{h} * {E}", "dout")]
        if "tiles" in parts:
            (gen.stage_async_flat if flat else gen.stage_async)(tiles, buf)
        if flat:
            w(f"fl = (b * H + {h}) * Tn + {i} + (tid & 63)")
        rows = [r for r in ((LS, "lse", 0), (DD, "dsum", TILE)) if r[1] in parts]
        for region, src, lo in rows:  # one float per thread
            w("if tid < 64:" if lo == 0 else "else:" if len(rows) == 2 else "if tid >= 64:")
            at = f"{gen.floats(buf)} + uint64({region // f - lo} + tid)"
            if flat:
                w(f"    cp_async4_flat(sm, {at}, {src}, fl)")
                continue
            row = f"{i} + tid - {lo}"
            n = f"select({row} < Tn, 4, 0)"
            w(f"    cp_async4(sm, {at}, {src}, b, {h}, min({row}, Tn - 1), {n})")

    def issue(i: str, h: str, buf: str, parts: str = "tiles lse dsum") -> None:
        """cp.async of query tile i of head h (Q, dO, and lse, dsum: those named in parts)
        into buffer buf."""
        gen.flat_or_clamped(f"{i} + 64 <= Tn", lambda flat: issue_rows(i, h, buf, flat, parts))

    vs = BUF + DOS
    # thread 0 reads query tile 0's flag (fidx: of tile fi) and the pair's last unit's (set:
    # all its units are prepared) as K, V copy
    w("fv = 1", "fidx = 0", "fi = 0", "fa = 1")
    w("if prep and tid == 0:", "    fi = j0 >> 6", "    fidx = (b * H + kvh * rep) * nt + fi")
    w("    fv = flag_read(flags, fidx)")
    w("    fa = flag_read(flags, (b * H + kvh * rep + rep) * nt - 1)")
    # K, V land (K at KK, V in buffer 1), then query tile 0 in buffer 0
    gen.stage_async([(KK, "j0", "ko", "qkv"), (vs, "j0", "vo", "qkv")], gen.u(0))
    w("cp_async_commit()")
    issue("j0", "kvh * rep", gen.u(0), "tiles lse")
    w("cp_async_commit()")
    w("cp_async_wait(1)  # K's and V's copies (query tile 0's may still fly)")
    for _, off in [] if bf16 else gen.async_chunks(KK):  # K scaled, rounded by its copier
        at = f"ca + {gen.u(off)}"
        w(*(f"sm[{at} + {k}] = {gen.rnd(f'sm[{at} + {k}] * scale')}" for k in range(4)))
    # tile 0's unit prepared before the barrier, then its dsum; tile 1's flag
    w("if prep and tid == 0:", "    while fv == 0:", "        fv = flag_read(flags, fidx)")
    w("    if fi + 1 < nt or rep > 1:")
    next_flag(gen, " " * 8)
    w("if tid == 0:", f"    sm[uint64({READY})] = T(fa)")
    w("cuda.syncthreads()")
    issue("j0", "kvh * rep", gen.u(0), "dsum")
    w("cp_async_commit()")
    gen.load_a("ka", KK, raw=f" * T({LOG2E!r})")
    gen.load_a("va", vs, raw="")
    if bf16:  # K stays as stored: the scores take scale and log2(e) in the exponent
        w(f"sl = scale * T({LOG2E!r})")
    elif E >= 16:
        _transpose_k(gen, KK)
    gen.zero("dk", range(NE))
    gen.zero("dv", range(NE))
    w(f"lc = uint64({LS // f} + 2 * t)  # this lane's columns' lse; dsum at lc + {TILE}")
    w(f"ls = uint64((16 * wp + g) * {lds} + 2 * t)  # this lane's c0 in the dS^T tile")
    if bf16:  # dS's A fragments by ldmatrix.trans of dS^T: m & 1 queries + 8, m >> 1 keys + 8
        w(f"lt = uint64((x8 + 8 * xn) * {lds} + 8 * xm + 16 * wp)")
    else:
        w(f"lt = uint64(2 * t * {LDS} + 16 * wp + g)  # A fragments of dS, keys permuted")

    def tile_body() -> None:
        """One (head, query tile) pair: S^T and dP^T, P and dS, dV and dK; dQ's adds."""
        for half in range(8 // HALF):
            cols = range(half * HALF, (half + 1) * HALF)
            _scores(gen, cols, ("ka", QS), ("va", DOS))
            for n in cols:
                for j in range(2):  # the lane's two columns of block n
                    off = 8 * n + j
                    w(f"lq = sm[lcb + {gen.u(off)}]", f"dd = sm[lcb + {gen.u(off + TILE)}]")
                    for i in (j, j + 2):
                        w(f"s{n}_{i} = exp2_approx(s{n}_{i}{gen.scale} - lq)")
                        dsc = f"softmax_grad(s{n}_{i}, p{n}_{i}, dd)"  # the CPU kernel's dS
                        w(f"p{n}_{i} = {gen.rnd(dsc, finite=True)}")
                        if not bf16:
                            w(f"s{n}_{i} = {gen.rnd(f's{n}_{i}', finite=True)}")
            gen.operands("s", cols)
            gen.operands("p", cols)
            for n in cols:  # dS^T [key][query] for dQ
                if bf16:  # a packed pair a row: 8 stores a half, free of bank conflicts
                    for r in range(2):
                        at = f"ls + {gen.u(DS + 8 * n + 8 * LDS_BF16 * r)}"
                        w(f"store_word_shared(sh, {at}, p{n}w{r})")
                    continue
                for i in range(4):  # 2-way bank conflicts, 16 stores a half
                    off = DS + 8 * n + (i & 1) + 8 * LDS * (i >> 1)
                    w(f"sm[ls + {gen.u(off)}] = p{n}_{i}")
            gen.product_nn("dv", "s", DOS, cols)
            gen.product_nn("dk", "p", QS, cols)
        (_atomic_dq_bf16 if bf16 else _atomic_dq)(gen, KK, DS)

    def pair(waits: bool) -> None:
        """An iteration: this pair's tiles landed (lse to log2 units), the next pair's
        copies issued (after its unit's flag, if waits), the pair's work."""
        w(f"qo = h * {E}", "i1 = i0 + 64", "wrap = i1 >= Tn  # then the next head's first tile")
        w("i1 = select(wrap, j0, i1)", "h1 = h + select(wrap, 1, 0)")
        landed = (
            "if tid < 64:",
            f"    sm[{gen.floats('cur')} + uint64({LS // f} + tid)] *= T({LOG2E!r})",
        )
        if waits:  # tile it + 1's unit prepared before anyone copies it
            landed += ("if prep and tid == 0 and it + 1 < nit:", "    while fv == 0:",
                       "        fv = flag_read(flags, fidx)")  # fmt: skip
        gen.pipeline_top("it + 1 < nit", BUF, lambda: issue("i1", "h1", "nxt"), landed)
        if waits:  # tile it + 2's flag, read an iteration ahead of its wait
            w("if prep and tid == 0 and it + 2 < nit:")
            next_flag(gen)
        w(f"lcb = lc + {gen.floats('cur')}")
        tile_body()
        w("cur = nxt", "i0 = i1", "h = h1")

    w(f"nit = rep * ((Tn + 63) // 64 - {tile})  # query tiles of the group's heads")
    w("i0 = j0", "h = kvh * rep  # this iteration's query tile and head")
    w("cur = uint64(0)  # this tile's buffer")
    # all iterations wait on flags, or none (the block's pair is prepared)
    w(f"nw = select(sm[uint64({READY})] == T(0.0), nit, 0)")
    for iterations, waits in (("range(nw)", True), ("range(nw, nit)", False)):
        w(f"for it in {iterations}:")
        w.indent()
        pair(waits)
        w.indent(-1)
    gen.store_staged([("dk", "ko", " * scale"), ("dv", "vo", "")], "dqkv", "j0")
    return w.text()
