"""Programmatic dependent launch (sm_90): a kernel that starts before the one ahead of it ends.

Kernels on one stream run one after another: the next one's blocks start only after the
last block of the previous one has exited and its writes are flushed, so every kernel
boundary leaves the GPU part idle (the previous kernel's last wave draining, the next
one's first wave loading). A launch with programmatic stream serialization may start as
soon as every block of the previous kernel has run `allow_dependents()` (or exited); its
blocks then do whatever does not depend on that kernel, and `wait_prior_grid()` holds them
until it has completed and its memory is visible. Without such a launch (or before sm_90)
both instructions do nothing, so a kernel that uses them runs the same either way.

    allow_dependents()     griddepcontrol.launch_dependents
    wait_prior_grid()      griddepcontrol.wait
    with programmatic():   launches in the block ask for it (LaunchConfig's
                           programmatic_stream_serialization, cuda.core)

numba-cuda builds each launch's cuda.core LaunchConfig itself, with no way to pass the
attribute, so `programmatic` swaps the LaunchConfig that numba's dispatcher module calls
for one that sets it, for the launches inside the block (one host thread launches).
`AVAILABLE` says whether the installed cuda.core knows the attribute; where it does not,
`programmatic` launches as usual. In the CUDA simulator the instructions are no-ops.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager

from numba import cuda

from euler.gpu.reduce import SIMULATOR

if not SIMULATOR:
    from llvmlite import ir
    from numba import types
    from numba.cuda import dispatcher as _dispatcher
    from numba.cuda.extending import intrinsic

    def _asm(name: str, text: str):
        def typer(typingctx):
            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.VoidType(), [])
                builder.call(ir.InlineAsm(fnty, text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return types.void(), codegen

        typer.__name__ = typer.__qualname__ = name
        return intrinsic(typer)

    allow_dependents = _asm("allow_dependents", "griddepcontrol.launch_dependents;")
    wait_prior_grid = _asm("wait_prior_grid", "griddepcontrol.wait;")

    def _supported() -> bool:
        try:
            _dispatcher.LaunchConfig(grid=1, block=1, programmatic_stream_serialization=True)
        except TypeError:  # a cuda.core without the attribute
            return False
        return True

    AVAILABLE = _supported()

else:
    _dispatcher = None
    AVAILABLE = False

    @cuda.jit(device=True)
    def allow_dependents():
        """The simulator's allow_dependents: nothing (its kernels run one at a time)."""

    @cuda.jit(device=True)
    def wait_prior_grid():
        """The simulator's wait_prior_grid: nothing."""


@contextmanager
def programmatic() -> Iterator[None]:
    """Launches made inside this block (numba dispatchers) may start before the previous
    kernel on their stream ends, where AVAILABLE; otherwise they launch as usual."""
    if not AVAILABLE:
        yield
        return
    plain = _dispatcher.LaunchConfig
    _dispatcher.LaunchConfig = functools.partial(plain, programmatic_stream_serialization=True)
    try:
        yield
    finally:
        _dispatcher.LaunchConfig = plain
