"""The two ways to compute a training step's gradients, behind one interface.

An executor fills each model parameter's `.grad` with d(summed NLL / batch size)/d(param)
and returns the summed NLL as a 0-dim float64 tensor on the model's device: reading it on the
host would wait for the device, so the trainer does that only when it logs. The trainer
never cares which one ran.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from nmt.config import Config
from nmt.data.batching import Batch
from nmt.engine import planner
from nmt.engine.clones import CloneExecutor
from nmt.model import Seq2SeqAttn
from nmt.nn_lstm import NnLstmEncoder


class Executor(Protocol):
    def forward_backward(self, batch: Batch) -> Tensor: ...


class AutogradExecutor:
    """Plain PyTorch autograd over `Seq2SeqAttn.nll`: the reference the clones must match.
    `encoder`: "cells" runs the model's own cells position by position; "nn_lstm" runs the
    encoders on torch's LSTM kernel with the same parameters (`nmt.nn_lstm`)."""

    def __init__(self, model: Seq2SeqAttn, encoder: str = "cells"):
        self.model = model
        self.encode = NnLstmEncoder(model) if encoder == "nn_lstm" else None

    def forward_backward(self, batch: Batch) -> Tensor:
        loss = self.model.nll(batch.src, batch.tgt_in, batch.tgt_out, self.encode)
        (loss / batch.size).backward()
        return loss.detach().to(torch.float64)


def make_executor(cfg: Config, model: Seq2SeqAttn) -> Executor:
    """The executor the config asks for (`train.executor`, `train.prealloc`); the clone
    executor gets the planner's sharing plan for the model's structure."""
    if cfg.train.executor == "autograd":
        return AutogradExecutor(model, cfg.train.autograd_encoder)
    plan = planner.plan(cfg.model, cfg.train.prealloc)
    device = next(model.parameters()).device
    return CloneExecutor(model, cfg.data.max_src_len, cfg.data.max_tgt_len, plan, device=device)
