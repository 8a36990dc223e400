"""The math of every layer, written once and compiled for both targets.

Each helper is `register_jitable`, so it inlines into CPU `@njit` kernels and into
`numba.cuda` kernels alike; the CPU and GPU backends only schedule these. Helpers take
the scalar type `T` (np.float32 or np.float64) so every constant is built in the working
precision: a bare Python float literal would silently promote float32 math to float64.

Row helpers (names ending in `_row`) work on one row of contiguous memory and are the CPU
schedule's unit of work; the GPU kernels use the scalar pieces with their own reductions.
Where a row's reduction feeds every element (RMSNorm, cross-entropy), the per-element step
given that reduction is a helper of its own, called by the row helper and by the GPU's
16-byte and scalar paths alike, so each formula is written once.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

# Row reductions may be reassociated so that they vectorise (sums in a different order;
# inf and nan keep their meaning). Only the CPU schedule uses the row helpers.
ROW_FAST = {"reassoc", "contract", "nsz", "arcp"}

# ---------------------------------------------------------------- exp


@intrinsic
def _f32_from_bits_ir(typingctx, i):
    """Reinterpret an int32's bits as a float32 (a free bitcast on CPU and GPU)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


def _f32_from_bits(i):
    """_f32_from_bits_ir in compiled code; NumPy's view where kernels run as Python (the
    CUDA simulator), which cannot call an intrinsic."""
    return np.int32(i).view(np.float32)


@overload(_f32_from_bits)
def _f32_from_bits_overload(i):
    return lambda i: _f32_from_bits_ir(i)


def exp_(x):
    """exp(x) in the precision of x. On the CPU, float32 uses a branch-light polynomial
    (Cephes expf, within 2 ulp) that LLVM can vectorise, where a libm call would stop the
    loop around it from vectorising; float64 stays math.exp, so the gradient check is exact.
    On the GPU it is math.exp (libdevice's expf, also within 2 ulp) in either precision."""
    return math.exp(x)


def _expf(x):
    T = np.float32
    if x < T(-87.33654):  # below the smallest normal: 0, and exp(-inf) = 0
        return T(0.0)
    if x > T(88.37626):  # 2^n would overflow the exponent field
        return T(np.inf)
    # n = floor(z) through an int32, so that n stays a float32: math.floor returns an int64,
    # which would promote the whole polynomial to float64 (measured on the CPU: 2.1x slower
    # per element), and np.floor does not compile for the GPU
    z = x * T(1.4426950408889634) + T(0.5)
    n = T(np.int32(z))  # truncates toward zero; |z| < 130 here
    if n > z:
        n -= T(1.0)
    r = x - n * T(0.693359375) - n * T(-2.12194440e-4)  # Cody-Waite split of n ln 2
    p = T(1.9875691500e-4)
    p = p * r + T(1.3981999507e-3)
    p = p * r + T(8.3334519073e-3)
    p = p * r + T(4.1665795894e-2)
    p = p * r + T(1.6666665459e-1)
    p = p * r + T(5.0000001201e-1)
    y = p * r * r + r + T(1.0)
    return y * _f32_from_bits((np.int32(n) + np.int32(127)) << np.int32(23))


@overload(exp_)
def _exp_overload(x):
    if isinstance(x, types.Float) and x.bitwidth == 32:
        return _expf
    return lambda x: math.exp(x)


@overload(exp_, target="cuda")
def _exp_overload_cuda(x):
    # a GPU thread has no loop to vectorise, and the polynomial's range branches keep NVVM
    # from unrolling the row loops around it: on the H200 the fused cross-entropy at
    # (16384, 4096) took 0.59-0.62 ms with libdevice's expf, 0.65-0.67 with the polynomial;
    # SwiGLU's 16-byte forward at (16384, 2048) 0.130 against 0.139 (its backward 0.195 both)
    return lambda x: math.exp(x)


# ---------------------------------------------------------------- row max


@intrinsic
def _maxnum(typingctx, a, b):
    """IEEE maxNum of two floats of one type (a NaN operand yields the other) as LLVM's
    llvm.maxnum: a loop of these vectorises into a max reduction, where Python's max or a
    compare and select stays scalar (measured on the 2-core machine, AVX-512, a 16384-float
    row: 0.55 -> 0.07 ns an element). The CPU's row helpers only."""
    if not (isinstance(a, types.Float) and a == b):
        return None
    sig = a(a, b)

    def codegen(context, builder, signature, args):
        t = args[0].type
        fn = builder.module.declare_intrinsic("llvm.maxnum", [t], ir.FunctionType(t, [t, t]))
        return builder.call(fn, args)

    return sig, codegen


