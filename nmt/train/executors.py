"""The two ways to compute a training step's gradients, behind one interface.

An executor fills each model parameter's `.grad` with d(summed training loss / batch
size)/d(param) and returns the summed NLL. The training loss is the NLL, or with
`train.label_smoothing` the smoothed cross-entropy of `nmt.loss`. The trainer never
cares which one ran.
"""

from __future__ import annotations

import math
from typing import Protocol

from torch import Tensor

from nmt import loss
from nmt.config import Config
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.model import Seq2SeqAttn


class Executor(Protocol):
    def forward_backward(self, batch: Batch) -> float: ...


class AutogradExecutor:
    """Plain PyTorch autograd: the reference the clones must match. The output layer and
    the loss run over `loss_chunk` target positions at a time (`nmt.loss`; 0: all at once)."""

    def __init__(self, model: Seq2SeqAttn, loss_chunk: int = 1, label_smoothing: float = 0.0):
        self.model, self.loss_chunk, self.label_smoothing = model, loss_chunk, label_smoothing

    def forward_backward(self, batch: Batch) -> float:
        return float(self.step(batch))

    def step(self, batch: Batch) -> Tensor:
        """forward_backward's step, returning the summed NLL as a 0-dim tensor."""
        out = self.model(batch.src, batch.tgt_in)
        return loss.nll_backward(
            self.model, out, batch.tgt_out, self.loss_chunk, batch.size, self.label_smoothing
        )


def make_executor(cfg: Config, model: Seq2SeqAttn, world_size: int = 1) -> Executor:
    """The executor the config asks for (`train.executor`, `train.prealloc`); the clone
    executor gets the planner's sharing plan for the model's structure and allocates its
    buffers up front for this rank's share of a batch (`nmt.train.distributed.shard`)."""
    if cfg.train.executor == "autograd":
        return AutogradExecutor(model, cfg.train.loss_chunk, cfg.train.label_smoothing)
    plan = planner.plan(cfg.model, cfg.train.prealloc)
    device = next(model.parameters()).device
    rows = math.ceil(cfg.train.batch_size / world_size)
    return CloneExecutor(
        model,
        cfg.data.max_src_len,
        cfg.data.max_tgt_len,
        plan,
        device=device,
        batch_size=rows,
        label_smoothing=cfg.train.label_smoothing,
    )
