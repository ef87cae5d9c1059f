"""The uncloned generator and criterion, run once per target position during backward.

seq2seq-attn never keeps vocabulary-sized activations for all positions at once: at each
target position (last to first) it runs the generator forward and backward on that position
only, adds the resulting gradient to the decoder output's gradient, and moves on. Where the
model's granularity fuses the output layer (`Granularity.fused_output_layer`) the output
layer and the loss are one node (`fused.OutputLoss`), which can also run several positions
at a time (`step_positions`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from nmt.engine.fused import OutputLoss
from nmt.engine.node import Node
from nmt.engine.nodes import Linear, LogSoftMaxNLL
from nmt.model import Seq2SeqAttn


class Generator:
    """Linear(H, V) + log-softmax + NLL (PAD weight 0), with persistent buffers; with label
    smoothing the gradient is the smoothed cross-entropy's, the loss still the NLL."""

    def __init__(
        self,
        model: Seq2SeqAttn,
        device: torch.device,
        dtype: torch.dtype,
        label_smoothing: float = 0.0,
    ):
        lin = model.generator
        self.fused: OutputLoss | None = None
        # fused: the executor may hand `step` only the rows that are not PAD (seq2seq-attn's
        # nngraph criterion ran every row, and the nngraph granularity still does)
        self.skips_pad_rows = model.granularity.fused_output_layer
        if self.skips_pad_rows:
            self.fused = OutputLoss("generator", lin, device, dtype, label_smoothing)
            return
        self.linear = Linear("generator", lin.weight, lin.bias, device, dtype)
        self.criterion = LogSoftMaxNLL("criterion", device, dtype, label_smoothing)

    def step(
        self, out: Tensor, target: Tensor, weight: Tensor, target_logp: Tensor, grad_out: Tensor
    ) -> None:
        """One position: write log p(target) of each row into `target_logp` (B x 1; the
        executor sums the real tokens' into the NLL), accumulate the generator's parameter
        gradients (of the NLL, or with label smoothing of the smoothed loss), add
        d loss / d out into `grad_out` (B x H).

        target: B x 1 token ids; weight: B x 1, 1 / batch_size for real tokens, 0 for PAD
        (the loss is divided by the batch size).
        """
        if self.fused is not None:
            self.fused.step(out, target, weight, target_logp, grad_out)
            return
        logp = self.criterion.forward(self.linear.forward(out))
        torch.gather(logp, 1, target, out=target_logp)
        grad_logits = self.criterion.backward((target, weight))
        grad_out.add_(self.linear.backward(out, grad_logits))

    def step_positions(
        self,
        outs: list[Tensor],
        targets: list[Tensor],
        weights: list[Tensor],
        target_logps: list[Tensor],
    ) -> tuple[Tensor, ...]:
        """`step` for several positions at once (fused only): one list entry per position;
        returns each position's d loss / d out, for the caller to add where it belongs."""
        if self.fused is None:
            raise TypeError("the nngraph generator runs one position at a time")
        return self.fused.step_positions(outs, targets, weights, target_logps)

    def nodes(self) -> Iterator[Node]:
        if self.fused is not None:
            yield self.fused
            return
        yield self.linear
        yield self.criterion
