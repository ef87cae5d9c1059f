"""The two ways to compute a training step's gradients, behind one interface.

An executor fills each model parameter's `.grad` with d(summed training loss / batch
size)/d(param) and returns the summed NLL as a 0-dim float64 tensor on the model's device:
reading it on the host would wait for the device, so the trainer does that only when it
logs. The training loss is the NLL, or with `train.label_smoothing` the smoothed
cross-entropy of `nmt.loss`. The trainer never cares which one ran.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Protocol

import torch
from torch import Tensor

from nmt import loss, precisions
from nmt.config import Config
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.spec import ExecutorSpec
from nmt.model import Seq2SeqAttn
from nmt.nn_rnn import KernelEncoder


class Executor(Protocol):
    def forward_backward(self, batch: Batch) -> Tensor: ...


class AutogradExecutor:
    """Plain PyTorch autograd: the reference the clones must match. The output layer and
    the loss run over `loss_chunk` target positions at a time (`nmt.loss`; 0: all at once).
    `encoder`: "cells" runs the model's own cells position by position; "kernel" runs the
    encoders on torch's RNN kernel for the cell with the same parameters (`nmt.nn_rnn`)."""

    def __init__(
        self,
        model: Seq2SeqAttn,
        loss_chunk: int = 1,
        label_smoothing: float = 0.0,
        encoder: str = "cells",
        precision: str = "float32",
    ):
        self.model, self.loss_chunk, self.label_smoothing = model, loss_chunk, label_smoothing
        self.encode = KernelEncoder(model) if encoder == "kernel" else None
        self.precision = precisions.get(precision)
        # float16's dynamic loss scale (a device tensor, `nmt.train.scaling`)
        self.loss_scale: Tensor | None = None

    def forward_backward(self, batch: Batch) -> Tensor:
        return self.step(batch).to(torch.float64)

    def step(self, batch: Batch) -> Tensor:
        """The summed NLL as a 0-dim tensor (detached), gradients accumulated. A mixed
        precision runs the forward under `torch.autocast` in its compute dtype (the
        reference a PyTorch user would write); with float16's loss scale the gradients come
        out scaled, as under GradScaler (`DeviceUpdate` unscales them)."""
        p, device = self.precision, self.model.generator.weight.device
        scale = self.loss_scale
        autocast = torch.autocast(device.type, dtype=p.compute) if p.mixed else nullcontext()
        with autocast:
            out = self.model(batch.src, batch.tgt_in, self.encode)
            return loss.nll_backward(
                self.model, out, batch.tgt_out, self.loss_chunk, batch.size,
                self.label_smoothing, scale,
            )  # fmt: skip


def make_executor(cfg: Config, model: Seq2SeqAttn, world_size: int = 1) -> Executor:
    """The executor the config asks for (`train.executor`, `train.prealloc`); the clone
    executor gets the planner's sharing plan for the model's structure and allocates its
    buffers up front for this rank's share of a batch (`nmt.train.distributed.shard`)."""
    if cfg.train.executor == "autograd":
        t = cfg.train
        return AutogradExecutor(
            model, t.loss_chunk, t.label_smoothing, t.autograd_encoder, t.precision
        )
    return planner.planned_executor(model, ExecutorSpec.from_config(cfg, world_size))
