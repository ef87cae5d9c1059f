"""The nodes of the fused granularity (`model.granularity: fused`): fewer, larger nodes.

nngraph's graph (`nmt.engine.nodes`) has a node per Torch7 module: an LSTM layer is 15
nodes, and each node's forward and backward are separate ops. Here one node does what a
group of them did, with a hand-written backward:

    LSTMCell    one LSTM layer at one position: `nmt.cells.lstm_cell` into its buffers
    Dropout     x * mask / (1 - p) as one op each way; the 0/1 mask drawn like nngraph's
    *Attn       the attention of each `model.attention` type: `Attention.fused`
    OutputLoss  the generator's Linear + log-softmax + NLL, forward and backward at once

The arithmetic is nngraph's to rounding (float64 gradients equal autograd to 1e-10). Each
node states the planner's facts like any other: what its backward reads, and which of its
own buffers are scratch that lives inside one forward() or one backward() call.

Shapes: B batch, S source length, H rnn_size, V target vocabulary.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import Tensor
from torch.nn import Linear, Module, Parameter

from nmt.attention import Attention, row_dots
from nmt.cells import lstm_cell
from nmt.data.vocab import PAD
from nmt.engine.node import Node, resized
from nmt.loss import smoothing_value
from nmt.model import LSTMLayer, keep_mask_

_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward = torch.ops.aten.tanh_backward.grad_input
_softmax_backward = torch.ops.aten._softmax_backward_data.out


@cache
def _zero(device: torch.device, dtype: torch.dtype) -> Tensor:
    """A 0-dim zero: addcmul's `input` where only the product is wanted."""
    return torch.zeros((), device=device, dtype=dtype)


