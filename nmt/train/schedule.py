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


# the dtype of a fused optimizer's learning-rate scalar: torch's CUDA kernels read a float32
# one; its CPU kernels read any as a double, so float64 keeps the configured rate exactly
LR_DTYPES = {"cpu": torch.float64, "cuda": torch.float32}


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """SGD or Adam, fused where torch has the kernel: one kernel for every parameter, which
    can also skip a non-finite update on the device (`nmt.train.update`). A fused optimizer's
    learning rate is a device scalar (`LR_DTYPES`) that `set_learning_rate` writes in place, so the
    kernel reads the current rate rather than one baked into it (a CUDA graph of the step
    replays correctly through a decay); Adam is built capturable on CUDA."""
    fused = all(p.device.type in FUSED_DEVICES for p in params) or None
    lr: float | torch.Tensor = cfg.learning_rate
    if fused:
        device = params[0].device
        lr = torch.tensor(cfg.learning_rate, dtype=LR_DTYPES[device.type], device=device)
    if cfg.optimizer == "adam":
        capturable = params[0].device.type == "cuda"
        return torch.optim.Adam(params, lr=lr, fused=fused, capturable=capturable)
    return torch.optim.SGD(params, lr=lr, fused=fused)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """`optimizer.load_state_dict(state)`, but how it runs (fused, foreach, capturable, its
    learning rate's device scalar) stays this optimizer's choice rather than the checkpoint's:
    a checkpoint written before the fused kernels, or on another device, would otherwise bring
    back an implementation that cannot skip an update on the device."""
    own_lr = [group["lr"] for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    fused = optimizer.defaults.get("fused")
    for group, lr in zip(optimizer.param_groups, own_lr, strict=True):
        for key in ("fused", "foreach", "capturable"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]
        if isinstance(lr, torch.Tensor):  # the saved rate, into this optimizer's scalar
            lr.fill_(float(group["lr"]))
            group["lr"] = lr
        for p in group["params"] if fused else []:  # fused kernels count steps on the device
            step = optimizer.state.get(p, {}).get("step")
            if isinstance(step, torch.Tensor):
                optimizer.state[p]["step"] = step.to(device=p.device, dtype=torch.float32)


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """`optimizer.state_dict()` with each learning rate a float, as a checkpoint keeps it
    (whether the rate lives in a device scalar is the optimizer's business, not the file's)."""
    state = optimizer.state_dict()
    state["param_groups"] = [{**group, "lr": float(group["lr"])} for group in state["param_groups"]]
    return state


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """The rate of every group: written into its device scalar in place, where it has one."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