@register_jitable
def max_row(row, n):
    """The largest of row[:n], n >= 1 (NaNs skipped unless all are NaN): a softmax's shift."""
    m = row[0]
    for j in range(1, n):
        m = _maxnum(m, row[j])
    return m


# ---------------------------------------------------------------- bfloat16


@intrinsic
def _bits_from_f32_ir(typingctx, x):
    """Reinterpret a float32's bits as an int32 (a free bitcast on CPU and GPU)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return sig, codegen


def _bits_from_f32(x):
    """_bits_from_f32_ir in compiled code; NumPy's view in pure Python (the simulator)."""
    return np.float32(x).view(np.int32)


@overload(_bits_from_f32)
def _bits_from_f32_overload(x):
    return lambda x: _bits_from_f32_ir(x)


@register_jitable
def bf16_round(x):
    """float32 x -> its bf16 bits (uint16), round to nearest even; every NaN -> 0x7FC0.

    Integer shifts on the float's bits: on sm_90 these compile to fewer instructions than
    numba.cuda.bf16's conversions and to no calls (bench/labs/bf16_convert_ptx.py);
    euler.precision.to_bf16 is the same rounding in NumPy."""
    if x != x:
        return np.uint16(0x7FC0)
    u = np.uint32(_bits_from_f32(np.float32(x)))
    half = np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    # Numba widens uint32 sums to 64 bits; below NaN's bit patterns u + half < 2^32, so
    # narrowing the sum first is exact and keeps the add and shift 32-bit
    return np.uint16(np.uint32(u + half) >> np.uint32(16))


@register_jitable
def bf16_widen(b):
    """bf16 bits b (uint16) -> the float32 of the same value, exactly (a shift)."""
    return _f32_from_bits(np.int32(np.uint32(b) << np.uint32(16)))


# ---------------------------------------------------------------- residual


@register_jitable
def residual_add(a, b):
    """out = a + b of one element; the backward is the identity (folded into RMSNorm's)."""
    return a + b


# ---------------------------------------------------------------- RMSNorm


@register_jitable
def rms_rstd(sumsq, n, eps, T):
    """1 / sqrt(mean(x^2) + eps) from the row's sum of squares (n elements)."""
    return T(1.0) / math.sqrt(sumsq / T(n) + eps)


@register_jitable
def rmsnorm_forward_element(x, r, w):
    """y = x * rstd * w of one element, given its row's rstd r."""
    return x * r * w


@register_jitable
def rmsnorm_backward_coefficient(dot, r, n, T):
    """c = dot r^2 / n, the row's weight of x in dx, from dot = sum_j dy_j w_j x_j (n terms)."""
    return dot * r * r / T(n)


@register_jitable
def rmsnorm_backward_element(dy, x, w, dres, r, c):
    """(dx, dw term) of one element, given its row's rstd r and coefficient c:
    dx = dres + r (dy w - x c), the dw term dy x r (summed over rows by the caller)."""
    return dres + r * (dy * w - x * c), dy * x * r


@register_jitable(fastmath=ROW_FAST)
def rmsnorm_forward_row(y, x, w, eps, T):
    """y = x * rstd * w for one row (D,); returns rstd (saved for the backward pass)."""
    n = x.shape[0]
    s = T(0.0)
    for i in range(n):
        s += x[i] * x[i]
    r = rms_rstd(s, n, eps, T)
    for i in range(n):
        y[i] = rmsnorm_forward_element(x[i], r, w[i])
    return r


@register_jitable(fastmath=ROW_FAST)
def rmsnorm_backward_row(dx, dw, dy, dres, x, w, r, T):
    """One row (D,): dx = dres + d/dx, assigned; dw += dy * x * r, accumulated.

    With xhat = x r: dx_i = r (dy_i w_i - xhat_i mean_j(dy_j w_j xhat_j)).
    """
    n = x.shape[0]
    dot = T(0.0)
    for i in range(n):
        dot += dy[i] * w[i] * x[i]
    c = rmsnorm_backward_coefficient(dot, r, n, T)
    for i in range(n):
        dxi, dwi = rmsnorm_backward_element(dy[i], x[i], w[i], dres[i], r, c)
        dw[i] += dwi
        dx[i] = dxi


# ---------------------------------------------------------------- RoPE


@register_jitable
def rope_rotate(x1, x2, c, s):
    """Rotate the pair (x1, x2) by the angle with cosine c and sine s."""
    return x1 * c - x2 * s, x2 * c + x1 * s


@register_jitable
def rope_row(x, cos, sin, sign):
    """Rotate one head vector (E,) in place, Hugging Face "rotate halves" pairing (i, i + E/2).

    sign = +1 is the forward rotation; sign = -1 rotates back, which is the backward pass
    (the rotation is orthogonal, so its transpose is its inverse).
    """
    half = x.shape[0] // 2
    for i in range(half):
        a, b = rope_rotate(x[i], x[i + half], cos[i], sign * sin[i])
        x[i] = a
        x[i + half] = b


