"""GpuOptions: everything a GpuBackend does that a run chooses, in one frozen object
(euler/gpu/backend.py schedules the layers as it says)."""

from __future__ import annotations

from dataclasses import dataclass

from euler.gpu.cublaslt import HEURISTIC_RESULTS


@dataclass(frozen=True)
class GpuOptions:
    """Everything a GpuBackend does that a run chooses, in one frozen object: GpuBackend's
    keyword arguments are its fields, settings() prints it in the training banner and saves
    it in run.json. Each default is the faster schedule where two exist; the other value
    stays so that a benchmark can time both in one run (bench/bench_gpu.py --knobs; the
    figures are in docs/measurements.md).

    tf32: matrix products on TF32 tensor cores (cuBLAS), and attention on the tensor-core
        kernels where the head size allows; False keeps every product exact fp32 (the checks
        against the CPU use it).
    tc_attention: with tf32, attention on euler/gpu/attention_tc/; False: the readable fp32
        kernels (attention.py, --exact-attention). bf16 attention always takes the former.
    overlap: matmul_deferred's products (the weight gradients) run on a second stream with
        its own cuBLAS handle, beside the main stream's work until wait_deferred(); False
        runs them in line.
    threads: caps every block size; tile (0: attention's own) sets the readable attention's
        tiles and forces it. Tests shrink both for the simulator.
    transpose_weight_grads: a weight gradient a^T b (a (K, M), b (K, N), K tokens) first
        copies its narrower operand token-contiguous (transpose.py), so that both operands
        run along K as the TF32 kernels want; cuBLAS's "NT" product reads neither
        contiguously. bf16 operands are never copied (cuBLASLt reads them as they are).
    transpose_min_width: copy only where max(M, N) is at least this (0: every weight
        gradient; the copy moves 16-byte pieces, so it pays at every width).
    fused_residual: matmul_residual (attn.wo and mlp.w_down with their residual adds) as one
        cuBLASLt call writing out = res + a b^T with C = res != D = out (cublaslt.py), which
        saves the residual kernel's second read of the product. A stand-in blas (the
        simulator's) always takes the unfused path.
    gemm_candidates: the cuBLASLt products (every bf16 one, and the fused residuals) time up
        to this many of the heuristic's algorithms on a product's first call and keep the
        fastest (cublaslt.py; 1: the heuristic's first, untimed): the heuristic's first is
        often not the fastest.
    tc_prep_span, tc_prep_stages, tc_prep_flag_every: the tensor-core backward's prep
        blocks (attention_tc.TcOptions' fields of the same names).
    """

    tf32: bool = True
    tc_attention: bool = True
    overlap: bool = True
    threads: int = 256
    tile: int = 0
    transpose_weight_grads: bool = True
    transpose_min_width: int = 0
    fused_residual: bool = True
    gemm_candidates: int = HEURISTIC_RESULTS
    tc_prep_span: int = 2
    tc_prep_stages: int = 3
    tc_prep_flag_every: int = 2

    def __post_init__(self) -> None:
        for name in ("threads", "tile", "transpose_min_width"):
            if getattr(self, name) < 0:
                raise ValueError(f"GpuOptions.{name}: at least 0, not {getattr(self, name)}")
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            raise ValueError(f"GpuOptions.threads: a multiple of 32 up to 1024, not {self.threads}")
        if not 1 <= self.gemm_candidates <= HEURISTIC_RESULTS:
            raise ValueError(
                f"GpuOptions.gemm_candidates: 1 to {HEURISTIC_RESULTS}, not {self.gemm_candidates}"
            )

    def tc_options(self, E: int, bf16: bool):
        """The tensor-core attention's TcOptions at head size E for these options."""
        from euler.gpu.attention_tc import TcOptions

        return TcOptions(E, prep_span=self.tc_prep_span, prep_stages=self.tc_prep_stages,
                         prep_flag_every=self.tc_prep_flag_every, bf16=bf16)  # fmt: skip
