"""A training step's device work through StepGraphs (euler/graphs.py): replayed as CUDA
graphs where the backend captures, run as it is elsewhere.

The trainer splits each step into host staging (the batch, the learning rate: uploads) and
device work (forward and backward; clipping and AdamW), each piece keyed so that a change
of buffers (a new arena) or flags (accumulation) captures a new graph.
"""

from __future__ import annotations

from functools import partial

from euler.graphs import StepGraphs


def forward_backward(graphs: StepGraphs, model, accumulate: bool = False):
    """Loss of the model's staged micro-batch and its gradients (= or += into the buffer).

    Keyed by the accumulate flag and the arena version: a new arena moves every activation.
    """
    key = ("forward_backward", accumulate, model.arena_version)
    return graphs.run(key, partial(_forward_backward, model, accumulate))


def _forward_backward(model, accumulate: bool):
    loss = model.run(need_grad=True, accumulate=accumulate)
    model.backward()
    return loss


def update(graphs: StepGraphs, opt, lr: float):
    """One clipped AdamW step at learning rate lr (staged, then device work); the norm."""
    opt.prepare(lr)
    return graphs.run("update", opt.apply)
