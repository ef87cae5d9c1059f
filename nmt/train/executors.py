"""The two ways to compute a training step's gradients, behind one interface.

An executor fills each model parameter's `.grad` with d(summed training loss / batch
size)/d(param) and returns the summed NLL. The training loss is the NLL, or with
`train.label_smoothing` the smoothed cross-entropy of `nmt.train.loss`. The trainer never
cares which one ran.
"""

from __future__ import annotations

from typing import Protocol

from nmt.config import Config
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.model import Seq2SeqAttn
from nmt.train.loss import smoothed_loss


class Executor(Protocol):
    def forward_backward(self, batch: Batch) -> float: ...


class AutogradExecutor:
    """Plain PyTorch autograd over `Seq2SeqAttn.nll`: the reference the clones must match."""

    def __init__(self, model: Seq2SeqAttn, label_smoothing: float = 0.0):
        self.model, self.label_smoothing = model, label_smoothing

    def forward_backward(self, batch: Batch) -> float:
        if self.label_smoothing == 0:
            loss = nll = self.model.nll(batch.src, batch.tgt_in, batch.tgt_out)
        else:
            logp = self.model.log_probs(self.model(batch.src, batch.tgt_in))
            loss, nll = smoothed_loss(
                logp.flatten(0, 1), batch.tgt_out.flatten(), self.label_smoothing
            )
        (loss / batch.size).backward()
        return float(nll.detach())


def make_executor(cfg: Config, model: Seq2SeqAttn) -> Executor:
    """The executor the config asks for (`train.executor`, `train.prealloc`); the clone
    executor gets the planner's sharing plan for the model's structure."""
    if cfg.train.executor == "autograd":
        return AutogradExecutor(model, cfg.train.label_smoothing)
    plan = planner.plan(cfg.model, cfg.train.prealloc)
    device = next(model.parameters()).device
    return CloneExecutor(
        model,
        cfg.data.max_src_len,
        cfg.data.max_tgt_len,
        plan,
        device=device,
        label_smoothing=cfg.train.label_smoothing,
    )
