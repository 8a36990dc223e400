"""AdamW with decoupled weight decay and global-norm clipping, over the flat buffers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdamWConfig:
    """Optimizer hyper-parameters (the learning rate comes from the schedule each step)."""

    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1  # on weight matrices only, never on norm weights
    grad_clip: float = 1.0  # global L2 norm; 0 disables clipping


class AdamW:
    """Moments m, v live in two flat buffers shaped like the parameters."""

    def __init__(self, model, hp: AdamWConfig | None = None):
        self.model = model
        self.hp = hp or AdamWConfig()
        size = model.layout.size
        self.m = model.be.zeros((size,), model.dtype)
        self.v = model.be.zeros((size,), model.dtype)
        self.step_count = 0

    def step(self, lr: float) -> float:
        """Clip the model's gradients by global norm and update its parameters in place.

        Returns the gradient norm before clipping.
        """
        self.step_count += 1
        m = self.model
        return m.be.adamw_step(
            m.params, m.grads, self.m, self.v, self.hp, lr, self.step_count, m.layout.n_decay
        )
