"""The dkv grid's prep blocks: dsum = rowsum(dO O) and dQ's zeros, behind flags.

The dkv kernel adds dQ with atomics, so dQ must start from zeros, and its dS = P (dP - D)
needs D = dsum. No separate kernel writes them: the dkv grid gets a first row (one block per
batch element and kv head, dispatched before every dkv block, heaviest first), whose
blocks write dsum and dQ's zeros for the query heads of their kv heads, 64-row unit by unit
in the order the heaviest dkv blocks use them, raising a flag a unit (flags.py) after a
release fence. The prep's bytes then move while the first dkv blocks compute, not before
them. A dkv block's thread 0 waits for a tile's flag before the barrier that precedes that
tile's copies, having read it an iteration ahead (next_flag). A dkv block whose pair's last
unit is flagged when it starts (all its units prepared) runs a second copy of the loop,
without the flags' code. The flags are the caller's buffer, zeroed by a memset a call
(launch.attention_backward).

The fence waits for the raising thread's copies in flight, about a unit's latency, so a
prep block raises its flags prep_flag_every units at a time. T not a multiple of 64 takes
attention.backward_prep instead (units must not share a cache line of dsum), and the dkv
kernel's prep argument is 0: no prep row, no flags read.
"""

from __future__ import annotations

from euler.gpu.attention_tc.fragments import THREADS, TILE, Gen


