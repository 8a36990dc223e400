"""CUDA graphs: the launches of a function recorded once by stream capture, then replayed.

A training step is several hundred kernel launches and cuBLAS calls; from Python each
launch costs 40-60 us of host time. Captured into a graph, the whole sequence goes to the
GPU in one cuGraphLaunch. Capture records, it does not run: arguments are frozen at
capture time (device addresses, scalars), so what changes between replays must be read
from device memory (the model's staged tokens, targets and head scales; AdamW's learning
rate and bias corrections), and the captured code must neither allocate nor wait.

Relaxed capture mode: another thread's allocation (Numba's deferred frees, say) does not
invalidate the capture.
"""

from __future__ import annotations

from collections.abc import Callable

from numba.cuda.cudadrv.driver import binding, driver


class CapturedGraph:
    """An instantiated graph of one stream's work; replay() enqueues it on that stream."""

    def __init__(self, graph, graph_exec, stream, nodes: int):
        self._graph, self._exec, self.stream = graph, graph_exec, stream
        self.nodes = nodes

    def replay(self) -> None:
        """Enqueue the recorded work on the stream (returns without waiting)."""
        driver.cuGraphLaunch(self._exec, self.stream.handle)

    def close(self) -> None:
        """Free the graph's driver objects; replay() must not follow."""
        if self._exec is not None:
            driver.cuGraphExecDestroy(self._exec)
            driver.cuGraphDestroy(self._graph)
            self._exec = self._graph = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - at interpreter exit the driver may be gone
            pass


def capture(stream, fn: Callable[[], object]) -> tuple[CapturedGraph, object]:
    """(graph of everything fn() enqueues on stream, fn's return value); nothing runs yet.

    fn must only enqueue work on `stream` (kernels, cuBLAS bound to it, device copies) or
    on streams forked from it by an event and joined back before fn returns (the
    backend's side stream): a host wait or a copy to pageable host memory inside it fails
    the capture.
    """
    mode = binding.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    driver.cuStreamBeginCapture(stream.handle, mode)
    try:
        result = fn()
    except BaseException:
        driver.cuStreamEndCapture(stream.handle)  # leave the stream usable, drop the graph
        raise
    graph = driver.cuStreamEndCapture(stream.handle)
    _, nodes = driver.cuGraphGetNodes(graph, 0)
    graph_exec = driver.cuGraphInstantiate(graph, 0)
    return CapturedGraph(graph, graph_exec, stream, int(nodes)), result
