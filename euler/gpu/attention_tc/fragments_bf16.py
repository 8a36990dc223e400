"""The bf16 kernels' source writer: Gen's structure with m16n8k16 bf16 fragments.

TcOptions(bf16=True) keeps the TF32 kernels' grids, tiles, warps, double buffering, prep
blocks and flags; what changes is how a tile is held and how a fragment is formed:

- Tiles are bf16 (uint16 bits) in shared memory, copied 8 elements (16 bytes) a cp.async,
  rows padded to E + 8 elements: 16-byte rows (ldmatrix's row addresses must be) whose
  stride in 16-byte units, E / 8 + 1, is odd, so the 8 rows of an ldmatrix phase fall in 8
  different bank quads. The kernel indexes them in sh, a uint16 view of the dynamic shared
  array; float32 scratch (lse, dsum, the staged float outputs, the simulator's
  reductions) in sm, a float32 view of the same bytes (floats() converts an offset).
- Every fragment of a tile is one ldmatrix.x4 of .b16: A fragments of a [row][k] tile and
  B fragments of an [n][k] tile (K for S = Q K^T, Q and dO for S^T and dP^T) as they lie,
  B fragments of a [k][n] tile (V for P V, dO and Q for dV and dK, K for dQ) by .trans.
  The TF32 kernels' rounding of each operand as it loads goes: the stored bf16 are the
  operands, exactly what the CPU emulation reads.
- The softmax scale goes on the scores (an FFMA into the exponent's argument), not on Q or
  K, which would round the scaled value to bf16 a second time.
- P and dS leave the C fragments as packed pairs (pack_bf16x2: round to nearest even), two
  8-key blocks a k16 step, in mma.py's order; no key permutation is needed.

The fragment layout is mma.py's (m16n8k16); register tiles are named as Gen's, with P's
packed A fragments c{n}w0 (rows g: c0, c1) and c{n}w1 (rows g + 8: c2, c3).
"""

from __future__ import annotations

from euler.gpu.attention_tc.fragments import TILE, Gen
from euler.gpu.attention_tc.options import TcOptions

BF16_HEAD_SIZES = (16, 32, 64)  # a k16 step of Q K^T: E a multiple of 16
LDS_BF16 = TILE + 8  # the dS^T tile's row (bf16), 9 x 16 bytes: ldmatrix free of conflicts


def pitch(E: int) -> int:
    """Elements (bf16) of a padded tile row: E + 8."""
    return E + 8


def buffers_bf16(E: int) -> dict[str, int]:
    """bf16 elements of one buffer of each kernel's loop tiles: K, V (forward); Q, dO and
    the 64 rows' lse and dsum (dkv, as 2 x 64 floats)."""
    tiles = 2 * TILE * pitch(E)
    return {"forward": tiles, "dkv": tiles + 2 * 2 * TILE}


def layout_bf16(E: int) -> dict[str, int]:
    """Floats of shared memory of each kernel (layout's counterpart): two buffers; dkv adds
    its K tile (kept as stored: dQ's B fragments come by ldmatrix.trans), the bf16 dS^T
    tile and the prepared-pair slot."""
    sizes = dict(buffers_bf16(E))  # two buffers of v bf16 are v floats
    sizes["dkv"] += TILE * pitch(E) // 2 + TILE * LDS_BF16 // 2 + 4
    return sizes


