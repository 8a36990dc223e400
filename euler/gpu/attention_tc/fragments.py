"""The source writer of the tensor-core kernels: shared-memory layout, copies, fragments.

Every kernel runs 128 threads (4 warps) over 64-row tiles, warp w on rows 16w..16w+15.
Tiles in shared memory are row-major with rows padded to E + 4 floats, which makes every
fragment load free of bank conflicts: lane (g, t) reads row g, column t (banks 4g + t) or,
permuted, row 2t, column g (banks 8t + g). Shared-memory offsets are uint64 (numba then
emits no negative-index test per load).

Tiles come by cp.async as raw float32 into two buffers (the loop computes on one while the
next tile lands in the other), so every operand read from them is rounded to TF32 as its
fragment loads: A fragments by cvt.rna (mma.tf32), B fragments by one integer add
(mma.tf32_operand; the tensor core truncates), probabilities and score gradients by
mma.tf32_finite. A whole tile's copies go by one flat element index, stepped a row block
a copy; a tile that reaches past the sequence takes clamped 3-d indices, its missing rows
landing as zeros.

P and dS go from C fragments straight into the next product's A fragments, with no
shared-memory round trip: the 8 keys of a C fragment's column block are summed over in the
next product, and the order of a sum's terms is free, so lane (g, t) feeds its c0, c2, c1,
c3 (keys 2t, 2t, 2t + 1, 2t + 1) as a0..a3 (k = t, t, t + 4, t + 4), and the B fragment
reads key 2t as k = t and key 2t + 1 as k = t + 4 (product_nn). The products over a [n][k]
tile (product_nt) load their B fragments four at a time by ldmatrix.
"""

from __future__ import annotations

from euler.gpu.attention_tc.options import TcOptions
from euler.gpu.generated import Source

THREADS = 128  # 4 warps
TILE = 64  # rows per tile, 16 per warp
HALF = 4  # 8-column blocks per pass of the backward (32 of a tile's 64 columns)
SIM_RED = 2 * THREADS  # floats of shared scratch for the simulator's quad reductions
LDS = TILE + 4  # padded row of dkv's 64 x 64 dS^T tile (and of K^T)


def buffers(E: int) -> dict[str, int]:
    """Floats of one buffer of each kernel's loop tiles: K, V (forward); Q, dO and the 64
    rows' lse and dsum (dkv)."""
    LD = E + 4
    return {"forward": 2 * TILE * LD, "dkv": 2 * TILE * LD + 2 * TILE}


def layout(E: int) -> dict[str, int]:
    """Floats of shared memory of each kernel (the simulator's scratch starts there): two
    buffers; dkv adds its K tile (K^T from E = 16), the dS^T tile and the slot that says
    whether its pair is prepared (prep.py)."""
    sizes = {k: 2 * v for k, v in buffers(E).items()}
    sizes["dkv"] += TILE * (E + 4) + TILE * LDS + 4
    return sizes


def max_tree(names: list[str]) -> str:
    """The largest of names as a balanced tree of branchless.fmax (one FMNMX each; max() of
    floats costs a compare and a select)."""
    while len(names) > 1:
        pairs = [f"fmax({a}, {b})" for a, b in zip(names[::2], names[1::2], strict=False)]
        names = pairs + (names[-1:] if len(names) % 2 else [])
    return names[0]


