"""seq2seq-attn's learning-rate schedule and the optimizers it is applied to."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from nmt.config import TrainConfig


@dataclass
class LearningRateSchedule:
    """Decay by `lr_decay` after every epoch once decay has started.

    Decay starts at epoch `start_decay_at`, or (with `decay_on_plateau`) as soon as the
    validation perplexity rises above the previous epoch's, and then never stops - exactly
    seq2seq-attn's `decay_lr`. With `warmup_steps`, update n < warmup_steps runs at n /
    warmup_steps of that rate (`rate`): large batches and Adam start without a jump. The
    warm-up is a function of the step count alone, which the checkpoint holds, so a resumed
    run continues it exactly.
    """

    learning_rate: float
    lr_decay: float
    start_decay_at: int
    decay_on_plateau: bool = True
    warmup_steps: int = 0
    decaying: bool = False
    history: list[float] = field(default_factory=list)

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> LearningRateSchedule:
        return cls(
            cfg.learning_rate,
            cfg.lr_decay,
            cfg.start_decay_at,
            cfg.decay_on_plateau,
            cfg.warmup_steps,
        )

    def rate(self, step: int) -> float:
        """The learning rate of update `step` (counted from 1): the schedule's, scaled by
        step / warmup_steps during the warm-up."""
        if step < self.warmup_steps:
            return self.learning_rate * max(step, 1) / self.warmup_steps
        return self.learning_rate

    def end_of_epoch(self, epoch: int, valid_ppl: float) -> float:
        """Record the epoch's validation perplexity and return the next learning rate."""
        self.history.append(valid_ppl)
        if epoch >= self.start_decay_at:
            self.decaying = True
        if self.decay_on_plateau and len(self.history) >= 2 and self.history[-1] > self.history[-2]:
            self.decaying = True
        if self.decaying:
            self.learning_rate *= self.lr_decay
        return self.learning_rate

    def state_dict(self) -> dict:
        return {
            "learning_rate": self.learning_rate,
            "decaying": self.decaying,
            "history": list(self.history),
        }

    def load_state_dict(self, state: dict) -> None:
        self.learning_rate = float(state["learning_rate"])
        self.decaying = bool(state["decaying"])
        self.history = [float(x) for x in state["history"]]


# devices with torch's fused SGD / Adam kernels (elsewhere, e.g. on meta, the plain ones)
FUSED_DEVICES = ("cpu", "cuda")


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """SGD or Adam, fused where torch has the kernel: one kernel for every parameter, which
    can also skip a non-finite update on the device (`nmt.train.update`)."""
    fused = all(p.device.type in FUSED_DEVICES for p in params) or None
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.learning_rate, fused=fused)
    return torch.optim.SGD(params, lr=cfg.learning_rate, fused=fused)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)`, but how it runs (fused, foreach) stays this
    optimizer's choice rather than the checkpoint's: a checkpoint written before the fused
    kernels, or on another device, would otherwise bring back an implementation that cannot
    skip an update on the device."""
    optimizer.load_state_dict(state)
    fused = optimizer.defaults.get("fused")
    for group in optimizer.param_groups:
        for key in ("fused", "foreach"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]
        for p in group["params"] if fused else []:  # fused kernels count steps on the device
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
