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
        self._hyper = None  # staged by prepare()

    def prepare(self, lr: float) -> None:
        """Count the step and stage its scalars (lr and the bias corrections) on the device."""
        self.step_count += 1
        hp, t = self.hp, self.step_count
        self._hyper = self.model.be.stage_scalars(
            "adamw", [lr, 1.0 - hp.beta1**t, 1.0 - hp.beta2**t]
        )

    def apply(self):
        """Clip the gradients by global norm and update the parameters with the staged scalars.

        Device work only (a CUDA graph can capture it); returns the norm before clipping
        (a DeviceScalar on the GPU).
        """
        m = self.model
        return m.be.adamw_step(
            m.params,
            m.grads,
            self.m,
            self.v,
            self.hp,
            self._hyper,
            m.layout.n_decay,
            lowp=m.params_lp,
        )

    def step(self, lr: float):
        """prepare(lr), then apply(): one optimizer step; returns the gradient norm."""
        self.prepare(lr)
        return self.apply()