class Gen:
    """Source writer for one TcOptions: the lane's offsets, copies and fragment helpers.

    A product reads its B tile at sm[base + region + constant], base the lane's fragment
    offset into the current buffer (bn for [n][k] tiles, bp for [k][n] ones, bm for
    ldmatrix rows: set once per tile by pipeline_top) or into a fixed tile (lp).

    The bf16 kernels' writer (fragments_bf16.Bf16Gen) overrides the fragment helpers and
    the hooks: scale (where the scores take the softmax scale), operands (C fragments
    packed into the next product's A fragments), floats (a float32 index from a tile
    offset).
    """

    MMA = "mma_tf32"
    COPY = "cp_async16"  # the 16-byte cp.async of tile elements
    TILES = "sm"  # the shared array the tiles are indexed in
    VEC = 4  # tile elements a 16-byte copy moves
    scale = ""  # the scores' scale factor: TF32 puts it on Q's fragments as they round

    def __init__(self, options: TcOptions):
        E = options.head_size
        self.options, self.simulator = options, options.simulator
        self.E, self.NE, self.LD = E, E // 8, E + 4
        self.layout, self.buffers = layout(E), buffers(E)
        self.w = Source()

    def floats(self, offset: str) -> str:
        """The float32 index into sm of a tile offset (the same units here)."""
        return offset

    def operands(self, c: str, cols) -> None:
        """Make C fragments c{n}_{i} (n in cols) the next product's A operands: here they
        already are (rounded as they were computed)."""

    def buffer_bases(self) -> tuple[str, ...]:
        """The statements setting the lanes' fragment bases into the current buffer."""
        return ("bn = lb + cur", "bp = lp + cur  # this tile's buffer", "bm = lm + cur")

    def u(self, n: int) -> str:
        return f"uint64({n})"

    def rnd(self, expr: str, finite: bool = False) -> str:
        """expr rounded to TF32 where it becomes an operand (by tf32_finite if finite: a
        probability or a score gradient, never inf or NaN)."""
        return f"tf32{'_finite' if finite else ''}({expr})"

    def block(self, of: str) -> str:
        """The block index over tiles (of="tile": the grid's slow axis, y) or heads (x): the
        heads of a tile are dispatched together, heaviest tiles first, so the blocks
        dispatched last, which run while others idle, are the lightest of the grid."""
        return "cuda.blockIdx." + ("y" if of == "tile" else "x")

    def prologue(self, name: str, args: str, doc: str) -> None:
        """The kernel's signature, its dynamic shared array (launch.shared_bytes) and the
        lane's fragment and copy offsets."""
        w, LD = self.w, self.LD
        w(f"def {name}({args}):")
        w.indent()
        w(f'"""{doc}"""')
        w("B, Tn, _ = qkv.shape", "T = qkv.dtype.type")
        if self.simulator:  # which takes no alignment
            w("sm = cuda.shared.array(0, float32)")
        else:  # cp.async writes 16-byte blocks: the array must start on one
            w("sm = cuda.shared.array(0, float32, alignment=16)")
        w("tid = cuda.threadIdx.x", "wp = tid // 32", "g = (tid % 32) // 4", "t = tid % 4")
        w(f"la = uint64((16 * wp + g) * {LD} + t)  # A fragments: rows of this warp")
        w(f"lb = uint64(g * {LD} + t)  # B fragments of a [n][k] tile")
        w(f"lp = uint64(2 * t * {LD} + g)  # B fragments of a [k][n] tile, keys permuted")
        # this lane's ldmatrix row: row lane % 8 (+ 8 if lane & 16), 4 words on if lane & 8
        w(f"lm = uint64(((tid & 7) + 8 * ((tid >> 4) & 1)) * {LD} + 4 * ((tid >> 3) & 1))")
        w("dg = 2 * t - 16 * wp - g  # column minus row of c0, less the fragment's offsets")
        q = self.E // 4
        w(
            f"ra = tid // {q}",
            f"cc = 4 * (tid % {q})  # cp.async: columns cc..cc+3 of rows ra + ...",
        )
        w(f"ca = uint64(ra * {LD} + cc)")

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
                copy = f"{self.COPY}({self.TILES}, {dst}, {src_at}"
                self.w(f"{copy}, select({row} < Tn, 16, 0))")

    def stage_async_flat(self, tiles: list[tuple], buf: str) -> None:
        """stage_async for tiles whose 64 rows all lie within the sequence: one flat index
        into src a tile, stepped by 512 / E rows a copy."""
        step = self.VEC * THREADS // self.E
        for region, row0, col, src in tiles:
            self.w(f"fx = (b * Tn + {row0} + ra) * {src}.shape[2] + {col} + cc")
            for k, (_, at) in enumerate(self.async_chunks(region)):
                if k:
                    self.w(f"fx += {step} * {src}.shape[2]")
                self.w(f"{self.COPY}_flat({self.TILES}, {buf} + ca + {self.u(at)}, {src}, fx)")

    def flat_or_clamped(self, whole: str, emit) -> None:
        """emit(flat) writes a tile's copies by flat indices (flat True) where the condition
        `whole` (the tile lies within the sequence) holds, by clamped ones elsewhere."""
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
        step = self.VEC * THREADS // self.E
        copies = TILE * self.E // (self.VEC * THREADS)
        return [(it * step, region + it * step * self.LD) for it in range(copies)]

    def kv_tiles(self, row0: str) -> list[tuple]:
        """The K and V tiles of rows row0.. (region, row0, col, src), at sm[0] and sm[64 LD]."""
        return [(0, row0, "ko", "qkv"), (TILE * self.LD, row0, "vo", "qkv")]

    def pipeline_top(self, more: str, buf: int, issue, landed: tuple[str, ...] = ()) -> None:
        """Start of a loop iteration: wait for this tile (the one group in flight), the
        statements `landed` (on this thread's own copies), a barrier (every thread's copies
        visible; every warp done with the other buffer), then if `more`, issue() starts the
        next tile's copies into the other buffer, nxt."""
        w = self.w
        w("cp_async_wait(0)", *landed, "cuda.syncthreads()")
        w(f"nxt = {self.u(buf)} - cur", f"if {more}:")
        w.indent()
        issue()
        w("cp_async_commit()")
        w.indent(-1)
        w(*self.buffer_bases())

    def load_a(self, name: str, region: int, raw: str) -> None:
        """name{kk}_{i}: this warp's A fragments of the [row][e] tile at sm[region], each
        value times the suffix raw ("" or " * scale") and rounded to TF32."""
        LD = self.LD
        for kk in range(self.NE):
            names = [f"{name}{kk}_{i}" for i in range(4)]
            for x, off in zip(names, (0, 8 * LD, 4, 8 * LD + 4), strict=True):
                v = f"sm[la + {self.u(region + 8 * kk + off)}]"
                self.w(f"{x} = {self.rnd(v + raw)}")

    def zero(self, acc: str, cols) -> None:
        self.w(*(f"{acc}{n}_{i} = T(0.0)" for n in cols for i in range(4)))

    def mma(self, acc: str, n: int, a: list[str], b: tuple[str, str] = ("b0", "b1")) -> None:
        """acc{n} += A B for A fragments a (names), B in b (load_b's b0, b1)."""
        c = ", ".join(f"{acc}{n}_{i}" for i in range(4))
        self.w(f"{c} = {self.MMA}({', '.join(a)}, {b[0]}, {b[1]}, {c})")

    def load_b(self, at: list[str], raw: bool) -> None:
        """b0, b1 from sm[at]; raw: a cp.async copy, rounded here (tf32_operand)."""
        for k, a in enumerate(at):
            v = f"sm[{a}]"
            self.w(f"b{k} = {f'tf32_operand({v})' if raw else v}")

    def product_nt(self, acc: str, a: str, region: int, cols) -> None:
        """acc{n} += A B^T over k < E: A in fragments a{kk}_{i}, B the [n][k] tile at region
        of the current buffer, by ldmatrix_x4 (b0, b1 of column blocks n and n + 1: cols
        come in pairs)."""
        LD, cols = self.LD, list(cols)
        for kk in range(self.NE):
            for n in cols[::2]:
                at = f"bm + {self.u(region + 8 * n * LD + 8 * kk)}"
                self.w(f"b0, b1, b2, b3 = ldmatrix_x4(sm, {at})")
                self.w(*(f"b{k} = tf32_operand(b{k})" for k in range(4)))
                for m, b in ((n, ("b0", "b1")), (n + 1, ("b2", "b3"))):
                    self.mma(acc, m, [f"{a}{kk}_{i}" for i in range(4)], b)

    def product_nn(self, acc: str, p: str, region: int, ks) -> None:
        """acc{n} += P B over the keys of C fragments p{kk} (kk in ks), B the [k][n] tile at
        region of the current buffer, with the key permutation of the module docstring."""
        LD = self.LD
        for kk in ks:
            for n in range(self.NE):
                off = region + 8 * kk * LD + 8 * n
                self.load_b([f"bp + {self.u(off)}", f"bp + {self.u(off + LD)}"], raw=True)
                self.mma(acc, n, [f"{p}{kk}_{i}" for i in (0, 2, 1, 3)])

    def mask(self, acc: str, cols, rows_are_queries: bool) -> None:
        """-inf where the key is after the query (on the diagonal tile); column minus row
        of a fragment's c0 is dg."""
        for n in cols:
            for i in range(4):
                d = 8 * n + (i & 1) - 8 * (i >> 1)  # column minus row is dg + d
                cond = f"dg > {-d}" if rows_are_queries else f"dg < {-d}"
                self.w(f"{acc}{n}_{i} = select({cond}, T(-math.inf), {acc}{n}_{i})")

    def quad(self, op: str, names: list[str], red: int) -> None:
        """Each name becomes op ("max" or "sum") over the 4 lanes of its quad (the lanes
        holding its row): by shuffles, or in the simulator, which has none, through the
        shared scratch at sm[red]."""
        w = self.w
        if self.simulator:
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

    def store_staged(
        self, tiles: list[tuple[str, str, str]], dst: str, row0: str, base: str = "cur"
    ) -> None:
        """Store this warp's 16 rows (row0 + 16 wp..) of C-fragment tiles (acc, column,
        value suffix; the value of fragment value x is x + suffix, where suffix may use r,
        the row half) to dst[b, row, column + e] through the free buffer at sm[cur]: each
        warp writes its rows there (rows padded to E + 4), then reads them back 4 columns a
        lane and stores 16 bytes at a time, whole rows a request, not 4-byte stores
        scattered two per 32-byte sector. No barrier but the warp's own: no warp reads the
        free buffer after the loop's last top barrier. base: the free buffer's float index."""
        w, E = self.w, self.E
        LD = E + 4
        per = 16 * LD  # floats of a warp's rows of one tile
        cr = E // 4  # 16-byte chunks of a row
        w(f"so = {base} + uint64((16 * wp + g) * {LD} + 2 * t)")
        for k, (acc, _, suffix) in enumerate(tiles):
            for r, (i, j) in enumerate(((0, 1), (2, 3))):
                for n in range(self.NE):
                    for c, x in ((0, i), (1, j)):
                        off = 4 * per * k + 8 * r * LD + 8 * n + c
                        w(f"sm[so + {self.u(off)}] = {acc}{n}_{x}{suffix.format(r=r)}")
        w("cuda.syncthreads()" if self.simulator else "cuda.syncwarp()")
        w(f"lr = (tid % 32) // {cr}", f"lc = 4 * ((tid % 32) % {cr})  # a lane's row, column")
        w(f"sr = {base} + uint64((16 * wp + lr) * {LD} + lc)")
        for k, (_, col, _) in enumerate(tiles):
            for it in range(16 * cr // 32):
                row = f"{row0} + 16 * wp + lr + {it * (32 // cr)}"
                at = self.u(4 * per * k + it * (32 // cr) * LD)
                w(f"x0, x1, x2, x3 = load4_shared(sm, sr + {at})")
                w(f"if {row} < Tn:", f"    store4_3d({dst}, b, {row}, {col} + lc, x0, x1, x2, x3)")