class Bf16Gen(Gen):
    """Source writer of the bf16 kernels (TcOptions.bf16): tile offsets in bf16 elements.

    Lane bases, one per ldmatrix pattern (lane l gives row l % 8 of matrix l // 8; m = l // 8):
    (x8 = l % 8, xm = m & 1, xn = m >> 1)
    la: this warp's A fragments of a [row][k] tile (m & 1: rows + 8, m >> 1: k + 8);
    lm (bm in the current buffer): B of an [n][k] tile, blocks n and n + 1 (m & 1: k + 8,
    m >> 1: the next 8 rows); lk (bk): B of a [k][n] tile by .trans, blocks n, n + 1
    (m & 1: k + 8, m >> 1: columns + 8).
    """

    MMA = "mma_bf16"
    COPY = "cp_async16_bf16"
    TILES = "sh"
    VEC = 8

    def __init__(self, options: TcOptions, scale: str):
        super().__init__(options)
        self.LD = pitch(self.E)
        self.layout, self.buffers = layout_bf16(self.E), buffers_bf16(self.E)
        self.scale = f" * {scale}"

    def floats(self, offset: str) -> str:
        """The float32 index into sm of a bf16 offset (a multiple of 2)."""
        return f"{offset} // uint64(2)"

    def rnd(self, expr: str, finite: bool = False) -> str:
        """expr itself: values become bf16 operands when operands() packs them."""
        return expr

    def operands(self, c: str, cols) -> None:
        """Pack C fragments c{n}_{i} into bf16 pairs c{n}w0 (row g), c{n}w1 (row g + 8)."""
        for n in cols:
            self.w(f"{c}{n}w0 = pack_bf16x2({c}{n}_0, {c}{n}_1)")
            self.w(f"{c}{n}w1 = pack_bf16x2({c}{n}_2, {c}{n}_3)")

    def buffer_bases(self) -> tuple[str, ...]:
        return ("bm = lm + cur", "bk = lk + cur  # this tile's buffer")

    def prologue(self, name: str, args: str, doc: str) -> None:
        """The signature, the two views of the dynamic shared array, the lane's ldmatrix
        bases and its copy offsets (8 bf16 a copy)."""
        w, LD = self.w, self.LD
        w(f"def {name}({args}):")
        w.indent()
        w(f'"""{doc}"""')
        w("B, Tn, _ = qkv.shape", "T = float32")
        if self.simulator:
            w("sm = cuda.shared.array(0, float32)", "sh = cuda.shared.array(0, uint16)")
        else:  # dynamic shared arrays all start at the same address: two views of it
            w("sm = cuda.shared.array(0, float32, alignment=16)")
            w("sh = cuda.shared.array(0, uint16, alignment=16)")
        w("tid = cuda.threadIdx.x", "wp = tid // 32", "g = (tid % 32) // 4", "t = tid % 4")
        w("x8 = tid & 7", "xm = (tid >> 3) & 1", "xn = (tid >> 4) & 1  # ldmatrix: row, matrix")
        w(f"la = uint64((16 * wp + x8 + 8 * xm) * {LD} + 8 * xn)  # A fragments of this warp")
        w(f"lm = uint64((x8 + 8 * xn) * {LD} + 8 * xm)  # B of a [n][k] tile")
        w(f"lk = uint64((x8 + 8 * xm) * {LD} + 8 * xn)  # B of a [k][n] tile, .trans")
        w("dg = 2 * t - 16 * wp - g  # column minus row of c0, less the fragment's offsets")
        q = self.E // 8
        w(
            f"ra = tid // {q}",
            f"cc = 8 * (tid % {q})  # cp.async: columns cc..cc+7 of rows ra + ...",
        )
        w(f"ca = uint64(ra * {LD} + cc)")

    def load_a(self, name: str, region: int, raw: str) -> None:
        """name{kk}_{i}: this warp's A fragments (bf16 pairs) of the [row][e] tile at
        sh[region], k16 step kk; raw (TF32's factor on the values) has no place here: the
        scale goes on the scores (self.scale)."""
        for kk in range(self.E // 16):
            names = ", ".join(f"{name}{kk}_{i}" for i in range(4))
            self.w(f"{names} = ldmatrix_x4_b16(sh, la + {self.u(region + 16 * kk)})")

    def product_nt(self, acc: str, a: str, region: int, cols) -> None:
        """acc{n} += A B^T over k < E: A in fragments a{kk}_{i}, B the [n][k] tile at region
        of the current buffer, two column blocks an ldmatrix (cols come in pairs)."""
        LD, cols = self.LD, list(cols)
        for kk in range(self.E // 16):
            for n in cols[::2]:
                at = f"bm + {self.u(region + 8 * n * LD + 16 * kk)}"
                self.w(f"b0, b1, b2, b3 = ldmatrix_x4_b16(sh, {at})")
                for m, b in ((n, ("b0", "b1")), (n + 1, ("b2", "b3"))):
                    self.mma(acc, m, [f"{a}{kk}_{i}" for i in range(4)], b)

    def product_nn(self, acc: str, p: str, region: int, ks) -> None:
        """acc{n} += P B over the keys of packed C fragments p{kk}w (kk in ks, in pairs: a
        k16 step), B the [k][n] tile at region of the current buffer, by .trans."""
        LD, ks = self.LD, list(ks)
        for kk in ks[::2]:
            a = [f"{p}{kk}w0", f"{p}{kk}w1", f"{p}{kk + 1}w0", f"{p}{kk + 1}w1"]
            for n in range(0, self.NE, 2):
                at = f"bk + {self.u(region + 8 * kk * LD + 8 * n)}"
                self.w(f"b0, b1, b2, b3 = ldmatrix_x4_trans_b16(sh, {at})")
                self.mma(acc, n, a)
                self.mma(acc, n + 1, a, ("b2", "b3"))

    def store_staged(
        self, tiles: list[tuple[str, str, str]], dst: str, row0: str, base: str = "cur"
    ) -> None:
        """Gen.store_staged: float32 tiles (dst dqkv) through the free buffer's floats one
        at a time (it holds one at E + 4 floats a row, not two), a warp barrier between;
        a bf16 dst (out) packed in pairs, 8 columns (16 bytes) a lane's store."""
        w = self.w
        if dst == "dqkv":
            w(f"cf = {self.floats(base)}")
            for k, tile in enumerate(tiles):
                if k:  # the warp's reads of the last tile before its rows are overwritten
                    w("cuda.syncthreads()" if self.simulator else "cuda.syncwarp()")
                super().store_staged([tile], dst, row0, "cf")
            return
        E, LD = self.E, self.LD
        (acc, col, suffix), = tiles  # fmt: skip
        w(f"so = {base} + uint64((16 * wp + g) * {LD} + 2 * t)")
        for r, (i, j) in enumerate(((0, 1), (2, 3))):
            for n in range(self.NE):
                x, y = (f"{acc}{n}_{v}{suffix.format(r=r)}" for v in (i, j))
                at = f"so + {self.u(8 * r * LD + 8 * n)}"
                w(f"store_word_shared(sh, {at}, pack_bf16x2({x}, {y}))")
        w("cuda.syncthreads()" if self.simulator else "cuda.syncwarp()")
        cr = E // 8  # 16-byte chunks of a row
        w(f"lr = (tid % 32) // {cr}", f"lc = 8 * ((tid % 32) % {cr})  # a lane's row, column")
        w(f"sr = {base} + uint64((16 * wp + lr) * {LD} + lc)")
        for it in range(16 * cr // 32):
            row = f"{row0} + 16 * wp + lr + {it * (32 // cr)}"
            w(f"x0, x1, x2, x3 = load_words4_shared(sh, sr + {self.u(it * (32 // cr) * LD)})")
            w(
                f"if {row} < Tn:",
                f"    store_words4_3d({dst}, b, {row}, {col} + lc, x0, x1, x2, x3)",
            )


def make_gen(options: TcOptions, scale: str = "scale") -> Gen:
    """The source writer of options: Bf16Gen (the scores' scale factor named scale) if
    options.bf16, else Gen."""
    return Bf16Gen(options, scale) if options.bf16 else Gen(options)
