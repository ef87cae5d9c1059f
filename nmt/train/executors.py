"""The two ways to compute a training step's gradients, behind one interface.

An executor fills each model parameter's `.grad` with d(summed NLL / batch size)/d(param)
and returns the summed NLL. The trainer never cares which one ran.
"""

from __future__ import annotations

from typing import Protocol

from nmt.config import Config
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.model import Seq2SeqAttn


class Executor(Protocol):
    def forward_backward(self, batch: Batch) -> float: ...


class AutogradExecutor:
    """Plain PyTorch autograd over `Seq2SeqAttn.nll`: the reference the clones must match."""

    def __init__(self, model: Seq2SeqAttn):
        self.model = model

    def forward_backward(self, batch: Batch) -> float:
        loss = self.model.nll(batch.src, batch.tgt_in, batch.tgt_out)
        (loss / batch.size).backward()
        return float(loss.detach())


def make_executor(cfg: Config, model: Seq2SeqAttn) -> Executor:
    """The executor the config asks for (`train.executor`, `train.prealloc`); the clone
    executor gets the planner's sharing plan for the model's structure."""
    if cfg.train.executor == "autograd":
        return AutogradExecutor(model)
    plan = planner.plan(cfg.model, cfg.train.prealloc)
    device = next(model.parameters()).device
    return CloneExecutor(model, cfg.data.max_src_len, cfg.data.max_tgt_len, plan, device=device)
