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
    seq2seq-attn's `decay_lr`.
    """

    learning_rate: float
    lr_decay: float
    start_decay_at: int
    decay_on_plateau: bool = True
    decaying: bool = False
    history: list[float] = field(default_factory=list)

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> LearningRateSchedule:
        return cls(cfg.learning_rate, cfg.lr_decay, cfg.start_decay_at, cfg.decay_on_plateau)

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


def make_optimizer(cfg: TrainConfig, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.learning_rate)
    return torch.optim.SGD(params, lr=cfg.learning_rate)


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