# ---------------------------------------------------------------- SwiGLU


@register_jitable
def silu(g, T):
    """g * sigmoid(g)."""
    return g / (T(1.0) + exp_(-g))


@register_jitable
def swiglu_forward_scalar(g, u, T):
    """h = silu(g) * u."""
    return silu(g, T) * u


@register_jitable
def swiglu_backward_scalar(g, u, dh, T):
    """(dg, du) for h = silu(g) * u; silu'(g) = sig(g) (1 + g (1 - sig(g)))."""
    sig = T(1.0) / (T(1.0) + exp_(-g))
    dg = dh * u * sig * (T(1.0) + g * (T(1.0) - sig))
    du = dh * g * sig
    return dg, du


# ---------------------------------------------------------------- attention


@register_jitable
def online_softmax_rescale(m_old, m_new, T):
    """Factor exp(m_old - m_new) that moves a running sum from max m_old to max m_new."""
    if m_old == -math.inf:
        return T(0.0)
    return exp_(m_old - m_new)


@register_jitable
def softmax_grad(p, dp, d):
    """dS = P (dP - D): the score gradient of one softmax probability p, from dP = dO . v
    and the row's D = rowsum(dO O) (the same for every key of the row)."""
    return p * (dp - d)


# ---------------------------------------------------------------- cross-entropy


@register_jitable
def cross_entropy_loss_from_stats(m, s, logit_t):
    """-log softmax(row)[target] from the row's max m, s = sum_i exp(logit_i - m) and the
    target's logit."""
    return m - logit_t + math.log(s)


@register_jitable
def cross_entropy_grad(e, inv, scale):
    """scale * softmax of one logit from e = exp(logit - m) and inv = 1 / s; the target's
    gradient is this minus scale."""
    return e * inv * scale


@register_jitable(fastmath=ROW_FAST)
def cross_entropy_row(logits, target, scale, T):
    """Fused softmax cross-entropy for one row (V,), in place.

    Returns -log p[target]; overwrites `logits` with scale * (p - onehot(target)), the
    gradient of scale * loss. target < 0 means no target: loss 0 and zero gradient.
    """
    n = logits.shape[0]
    if target < 0:
        for i in range(n):
            logits[i] = T(0.0)
        return T(0.0)
    m = max_row(logits, n)
    logit_t = logits[target]  # read before the loop below overwrites the row
    s = T(0.0)
    for i in range(n):
        e = exp_(logits[i] - m)
        logits[i] = e
        s += e
    loss = cross_entropy_loss_from_stats(m, s, logit_t)
    inv = T(1.0) / s
    for i in range(n):
        logits[i] = cross_entropy_grad(logits[i], inv, scale)
    logits[target] -= scale
    return loss


@register_jitable(fastmath=ROW_FAST)
def logsumexp_row(logits, T):
    """log(sum(exp(logits))) of one row, shifted by its max for stability."""
    n = logits.shape[0]
    m = max_row(logits, n)
    s = T(0.0)
    for i in range(n):
        s += exp_(logits[i] - m)
    return m + math.log(s)


# ---------------------------------------------------------------- products


@register_jitable(fastmath=ROW_FAST)
def dot_row(a, b, T):
    """sum(a * b) of two rows (D,), in one fixed order for a given D: the decoding products
    compute every element of a row alone, so a row's result cannot depend on its batch."""
    s = T(0.0)
    for d in range(a.shape[0]):
        s += a[d] * b[d]
    return s


# ---------------------------------------------------------------- AdamW


@register_jitable
def adamw_scalar(p, g, m, v, lr, beta1, beta2, eps, wd, bc1, bc2, T):
    """One AdamW update of one parameter; returns (p, m, v).

    Decoupled weight decay (Loshchilov & Hutter): p -= lr * wd * p, applied beside the
    Adam step rather than folded into the gradient. bc1, bc2 are 1 - beta^t.
    """
    m = beta1 * m + (T(1.0) - beta1) * g
    v = beta2 * v + (T(1.0) - beta2) * g * g
    mhat = m / bc1
    vhat = v / bc2
    p = p - lr * (mhat / (math.sqrt(vhat) + eps) + wd * p)
    return p, m, v


@register_jitable
def clip_scale(norm: float, max_norm: float) -> float:
    """Factor that brings a gradient of L2 `norm` down to `max_norm`; 1 if already within,
    if max_norm <= 0 (no clipping) or if the norm is not finite. Host and device code."""
    if max_norm <= 0.0 or norm <= max_norm or not math.isfinite(norm):
        return 1.0
    return max_norm / (norm + 1e-6)