def prep_units(gen: Gen, head: str) -> None:
    """A prep block's work, what attention.backward_prep does for the query heads of
    prep_span consecutive (batch element, kv head) pairs: dsum = rowsum(dO O) and
    dQ zeroed, 64-row units (head, query tile) in the order of the heaviest dkv blocks'
    loop. Each unit's dO and O come by cp.async into one of prep_stages buffers, two units
    ahead of its sums, and each thread reads back only its own copies (no barrier for the
    buffers). A unit ends in a barrier; thread 0 raises the units' flags (flags.py) every
    prep_flag_every units. Thread tid takes 16-byte chunk tid % (E / 4) of rows
    tid // (E / 4) + 512 / E c. The pairs' batch elements and heads are worked out once
    and picked per unit; dO, O (one shape) and dQ's zeros go by flat indices.

    bf16 (dO and O bf16, dQ float32): the copies move 8 elements a chunk, E / 8 threads a
    row, the zeros 4 floats a chunk, E / 4 threads a row (zr, zc: rows of their own)."""
    w, E = gen.w, gen.E
    opts = gen.options
    bf16 = opts.bf16
    vec = 8 if bf16 else 4  # elements a chunk
    lanes, span, stages = E // vec, opts.prep_span, opts.prep_stages
    step, unit = THREADS // lanes, 2 * TILE * E  # rows a chunk apart; tile elements a buffer
    zl = E // 4  # zeros: threads a row
    w(f"if {head} % {span}:", "    return  # served by the block before")
    w(f"pr = tid // {lanes}", f"pc = {vec} * (tid % {lanes})", "z = T(0.0)")
    if bf16:
        w(f"zr = tid // {zl}", f"zc = 4 * (tid % {zl})  # this thread's first zero chunk")
    w(f"pa = uint64(pr * {E} + pc)  # this thread's first chunk in a buffer")
    w(f"ns = min({span}, B * G - {head})  # pairs served", "nu = ns * rep * nt  # units")
    w(
        f"rs = {step} * H * {E}  # dO's and O's flat step a chunk",
        f"zs = {THREADS // zl} * (H + 2 * G) * {E}",
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
        for c in range(TILE // step):
            for k, src in enumerate(("dout", "out")):
                at = f"qo + {gen.u(k * TILE * E + c * step * E)}"
                w(f"{gen.COPY}_flat({gen.TILES}, {at}, {src}, qk + {c} * rs)")
        advance("q")

    w("qd = 0", "qi = 0", "qhh = 0  # the next unit to copy")
    issue("0")
    w("cp_async_commit()", "if nu > 1:")
    w.indent()
    issue("1")
    w.indent(-1)
    w("cp_async_commit()", "ud = 0", "ui = 0", "uhh = 0  # the unit summed", "us = 0", "qs = 2")
    every = opts.prep_flag_every
    if every > 1:  # units summed whose flags wait for thread 0's next fence, their indices
        w("nf = 0", *(f"p{k} = 0" for k in range(1, every)))
    w("for v in range(nu):")
    w.indent()
    w("if v + 2 < nu:")
    w.indent()
    issue("qs")
    w.indent(-1)
    w("cp_async_commit()", "cp_async_wait(2)  # unit v's copies (this thread's) landed")
    fields("u")
    w(f"uo = uint64(us * {unit}) + pa")
    if bf16:
        w(f"uz = ((ur - pr + zr) * (H + 2 * G) + uh) * {E} + zc")
    else:
        w(f"uz = (ur * (H + 2 * G) + uh) * {E} + pc")
    chunks = TILE // step
    for c in range(chunks):
        at = [f"uo + {gen.u(k * TILE * E + c * step * E)}" for k in range(2)]
        if bf16:  # 8 products of bf16 pairs, widened
            w(f"d0, d1, d2, d3 = load_words4_shared(sh, {at[0]})",
              f"o0, o1, o2, o3 = load_words4_shared(sh, {at[1]})")  # fmt: skip
            terms = [f"bf16x2_{h}(d{k}) * bf16x2_{h}(o{k})" for k in range(4) for h in ("lo", "hi")]
            w(f"ps{c} = {' + '.join(terms)}")
            continue
        w(
            f"d0, d1, d2, d3 = load4_shared(sm, {at[0]})",
            f"o0, o1, o2, o3 = load4_shared(sm, {at[1]})",
        )
        w(f"ps{c} = d0 * o0 + d1 * o1 + d2 * o2 + d3 * o3")
        w(f"store4_flat(dqkv, uz + {c} * zs, z, z, z, z)")
    if bf16:
        w(*(f"store4_flat(dqkv, uz + {c} * zs, z, z, z, z)" for c in range(E // 8)))
    scratch = stages * unit // vec * 4  # floats: the simulator's group sums past the buffers
    w(*(f"ps{c} = group_sum(ps{c}, sm[{scratch}:], z, {lanes})" for c in range(chunks)))
    w("ut = ui * 64 + pr", "if pc == 0:")
    w(*(f"    dsum[ub, uh, ut + {c * step}] = ps{c}" for c in range(chunks)))
    w("fu = (ub * H + uh) * nt + ui")
    w("cuda.syncthreads()  # every thread's stores before the flags' release")
    _raise_flags(gen, every)
    advance("u")
    w(
        f"us = select(us == {stages - 1}, 0, us + 1)",
        f"qs = select(qs == {stages - 1}, 0, qs + 1)",
    )
    w.indent(-1)


def _raise_flags(gen: Gen, every: int) -> None:
    """A prep block's thread 0 raises the flag of unit v (fu), and those of the
    nf units before it (p1 the last, p2, ...), after one release fence: after units 1 (a
    two-pair block's first tiles), 1 + every, 1 + 2 every, ... and the last."""
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


def next_flag(gen: Gen, pad: str = "    ") -> None:
    """Thread 0 of a dkv block (statements indented by pad): fidx and fi step
    to the flag of the next tile of the loop's order (the next query tile of this head, or
    the next head's first, j0's), whose read fv starts here; the loop's top waits on it."""
    gen.w(*(pad + x for x in ("fi += 1", "wr = fi == nt", "fidx += select(wr, 1 + (j0 >> 6), 1)")))
    gen.w(*(pad + x for x in ("fi = select(wr, j0 >> 6, fi)", "fv = flag_read(flags, fidx)")))
