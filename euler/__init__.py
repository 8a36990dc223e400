"""NanoEuler: a small Llama-style language model with hand-written Numba kernels."""

__version__ = "0.1.0"
