"""The update that follows the gradients, decided on the device: no host synchronisation.

A non-finite loss or gradient norm must skip the update (and count towards
`train.max_bad_steps`), but asking "was it finite?" on the host every step makes the host wait
for the device to drain its queue, which on a GPU leaves it idle between steps. So here the
decision stays on the device: the gradient norm is computed and clipped there, the finite flag
is a tensor, and the fused optimizers (`torch.optim.SGD` / `Adam` with `fused=True`, the
kernels `GradScaler` drives) skip their whole update - parameters, moments, Adam's step count -
where their `found_inf` tensor is set. An optimizer without that kernel reads the flag back
instead (one synchronisation a step).

The moving average of the weights (`train.ema_decay`) follows each applied update, on the
device too. The loss, the target tokens and the skip counts of the applied updates
accumulate in one device tensor; `drain()` reads it back in one synchronisation when the
trainer needs the figures.

What changes from step to step on the host - the batch's target tokens, the moving
average's rate - reaches the device in `load`, as values written into device scalars that
`step` reads: `step` itself bakes no host value into any kernel, so a CUDA graph of it
replays correctly for every batch (`nmt.train.step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.train.moving_average import WeightAverage
from nmt.train.scaling import LossScale

LOSS, TOKENS, SKIPPED, RUN, WORST, OVERFLOWS, LAST = range(7)


@dataclass(frozen=True)
class Drained:
    """What the steps since the previous `drain` did."""

    loss: float  # summed NLL of the applied updates
    tokens: int  # their non-PAD target tokens
    skipped: int  # updates skipped for a non-finite loss or gradient norm
    bad_run: int  # consecutive skipped updates up to now (0: the last update was applied)
    worst_run: int  # the longest run of consecutive skips since the previous drain
    overflows: int = 0  # of the skipped: float16 gradients overflowed (loss finite), no
    # divergence - the loss scale backs off - and not counted in bad_run / worst_run
    last_skipped: bool = False  # the latest update was skipped


class DeviceUpdate:
    """Clip, step (or skip) and count, all on the parameters' device."""

    def __init__(
        self,
        params: list[nn.Parameter],
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        loss_scale: LossScale | None = None,
        average: WeightAverage | None = None,
    ):
        self.params, self.optimizer, self.max_norm = params, optimizer, max_norm
        self.loss_scale, self.average = loss_scale, average
        device = params[0].device
        self.stats = torch.zeros(7, dtype=torch.float64, device=device)
        self.found_inf = torch.zeros((), dtype=torch.float32, device=device)
        # the batch's non-PAD target tokens, written by `load` (a float64 count: exact)
        self.tokens = torch.zeros((), dtype=torch.float64, device=device)
        self.fused = bool(optimizer.defaults.get("fused"))
        if self.fused:  # its step() reads the attribute, as under GradScaler
            optimizer.found_inf = self.found_inf  # type: ignore[attr-defined]

    def clip(self) -> Tensor:
        """The global gradient norm before clipping; gradients scaled down to `max_norm`
        (0: no clipping) in place, without reading the norm. Under a loss scale the
        gradients are unscaled first (GradScaler's `unscale_`)."""
        if self.loss_scale is not None:
            grads = [p.grad for p in self.params if p.grad is not None]
            torch._foreach_mul_(grads, self.loss_scale.inverse)
        if self.max_norm > 0:
            return nn.utils.clip_grad_norm_(self.params, self.max_norm, foreach=True)
        grads = [p.grad for p in self.params if p.grad is not None]
        return nn.utils.get_total_norm(grads, foreach=True)

    def apply(self, loss: Tensor, norm: Tensor, n_tokens: int) -> None:
        """`load(n_tokens)` then `step(loss, norm)`: one update from the host's view."""
        self.load(n_tokens)
        self.step(loss, norm)

    def load(self, n_tokens: int) -> None:
        """The host's part of the next update: the batch's target token count (a host
        integer: counting them on the device would sync) and the moving average's rate,
        written into the device scalars `step` reads."""
        self.tokens.fill_(n_tokens)
        if self.average is not None:
            self.average.advance()

    def step(self, loss: Tensor, norm: Tensor) -> None:
        """The optimizer step, skipped unless `loss` and `norm` are finite, the moving
        average and the counts; reads only device tensors (the unfused optimizers excepted:
        they have no kernel that can skip, so the flag is read back)."""
        loss_ok = torch.isfinite(loss)
        ok = loss_ok & torch.isfinite(norm)
        torch.logical_not(ok, out=self.found_inf)
        if self.fused or not self.found_inf.item():  # others have no kernel that can skip
            self.optimizer.step()
        if self.average is not None:  # follows the weights, or stays where they stayed
            self.average.follow(self.found_inf)
        s = self.stats
        # a bad step: a non-finite loss; or, without a loss scale, a non-finite gradient norm
        bad = self.found_inf if self.loss_scale is None else torch.logical_not(loss_ok)
        s[LOSS].add_(torch.where(ok, loss, 0.0))
        s[TOKENS].add_(torch.where(ok, self.tokens, 0.0))
        s[SKIPPED].add_(self.found_inf)
        s[RUN].add_(bad).mul_(bad)  # +1 when bad, else back to 0
        torch.maximum(s[WORST], s[RUN], out=s[WORST])
        s[LAST].copy_(self.found_inf)
        if self.loss_scale is not None:
            s[OVERFLOWS].add_(loss_ok & ~ok)
            self.loss_scale.update(self.found_inf)

    def device_state(self) -> list[Tensor]:
        """Every tensor the update keeps between steps (what a CUDA graph of the step reads
        and writes in place): counts, flags, the token count, the loss scale, the average."""
        kept = [self.stats, self.found_inf, self.tokens]
        if self.loss_scale is not None:
            kept += [self.loss_scale.scale, self.loss_scale.inverse, self.loss_scale.growth_tracker]
        if self.average is not None:
            kept += [*self.average.weights, self.average.rate]
        return kept

    def drain(self) -> Drained:
        """Read the counts back (one synchronisation) and start counting afresh; a run of
        skips carries over."""
        loss, tokens, skipped, run, worst, overflows, last = self.stats.tolist()
        self.stats[:RUN].zero_()
        self.stats[OVERFLOWS].zero_()
        self.stats[WORST].copy_(self.stats[RUN])
        counts = (round(tokens), round(skipped), round(run), round(worst), round(overflows))
        return Drained(loss, *counts, last_skipped=bool(last))
