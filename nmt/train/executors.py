"""The two ways to compute a training step's gradients, behind one interface.

An executor fills each model parameter's `.grad` with d(summed training loss / norm)/d(param)
(norm: the batch's sentences, or what `train.normalization` makes of its tokens: the trainer
says) and returns the summed NLL as a 0-dim float64 tensor on the model's device:
reading it on the host would wait for the device, so the trainer does that only when it
logs. The training loss is the NLL, or with `train.label_smoothing` the smoothed
cross-entropy of `nmt.loss`. The trainer never cares which one ran.

With `train.accum_steps` N (gradient accumulation, OpenNMT-py's `accum_count`) each batch
runs as N micro-batches of rows (`nmt.train.distributed.micro_batches`), each normalised by
the whole batch's norm, so their summed gradients are the whole batch's to
rounding; the clone executor's buffers are reserved for one micro-batch.
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
from nmt.train.distributed import micro_batches


class Executor(Protocol):
    """d(summed loss / norm)/d(param) into the gradients (`norm`: the batch's sentences
    unless given); the summed NLL."""

    model: Seq2SeqAttn

    def forward_backward(self, batch: Batch, norm: float | None = None) -> Tensor: ...


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
        self.precision = precisions.get(precision)
        compute = self.precision.compute if self.precision.mixed else None
        self.encode = KernelEncoder(model, compute) if encoder == "kernel" else None
        # float16's dynamic loss scale (a device tensor, `nmt.train.scaling`)
        self.loss_scale: Tensor | None = None

    def forward_backward(self, batch: Batch, norm: float | None = None) -> Tensor:
        """d(loss / norm) accumulated into the gradients (`norm`: what the loss is divided
        by, default the batch's sentences); the summed NLL."""
        return self.step(batch, norm).to(torch.float64)

    def step(self, batch: Batch, norm: float | None = None) -> Tensor:
        """The summed NLL as a 0-dim tensor (detached), gradients accumulated; the loss
        divided by `norm` (default: the batch's sentences). A mixed precision runs the
        forward under `torch.autocast` in its compute dtype (the reference a PyTorch user
        would write); with float16's loss scale the gradients come out scaled, as under
        GradScaler (`DeviceUpdate` unscales them)."""
        p, device = self.precision, self.model.generator.weight.device
        autocast = torch.autocast(device.type, dtype=p.compute) if p.mixed else nullcontext()
        with autocast:
            out = self.model(batch.src, batch.tgt_in, self.encode)
            return loss.nll_backward(
                self.model, out, batch.tgt_out, self.loss_chunk, norm or batch.size,
                self.label_smoothing, self.loss_scale,
            )  # fmt: skip


class Accumulating:
    """Gradient accumulation: each batch through `inner` as `steps` micro-batches of rows,
    each divided by the whole batch's norm, so the gradients they add up are the
    whole batch's to rounding; the summed NLL of all of them. (Dropout draws each
    micro-batch's masks in turn: other random numbers than the whole batch's, equally
    distributed.)"""

    def __init__(self, inner: Executor, steps: int):
        self.inner, self.steps, self.model = inner, steps, inner.model

    @property
    def loss_scale(self) -> Tensor | None:
        """float16's loss scale: the inner executor's."""
        return self.inner.loss_scale

    @loss_scale.setter
    def loss_scale(self, scale: Tensor | None) -> None:
        self.inner.loss_scale = scale

    def forward_backward(self, batch: Batch, norm: float | None = None) -> Tensor:
        total: Tensor | None = None
        for part in micro_batches(batch, self.steps):
            nll = self.inner.forward_backward(part, norm=norm or batch.size)
            total = nll if total is None else total + nll
        assert total is not None  # a batch has a row
        return total


def make_executor(cfg: Config, model: Seq2SeqAttn, world_size: int = 1) -> Executor:
    """The executor the config asks for (`train.executor`, `train.prealloc`, the partial
    recompute keys, `train.accum_steps`, `train.precision`); the clone executor gets the
    planner's sharing plan for the model's structure and allocates its buffers up front for
    one micro-batch of this rank's share of a batch (`nmt.train.distributed.shard`)."""
    t = cfg.train
    executor: Executor
    if t.executor == "autograd":
        executor = AutogradExecutor(
            model, t.loss_chunk, t.label_smoothing, t.autograd_encoder, t.precision
        )
    else:
        executor = planner.planned_executor(model, ExecutorSpec.from_config(cfg, world_size))
    return Accumulating(executor, t.accum_steps) if t.accum_steps > 1 else executor
