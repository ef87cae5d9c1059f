"""An exponential moving average of the weights (`train.ema_decay`): Polyak averaging.

Averaging checkpoints (`nmt average`) shows that the mean of a run's recent weights often
translates better than the weights themselves; a moving average taken after every update
gives that without keeping files or running another command (OpenNMT-py's `average_decay`,
fairseq's `--ema-decay`). After update n the average moves towards the weights by 1 - d,
d = min(ema_decay, (1 + n) / (10 + n)): early in training, when the weights move fast, the
average follows them closely. An update skipped on the device (a non-finite loss or gradient,
a float16 overflow) leaves the average alone too: the step's weight is zeroed there, so no
host synchronisation is needed.

The average lives in the masters' dtype (float32 under a mixed precision) on the weights'
device: one more copy of the parameters, which `nmt memreport` counts with the optimizer
state. `swap()` exchanges the average and the weights in place (tensor pointers, no copy), so
validation measures the average and training goes on from the weights.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class WeightAverage:
    """The moving average of `params` (distinct parameters: a tied weight is averaged once)."""

    def __init__(self, params: list[nn.Parameter], decay: float):
        self.params, self.decay = params, decay
        self.weights = [p.detach().clone() for p in params]
        self.updates = 0  # updates queued so far (skipped ones included): fixes each d
        # the next update's 1 - d, a device scalar written by `advance` and read by `follow`
        self.rate = torch.zeros((), dtype=self.weights[0].dtype, device=self.weights[0].device)

    def update(self, skipped: Tensor) -> None:
        """Move the average towards the weights after an optimizer step; `skipped` (a device
        scalar, nonzero when the step was skipped) zeroes the move. No host synchronisation."""
        self.advance()
        self.follow(skipped)

    def advance(self) -> None:
        """The host's part of an update: count it and write its rate into `rate`."""
        self.updates += 1
        n = self.updates
        self.rate.fill_(1.0 - min(self.decay, (1 + n) / (10 + n)))

    def follow(self, skipped: Tensor) -> None:
        """The device's part: the average moves by `rate`, or not at all when `skipped`."""
        weight = (1.0 - skipped.to(self.weights[0].dtype)) * self.rate
        # one weight tensor per parameter: a lone tensor would bind as a Python number,
        # read back from the device (a sync) and baked into the kernel
        weights = [weight] * len(self.weights)
        torch._foreach_lerp_(self.weights, [p.detach() for p in self.params], weights)

    def swap(self) -> None:
        """Exchange the average and the weights (twice: back as before)."""
        for i, p in enumerate(self.params):
            live = p.data
            p.data = self.weights[i]
            self.weights[i] = live

    def averaged_state_dict(self, model: nn.Module) -> dict[str, Tensor]:
        """`model.state_dict()` with the average in place of every averaged parameter
        (tied names point at one tensor, as in the model's own)."""
        averaged = {id(p): w for p, w in zip(self.params, self.weights, strict=True)}
        return {
            name: averaged.get(id(value), value).detach()
            for name, value in model.state_dict(keep_vars=True).items()
        }

    def state_dict(self) -> dict[str, float | int]:
        return {"decay": self.decay, "updates": self.updates}

    def load(self, averaged: dict[str, Tensor], model: nn.Module, updates: int) -> None:
        """The average as a checkpoint stored it (`averaged_state_dict`), after `updates`."""
        names = {id(p): n for n, p in model.named_parameters()}
        with torch.no_grad():
            for p, w in zip(self.params, self.weights, strict=True):
                w.copy_(averaged[names[id(p)]])
        self.updates = updates