class _Fused(Node):
    """`_buf` is the `nmt.cells.Buf` over the node's buffers, by attribute name. Buffers of
    CONSTANT_ROLES hold a constant (`_constant`): backward scratch that every writer fills
    with the same values, so it is kept from one call to the next."""

    CONSTANT_ROLES: tuple[str, ...] = ("ones", "minus_target_q")

    def __init__(self, name: str, device: torch.device, dtype: torch.dtype):
        self._stamps: dict[str, tuple[Tensor, tuple[int, ...]]] = {}
        super().__init__(name, device, dtype)

    def _buf(self, name: str, shape: tuple[int, ...]) -> Tensor:
        return resized(getattr(self, name), shape)

    def _rows(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """The first shape[0] rows of buffer `name` where it has them (a view, so positions
        that run on fewer rows resize nothing), else the buffer resized to `shape`. Only for
        buffers used within one call: the buffer itself keeps its larger shape."""
        t = getattr(self, name)
        if t.dim() == len(shape) and t.shape[0] >= shape[0] and t.shape[1:] == shape[1:]:
            return t[: shape[0]]
        return resized(t, shape)

    def _constant(self, name: str, shape: tuple[int, ...], value: float) -> Tensor:
        """`_rows` of buffer `name` holding `value` everywhere (ones for a bias gradient as
        one product, g^T 1): filled only when its tensor or its shape changed since."""
        t = self._rows(name, shape)
        base = getattr(self, name)
        stamp = self._stamps.get(name)
        if stamp is None or stamp[0] is not base or stamp[1] != tuple(base.shape):
            base.fill_(value)
            self._stamps[name] = (base, tuple(base.shape))
        return t


class LSTMCell(_Fused):
    """(x, h, c) -> (h', c') of one LSTM layer. Backward reads the three inputs (x and h for
    the weight gradients, c for the forget gate's), the activated gates and tanh(c'): what
    nngraph's nodes keep, so the fused cell holds no more memory than they do."""

    ROLES = {
        "output[0]": "h",
        "output[1]": "c",
        "gates": "gates",
        "tanh_c": "tanh_c",
        "grad_input[0]": "grad_x",
        "grad_input[1]": "grad_h",
        "grad_input[2]": "grad_c",
        "grad_gates": "grad_gates",
        "grad_next_c": "grad_next_c",
        "ones": "ones",
    }
    N_INPUTS = 3
    BWD_READS_INPUTS = (0, 1, 2)
    BWD_READS_ROLES = ("gates", "tanh_c")
    BWD_SCRATCH_ROLES = ("grad_gates", "grad_next_c", "ones")
    n_outputs = 2

    def __init__(self, name: str, layer: LSTMLayer, device: torch.device, dtype: torch.dtype):
        self.w_ih, self.b_ih, self.w_hh = layer.i2h.weight, layer.i2h.bias, layer.h2h.weight
        super().__init__(name, device, dtype)

    def _bind(self) -> None:
        self.output = (self.h, self.c)
        self.grad_input = (self.grad_x, self.grad_h, self.grad_c)

    def forward(self, xhc: tuple[Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x, h, c = xhc
        lstm_cell(x, h, c, self.w_ih, self.b_ih, self.w_hh, self._buf)
        return self.output

    def backward(
        self, xhc: tuple[Tensor, Tensor, Tensor], grads: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, Tensor, Tensor]:
        x, h, c = xhc
        g_h, g_c = grads
        B, H = h.shape
        gates = self.gates
        i, f, o, g = gates.chunk(4, 1)
        dc = torch.mul(g_h, o, out=self._buf("grad_next_c", (B, H)))  # dL/dc' =
        _tanh_backward(dc, self.tanh_c, grad_input=dc)  # g_h o (1 - tanh(c')^2)
        dc.add_(g_c)  # + what the next position sends back
        gg = self._buf("grad_gates", (B, 4 * H))
        g_i, g_f, g_o, g_g = gg.chunk(4, 1)
        torch.mul(dc, g, out=g_i)
        torch.mul(dc, c, out=g_f)
        torch.mul(g_h, self.tanh_c, out=g_o)
        torch.mul(dc, i, out=g_g)
        ifo = gg[:, : 3 * H]
        _sigmoid_backward(ifo, gates[:, : 3 * H], grad_input=ifo)
        _tanh_backward(g_g, g, grad_input=g_g)
        torch.mul(dc, f, out=self._buf("grad_c", (B, H)))
        torch.mm(gg, self.w_ih, out=self._buf("grad_x", tuple(x.shape)))
        torch.mm(gg, self.w_hh, out=self._buf("grad_h", (B, H)))
        self.w_ih.grad.addmm_(gg.t(), x)
        self.w_hh.grad.addmm_(gg.t(), h)
        self.b_ih.grad.addmv_(gg.t(), self._constant("ones", (B,), 1.0))
        return self.grad_input


class Dropout(_Fused):
    """Inverted dropout in one op each way: x * mask * 1/(1-p) (an addcmul) with a 0/1 mask
    drawn by `nmt.model.keep_mask_`, the draws of `dropout_mask` (so the same masks as the
    autograd model, in the same order). A copy when the module is not training."""

    ROLES = {"output": "output", "grad_input": "grad_input", "mask": "mask"}
    BWD_READS_ROLES = ("mask",)

    def __init__(
        self, name: str, p: float, module: Module, device: torch.device, dtype: torch.dtype
    ):
        self.p, self.scale, self.module = p, 1.0 / (1.0 - p), module
        self._active = True
        super().__init__(name, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        out = self._buf("output", tuple(x.shape))
        self._active = self.module.training
        if not self._active:
            return out.copy_(x)
        mask = keep_mask_(self._buf("mask", tuple(x.shape)), self.p)
        return torch.addcmul(_zero(x.device, x.dtype), x, mask, value=self.scale, out=out)

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        gi = self._buf("grad_input", tuple(g.shape))
        if not self._active:
            return gi.copy_(g)
        return torch.addcmul(_zero(g.device, g.dtype), g, self.mask, value=self.scale, out=gi)


# ---- attention --------------------------------------------------------------------------------

_ATTN_ROLES = {
    "output": "output",
    "grad_input[0]": "grad_h",
    "grad_input[1]": "grad_context",
    "scores": "scores",
    "attn": "attn",
    "ctx": "ctx",
    "joined": "joined",
    "grad_lin": "grad_lin",
    "grad_joined": "grad_joined",
    "grad_attn": "grad_attn",
    "grad_scores": "grad_scores",
}


class _Attn(_Fused):
    """(h_t B x H, context B x S x H) -> tanh(W_c [c_t ; h_t]): `Attention.fused` into the
    node's buffers; backward by hand, the score's part per type (`_score_backward`).
    Backward reads both inputs, the output (tanh), the attention and [c_t ; h_t]."""

    ROLES = _ATTN_ROLES
    N_INPUTS = 2
    BWD_READS_INPUTS = (0, 1)
    BWD_READS_OUTPUT = True
    BWD_READS_ROLES: tuple[str, ...] = ("attn", "joined")
    FWD_SCRATCH_ROLES: tuple[str, ...] = ("scores", "ctx")
    BWD_SCRATCH_ROLES: tuple[str, ...] = ("grad_lin", "grad_joined", "grad_attn", "grad_scores")
    # mm2 (c_t) and its gradients (the context's is mm1's too, where the score has an mm1)
    ATTENTION_PRODUCTS: tuple[str, ...] = ("ctx", "grad_attn", "grad_input[1]")

    def __init__(self, name: str, module: Attention, device: torch.device, dtype: torch.dtype):
        self.module = module
        super().__init__(name, device, dtype)

    def _bind(self) -> None:
        super()._bind()
        self.grad_input = (self.grad_h, self.grad_context)

    def forward(self, hc: tuple[Tensor, Tensor]) -> Tensor:
        h, context = hc
        out, _ = self.module.fused(h, context, None, self._buf)
        return out

    def backward(self, hc: tuple[Tensor, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
        h, context = hc
        B, S, H = context.shape
        g_lin = _tanh_backward(g, self.output, grad_input=self._buf("grad_lin", (B, H)))
        w_c = self.module.linear_out.weight
        g_joined = torch.mm(g_lin, w_c, out=self._buf("grad_joined", (B, 2 * H)))
        w_c.grad.addmm_(g_lin.t(), self.joined)
        g_ctx = g_joined[:, :H]
        g_attn = row_dots(context, g_ctx, self._buf("grad_attn", (B, S)))
        g_scores = self._buf("grad_scores", (B, S))
        _softmax_backward(g_attn, self.attn, 1, self.attn.dtype, grad_input=g_scores)
        g_context = self._buf("grad_context", (B, S, H))
        torch.mul(self.attn.unsqueeze(2), g_ctx.unsqueeze(1), out=g_context)
        g_h = self._buf("grad_h", (B, H))
        self._score_backward(h, context, g_scores, g_joined[:, H:], g_h, g_context)
        return self.grad_input

    def _score_backward(
        self,
        h: Tensor,
        context: Tensor,
        g_scores: Tensor,
        g_h_out: Tensor,
        g_h: Tensor,
        g_context: Tensor,
    ) -> None:
        """Write h's gradient into g_h (g_h_out: its part from the output layer), add the
        score's part of the context's gradient to g_context, accumulate the score's
        parameter gradients."""
        raise NotImplementedError


class GeneralAttn(_Attn):
    """score = h_s . (W_a h_t); backward also reads W_a h_t ("target")."""

    ROLES = {**_ATTN_ROLES, "target": "target", "grad_target": "grad_target"}
    BWD_READS_ROLES = (*_Attn.BWD_READS_ROLES, "target")
    BWD_SCRATCH_ROLES = (*_Attn.BWD_SCRATCH_ROLES, "grad_target")
    ATTENTION_PRODUCTS = (*_Attn.ATTENTION_PRODUCTS, "scores", "grad_target")  # + mm1

    def _score_backward(self, h, context, g_scores, g_h_out, g_h, g_context) -> None:
        B, S, H = context.shape
        g_target = self._buf("grad_target", (B, H))
        torch.bmm(g_scores.unsqueeze(1), context, out=g_target.unsqueeze(1))
        g_context.baddbmm_(g_scores.unsqueeze(2), self.target.unsqueeze(1))
        w_a = self.module.linear_in.weight
        torch.addmm(g_h_out, g_target, w_a, out=g_h)
        w_a.grad.addmm_(g_target.t(), h)


class DotAttn(_Attn):
    """score = h_s . h_t."""

    ROLES = {**_ATTN_ROLES, "grad_target": "grad_target"}
    BWD_SCRATCH_ROLES = (*_Attn.BWD_SCRATCH_ROLES, "grad_target")
    ATTENTION_PRODUCTS = (*_Attn.ATTENTION_PRODUCTS, "scores", "grad_target")  # + mm1

    def _score_backward(self, h, context, g_scores, g_h_out, g_h, g_context) -> None:
        B, S, H = context.shape
        g_target = self._buf("grad_target", (B, H))
        torch.bmm(g_scores.unsqueeze(1), context, out=g_target.unsqueeze(1))
        g_context.baddbmm_(g_scores.unsqueeze(2), h.unsqueeze(1))
        torch.add(g_h_out, g_target, out=g_h)


class MlpAttn(_Attn):
    """score = v . tanh(W_k h_s + W_q h_t + b); backward also reads the tanh ("hidden")."""

    ROLES = {
        **_ATTN_ROLES,
        "hidden": "hidden",
        "query": "query",
        "grad_hidden": "grad_hidden",
        "grad_query": "grad_query",
        "ones": "ones",
    }
    BWD_READS_ROLES = (*_Attn.BWD_READS_ROLES, "hidden")
    FWD_SCRATCH_ROLES = (*_Attn.FWD_SCRATCH_ROLES, "query")
    BWD_SCRATCH_ROLES = (*_Attn.BWD_SCRATCH_ROLES, "grad_hidden", "grad_query", "ones")

    def _score_backward(self, h, context, g_scores, g_h_out, g_h, g_context) -> None:
        B, S, H = context.shape
        att = self.module
        v, w_k, q = att.v.weight, att.linear_context.weight, att.linear_query
        hidden = self.hidden.view(B * S, H)
        g_hidden = self._buf("grad_hidden", (B, S, H))
        torch.mul(g_scores.unsqueeze(2), v.view(1, 1, H), out=g_hidden)
        v.grad.addmm_(g_scores.reshape(1, B * S), hidden)
        g_sum = _tanh_backward(g_hidden, self.hidden, grad_input=g_hidden).view(B * S, H)
        g_query = torch.sum(g_hidden, 1, out=self._buf("grad_query", (B, H)))
        g_context.view(B * S, H).addmm_(g_sum, w_k)
        w_k.grad.addmm_(g_sum.t(), context.reshape(B * S, H))
        q.weight.grad.addmm_(g_query.t(), h)
        q.bias.grad.addmv_(g_query.t(), self._constant("ones", (B,), 1.0))
        torch.addmm(g_h_out, g_query, q.weight, out=g_h)


ATTENTIONS: dict[str, type[_Attn]] = {"general": GeneralAttn, "dot": DotAttn, "mlp": MlpAttn}


# ---- the output layer and the loss --------------------------------------------------------------


class OutputLoss(_Fused):
    """The generator's Linear(H, V), log-softmax and NLL (PAD weighs nothing) as one node,
    run forward and backward at once (`step`) for the rows of one target position, or of
    several stacked (`step_positions`, `train.loss_chunk`: one product of k x B rows runs
    near twice as fast per row on a CPU as k of B rows, for k x B x V of memory). One
    vocabulary-sized buffer holds the logits, the log-probabilities (in place) and then
    d loss / d logits; d loss / d out goes straight into the caller's gradient of the
    decoder output. With label smoothing eps the gradient is w * (softmax - q), q as
    `nmt.loss`'s (nngraph's `LogSoftMaxNLL` computes the same); the loss stays the NLL."""

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
        eps = label_smoothing
        # q (nmt.loss): 1 - eps at the target, 0 at PAD, s at every other token
        self.smoothing = smoothing_value(linear.weight.shape[0], eps) if eps else 0.0
        # q at the target less the s every row gets; buffer "minus_target_q" holds its negative
        self.target_q = 1.0 - eps - self.smoothing
        super().__init__(name, device, dtype)
        self.rows_target = torch.empty(0, device=device, dtype=torch.long)

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
        logits = torch.addmm(b, out, w.t(), out=self._rows("output", (R, V)))
        logp = torch.log_softmax(logits, 1, out=logits)  # row by row: safe in place
        torch.gather(logp, 1, target, out=target_logp)
        grad = logp.exp_()  # softmax; minus q, times the row weight:
        s = self.smoothing
        if s:  # q = s everywhere but PAD (0), + (1 - eps - s) at the target
            grad.sub_(s)
            grad[:, PAD : PAD + 1].add_(s)
        grad.scatter_add_(1, target, self._constant("minus_target_q", (R, 1), -self.target_q))
        grad.mul_(weight)
        if accumulate:
            grad_out.addmm_(grad, w)
        else:
            torch.mm(grad, w, out=grad_out)
        w.grad.addmm_(grad.t(), out)
        b.grad.addmv_(grad.t(), self._constant("ones", (R,), 1.0))

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
