"""Replaying device work as CUDA graphs, or running it as it is: for training steps and
decoding steps alike (euler.training.step_graph, euler.inference.batch).

A caller splits its work into host staging (uploads into fixed buffers) and device work,
and hands each piece of device work to StepGraphs.run with a key. On a backend that can
capture (the GPU's), a key's first call runs eagerly: kernels compile, scratch buffers are
allocated. Its second call is captured into a graph, and that call and every later one
replay the graph: one launch instead of hundreds. Elsewhere (the CPU, the CUDA simulator,
`--no-cuda-graph`) every call just runs.

A replayed piece returns what its captured call returned: a handle to a fixed device
buffer (the loss, the gradient norm as DeviceScalars), which the replay refills.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from euler.backend import Backend

_WARM = object()  # a key that ran once eagerly and is captured on its next call


class StepGraphs:
    """Per-key capture and replay of device work on one backend (see the module doc)."""

    def __init__(self, backend: Backend, enabled: bool = True, log: Callable[[str], None] = print):
        self.capture = backend.capture if enabled and backend.can_capture else None
        self._graphs: dict[Hashable, object] = {}
        self.log = log

    @property
    def active(self) -> bool:
        """Whether run() captures and replays (else it runs every call eagerly)."""
        return self.capture is not None

    def run(self, key: Hashable, fn: Callable[[], object]) -> object:
        """fn() for this step: eagerly, or as the replay of its captured graph.

        The key must change whenever what fn enqueues would (other buffers, other flags):
        the trainer keys on the micro-batch's role and the model's arena version, the decoder
        on the row count.
        """
        if self.capture is None:
            return fn()
        entry = self._graphs.get(key)
        if entry is None:
            self._graphs[key] = _WARM
            return fn()
        if entry is _WARM:
            try:
                entry = self._graphs[key] = self.capture(fn)
            except Exception as e:  # noqa: BLE001 - a driver or library that cannot be captured
                self.log(f"CUDA graph capture failed ({type(e).__name__}: {e}); "
                         "launching every kernel from now on")  # fmt: skip
                self.close()
                self.capture = None
                return fn()  # nothing of the failed capture ran: the staged inputs are intact
        graph, result = entry
        graph.replay()
        return result

    def nodes(self) -> int:
        """Nodes (kernels, copies) in every captured graph together."""
        return sum(e[0].nodes for e in self._graphs.values() if e is not _WARM)

    def close(self) -> None:
        """Free the captured graphs."""
        for entry in self._graphs.values():
            if entry is not _WARM:
                entry[0].close()
        self._graphs.clear()
