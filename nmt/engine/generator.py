"""The uncloned generator and criterion, run once per target position during backward.

seq2seq-attn never keeps vocabulary-sized activations for all positions at once: at each
target position (last to first) it runs the generator forward and backward on that position
only, adds the resulting gradient to the decoder output's gradient, and moves on. Where the
model's granularity fuses the output layer (`Granularity.fused_output_layer`) the output
layer and the loss are one node (`OutputLoss`, below), which can also run several positions
at a time (`step_positions`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.nn import Parameter

from nmt import precisions
from nmt.data.vocab import PAD
from nmt.kernels import (
    LOGITS_BLOCKS,
    add_row_sums,
    linear_into,
    master_linear_backward,
    master_linear_into,
)
from nmt.loss import smoothing_value
from nmt.model import Seq2SeqAttn
from nmt.nodes.fused import _Fused
from nmt.nodes.modules import Linear, MasterLinear
from nmt.nodes.node import Node, add_at, resized

_OUT = {"output": "output"}


class LogSoftMaxNLL(Node):
    """Generator criterion: log-softmax, then NLL with row weights (1/B, or 0 at PAD).

    The forward keeps log-probabilities in `output`; backward overwrites them in place with
    d loss / d logits (= w * (softmax - onehot)), which is also its grad_input: one V-sized
    buffer for the whole criterion. With label smoothing eps the target distribution is
    `nmt.loss`'s q (1 - eps on the reference, 0 on PAD, s = eps / (V - 2) elsewhere)
    and the gradient w * (softmax - q) = w * (softmax - s) + w s onehot(PAD)
    - w (1 - eps - s) onehot(target), still computed in the same buffer.
    """

    ROLES = {"output": "output", "flat_target": "flat_target"}
    BWD_READS_OUTPUT = True
    BWD_SCRATCH_ROLES = ("flat_target",)

    def __init__(
        self, name: str, device: torch.device, dtype: torch.dtype, label_smoothing: float = 0.0
    ):
        self.label_smoothing = label_smoothing
        super().__init__(name, device, dtype)
        self.flat_target = torch.empty(0, device=device, dtype=torch.long)

    def forward(self, logits: Tensor) -> Tensor:
        return torch.log_softmax(logits, 1, out=resized(self.output, logits.shape))

    def backward(self, target_weight: tuple[Tensor, Tensor], g: None = None) -> Tensor:
        target, weight = target_weight  # B x 1 int64, B x 1 (1/B for real tokens, 0 for PAD)
        eps = self.label_smoothing
        if eps == 0:
            grad = self.output.exp_().mul_(weight)
            add_at(grad, target, weight.neg(), self.flat_target)
        else:
            s = smoothing_value(self.output.shape[1], eps)
            grad = self.output.exp_().sub_(s).mul_(weight)
            grad[:, PAD : PAD + 1].add_(weight, alpha=s)
            add_at(grad, target, weight.mul(-(1.0 - eps - s)), self.flat_target)
        self.grad_input = grad
        return grad


class OutputLoss(_Fused):
    """The generator's Linear(H, V), log-softmax and NLL (PAD weighs nothing) as one node,
    run forward and backward at once (`step`) for the rows of one target position, or of
    several stacked (`step_positions`, `train.loss_chunk`: one product of k x B rows runs
    near twice as fast per row on a CPU as k of B rows, for k x B x V of memory). One
    vocabulary-sized buffer holds the logits, the log-probabilities (in place) and then
    d loss / d logits; d loss / d out goes straight into the caller's gradient of the
    decoder output. With label smoothing eps the gradient is w * (softmax - q), q as
    `nmt.loss`'s (nngraph's `LogSoftMaxNLL` computes the same); the loss stays the NLL.
    The logits' product runs in blocks of the weight's rows where this CPU's BLAS runs that
    faster (`nmt.wide_linear`).

    In bfloat16 or float16 the log-softmax and d loss / d logits run in float32
    (`softmax_float`), the products in the compute dtype: a softmax rounded to bfloat16
    near 1 minus the target's 1 keeps one or two significant bits of the gradient that
    matters most (the toy task's test BLEU, fused clones in bfloat16: 85.27 without it, 99.57
    with it, docs/precision.md)."""

    ROLES = {
        "output": "output",
        "ones": "ones",
        "minus_target_q": "minus_target_q",
        # several positions' rows stacked (step_positions)
        "rows_out": "rows_out",
        "rows_target": "rows_target",
        "rows_weight": "rows_weight",
        "rows_logp": "rows_logp",
        "rows_grad": "rows_grad",
        "flat_target": "flat_target",
        "softmax_float": "softmax_float",  # a low precision's float32 log-softmax and gradient
        # a low precision's products with the float32 master weight (`MasterLinear`'s)
        "weight_rows": "weight_rows",
        "grad_input_part": "grad_input_part",
        "grad_input_sum": "grad_input_sum",
    }

    def __init__(
        self,
        name: str,
        linear: Linear,
        device: torch.device,
        dtype: torch.dtype,
        label_smoothing: float = 0.0,
    ):
        self.weight: Parameter = linear.weight
        self.bias: Parameter = linear.bias
        # the logits' product in blocks of the weight's rows where this device runs that faster
        self.block = LOGITS_BLOCKS.choose(device, dtype)(self.weight)
        eps = label_smoothing
        # q (nmt.loss): 1 - eps at the target, 0 at PAD, s at every other token
        self.smoothing = smoothing_value(linear.weight.shape[0], eps) if eps else 0.0
        # q at the target less the s every row gets; buffer "minus_target_q" holds its negative
        self.target_q = 1.0 - eps - self.smoothing
        super().__init__(name, device, dtype)
        self.rows_target = torch.empty(0, device=device, dtype=torch.long)
        self.flat_target = torch.empty(0, device=device, dtype=torch.long)
        self.low_precision = precisions.is_low(dtype)
        self.softmax_float = torch.empty(0, device=device, dtype=torch.float32)
        # a mixed precision keeps the weight the float32 master (`nmt.engine.weights`)
        self.master_weight = self.weight.dtype != dtype
        self.grad_input_sum = torch.empty(0, device=device, dtype=self.weight.dtype)
        if self.low_precision:  # q at the target in the gradient's float32: 0.9 is 0.898 in bf16
            self.minus_target_q = torch.empty(0, device=device, dtype=torch.float32)

    def step(
        self,
        out: Tensor,
        target: Tensor,
        weight: Tensor,
        target_logp: Tensor,
        grad_out: Tensor,
        accumulate: bool = True,
    ) -> None:
        """Write log p(target) into `target_logp` (R x 1: the executor sums the NLL from it;
        aten's nll_loss has no deterministic CUDA kernel), accumulate the parameter
        gradients, add d loss / d out into `grad_out` (R x H; written, not added to, when
        not `accumulate`). target: R x 1 token ids; weight: R x 1, 1 / batch size at real
        tokens, else 0."""
        w, b = self.weight, self.bias
        R, V = out.shape[0], w.shape[0]
        if self.master_weight:
            logits = master_linear_into(self._rows("output", (R, V)), out, w, b, self.weight_rows)
        else:
            logits = linear_into(self._rows("output", (R, V)), out, w, b, self.block)
        if self.low_precision:  # float32 from the logits to the gradient (class docstring)
            # lifted into the float32 buffer, then normalised there in place: no temporary
            logp = self._rows("softmax_float", (R, V)).copy_(logits)
            torch.log_softmax(logp, 1, out=logp)
            target_logp.copy_(torch.gather(logp, 1, target))
        else:
            logp = torch.log_softmax(logits, 1, out=logits)  # row by row: safe in place
            torch.gather(logp, 1, target, out=target_logp)
        grad = logp.exp_()  # softmax; minus q, times the row weight:
        s = self.smoothing
        if s:  # q = s everywhere but PAD (0), + (1 - eps - s) at the target
            grad.sub_(s)
            grad[:, PAD : PAD + 1].add_(s)
        minus_q = self._constant("minus_target_q", (R, 1), -self.target_q)
        add_at(grad, target, minus_q, self.flat_target)
        grad.mul_(weight)
        if self.low_precision:
            grad = logits.copy_(grad)  # back to the compute dtype for the products
        if self.master_weight:
            scratch = (
                self.weight_rows,
                self.grad_input_part,
                self.grad_input_sum,
            )
            master_linear_backward(grad_out, grad, out, w, scratch, accumulate)
        elif accumulate:
            grad_out.addmm_(grad, w)
            w.grad.addmm_(grad.t(), out)
        else:
            torch.mm(grad, w, out=grad_out)
            w.grad.addmm_(grad.t(), out)
        add_row_sums(b.grad, grad, self._constant("ones", (R,), 1.0))

    def step_positions(
        self,
        outs: list[Tensor],
        targets: list[Tensor],
        weights: list[Tensor],
        target_logps: list[Tensor],
    ) -> tuple[Tensor, ...]:
        """`step` over several positions' rows at once (each list: one entry per position,
        shaped as `step`'s), stacked into one product: writes each position's log p(target),
        returns each position's d loss / d out (views of one buffer, good until the next
        call)."""
        rows = [o.shape[0] for o in outs]
        n, H = sum(rows), outs[0].shape[1]
        out = torch.cat(outs, out=self._rows("rows_out", (n, H)))
        target = torch.cat(targets, out=self._rows("rows_target", (n, 1)))
        weight = torch.cat(weights, out=self._rows("rows_weight", (n, 1)))
        logp = self._rows("rows_logp", (n, 1))
        grad = self._rows("rows_grad", (n, H))
        self.step(out, target, weight, logp, grad, accumulate=False)
        torch._foreach_copy_(target_logps, logp.split(rows))
        return grad.split(rows)

    def forward(self, input: Any) -> Any:
        raise TypeError("OutputLoss runs forward and backward at once: use step()")


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
        # a mixed precision keeps the weight the float32 master (`nmt.engine.weights`)
        kind = Linear if lin.weight.dtype == dtype else MasterLinear
        self.linear = kind("generator", lin.weight, lin.bias, device, dtype)
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
