"""Torch7's nn modules as clone-graph nodes, each with its forward, backward and facts: what
the model's layers wire their nngraph form from (`RecurrentLayer.wire`, `Attention.wire`).

Shapes: B batch, S source length, H rnn_size. Parameter gradients accumulate into the
`.grad` of the module's own parameters (the executor creates them before a step).
Nodes whose backward is the identity on a slice (CAdd, Join, Split's forward) hand out
aliases/views instead of copies: they own no storage for that role at all.
"""

from __future__ import annotations

from functools import cache

import torch
from torch import Tensor
from torch.nn import Module, Parameter

from nmt.kernels import keep_mask_, master_linear_backward, master_linear_into, row_dots
from nmt.nodes.node import Node, resized

_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward = torch.ops.aten.tanh_backward.grad_input
_softmax_backward = torch.ops.aten._softmax_backward_data.out

_OUT = {"output": "output"}
_OUT_GI = {"output": "output", "grad_input": "grad_input"}
_OUT_GI2 = {"output": "output", "grad_input[0]": "gi0", "grad_input[1]": "gi1"}


class _Binary(Node):
    """Two inputs, both read by backward, one owned gradient buffer for each."""

    ROLES = _OUT_GI2
    N_INPUTS = 2
    BWD_READS_INPUTS = (0, 1)

    def _bind(self) -> None:
        super()._bind()
        self.grad_input = (self.gi0, self.gi1)


class Linear(Node):
    """y = x W^T (+ b). Backward reads x for the weight gradient."""

    ROLES = _OUT_GI
    BWD_READS_INPUTS = (0,)

    def __init__(
        self,
        name: str,
        weight: Parameter,
        bias: Parameter | None,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.weight, self.bias = weight, bias
        super().__init__(name, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        out = resized(self.output, (x.shape[0], w.shape[0]))
        if self.bias is None:
            torch.mm(x, w.t(), out=out)
        else:
            torch.addmm(self.bias, x, w.t(), out=out)
        return out

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        w = self.weight
        gi = resized(self.grad_input, (g.shape[0], w.shape[1]))
        torch.mm(g, w, out=gi)
        w.grad.addmm_(g.t(), x)
        if self.bias is not None:
            self.bias.grad.add_(g.sum(0))
        return gi


class MasterLinear(Linear):
    """A Linear whose weight is the float32 master while the graph computes in a lower
    precision (a mixed precision's output layer, `nmt.engine.weights`): each product casts
    a block of the weight's rows at a time (`nmt.wide_linear.MASTER_BLOCK_ROWS`), and the
    weight's gradient is added into the master's in float32, a block at a time."""

    ROLES = {
        **_OUT_GI,
        "weight_rows": "weight_rows",
        "grad_input_part": "grad_input_part",
        "grad_input_sum": "grad_input_sum",
    }
    FWD_SCRATCH_ROLES = ("weight_rows",)
    BWD_SCRATCH_ROLES = ("weight_rows", "grad_input_part", "grad_input_sum")

    def __init__(
        self,
        name: str,
        weight: Parameter,
        bias: Parameter,
        device: torch.device,
        dtype: torch.dtype,
    ):
        super().__init__(name, weight, bias, device, dtype)
        self.grad_input_sum = torch.empty(0, device=device, dtype=weight.dtype)

    def forward(self, x: Tensor) -> Tensor:
        out = resized(self.output, (x.shape[0], self.weight.shape[0]))
        return master_linear_into(out, x, self.weight, self.bias, self.weight_rows)

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        gi = resized(self.grad_input, (g.shape[0], self.weight.shape[1]))
        scratch = (self.weight_rows, self.grad_input_part, self.grad_input_sum)
        master_linear_backward(gi, g, x, self.weight, scratch, accumulate=False)
        self.bias.grad.add_(g.sum(0))
        return gi


class LookupTable(Node):
    """Rows of an embedding matrix; backward scatters into its gradient (no grad_input).

    The matrix may be in another dtype than the graph (a mixed precision keeps embeddings
    in their float32 masters: a compute copy of them would cost more memory than it saves
    work): the rows then pass through a scratch buffer of the matrix's dtype each way, and
    the gradient is summed in the matrix's dtype."""

    ROLES = {"output": "output", "rows": "rows", "grad_rows": "grad_rows"}
    BWD_READS_INPUTS = (0,)
    FWD_SCRATCH_ROLES = ("rows",)
    BWD_SCRATCH_ROLES = ("grad_rows",)

    def __init__(self, name: str, weight: Parameter, device: torch.device, dtype: torch.dtype):
        self.weight = weight
        super().__init__(name, device, dtype)
        self.rows = torch.empty(0, device=device, dtype=weight.dtype)
        self.grad_rows = torch.empty(0, device=device, dtype=weight.dtype)

    def forward(self, idx: Tensor) -> Tensor:
        shape = (idx.shape[0], self.weight.shape[1])
        out = resized(self.output, shape)
        if self.weight.dtype == out.dtype:
            return torch.index_select(self.weight, 0, idx, out=out)
        return out.copy_(torch.index_select(self.weight, 0, idx, out=resized(self.rows, shape)))

    def backward(self, idx: Tensor, g: Tensor) -> None:
        if self.weight.dtype != g.dtype:
            g = resized(self.grad_rows, tuple(g.shape)).copy_(g)
        self.weight.grad.index_add_(0, idx, g)
        return None


class Sigmoid(Node):
    ROLES = _OUT_GI
    BWD_READS_OUTPUT = True

    def forward(self, x: Tensor) -> Tensor:
        return torch.sigmoid(x, out=resized(self.output, x.shape))

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        return _sigmoid_backward(g, self.output, grad_input=resized(self.grad_input, g.shape))


class Tanh(Node):
    ROLES = _OUT_GI
    BWD_READS_OUTPUT = True

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x, out=resized(self.output, x.shape))

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        return _tanh_backward(g, self.output, grad_input=resized(self.grad_input, g.shape))


class SoftMax(Node):
    """Softmax over dimension 1 (source positions)."""

    ROLES = _OUT_GI
    BWD_READS_OUTPUT = True

    def forward(self, x: Tensor) -> Tensor:
        return torch.softmax(x, 1, out=resized(self.output, x.shape))

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        y = self.output
        return _softmax_backward(g, y, 1, y.dtype, grad_input=resized(self.grad_input, g.shape))


class CAdd(Node):
    """a + b. Its grad_input is (grad_output, grad_output): aliases, no storage."""

    ROLES = _OUT
    N_INPUTS = 2

    def forward(self, ab: tuple[Tensor, Tensor]) -> Tensor:
        a, b = ab
        return torch.add(a, b, out=resized(self.output, a.shape))

    def backward(self, ab: tuple[Tensor, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
        self.grad_input = (g, g)
        return self.grad_input


@cache
def _one(device: torch.device, dtype: torch.dtype) -> Tensor:
    """A 0-dim one: the minuend of 1 - x."""
    return torch.ones((), device=device, dtype=dtype)


class OneMinus(Node):
    """1 - x (Torch7's AddConstant(1) of MulConstant(-1): the GRU's 1 - z). Reads nothing in
    backward: its gradient is -grad_output."""

    ROLES = _OUT_GI

    def forward(self, x: Tensor) -> Tensor:
        one = _one(x.device, x.dtype)
        return torch.sub(one, x, out=resized(self.output, x.shape))

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        return torch.neg(g, out=resized(self.grad_input, g.shape))


class CMul(_Binary):
    """a * b. Backward reads both inputs."""

    def forward(self, ab: tuple[Tensor, Tensor]) -> Tensor:
        a, b = ab
        return torch.mul(a, b, out=resized(self.output, a.shape))

    def backward(self, ab: tuple[Tensor, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
        a, b = ab
        torch.mul(g, b, out=resized(self.gi0, g.shape))
        torch.mul(g, a, out=resized(self.gi1, g.shape))
        return self.grad_input


class Split(Node):
    """B x nW -> n views B x W (the gates i f o g). Backward joins the n gradients."""

    ROLES = {"grad_input": "grad_input"}

    def __init__(self, name: str, n: int, device: torch.device, dtype: torch.dtype):
        self.n = self.n_outputs = n
        super().__init__(name, device, dtype)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        self.output = x.chunk(self.n, 1)
        return self.output

    def backward(self, x: Tensor, gs: tuple[Tensor, ...]) -> Tensor:
        g0 = gs[0]
        gi = resized(self.grad_input, (g0.shape[0], g0.shape[1] * self.n))
        return torch.cat(gs, 1, out=gi)


class Join(Node):
    """[a ; b] along dimension 1. Backward hands out the two slices of grad_output as views."""

    ROLES = _OUT
    N_INPUTS = 2

    def forward(self, ab: tuple[Tensor, Tensor]) -> Tensor:
        a, b = ab
        self._widths = (a.shape[1], b.shape[1])
        out = resized(self.output, (a.shape[0], a.shape[1] + b.shape[1]))
        return torch.cat(ab, 1, out=out)

    def backward(self, ab: tuple[Tensor, Tensor], g: Tensor) -> tuple[Tensor, ...]:
        self.grad_input = g.split(self._widths, 1)
        return self.grad_input


class MMScores(_Binary):
    """Attention MM1: scores[b, s] = context[b, s] . target[b] (context B x S x H, target B x H)."""

    ATTENTION_PRODUCTS = tuple(_OUT_GI2)

    def forward(self, ct: tuple[Tensor, Tensor]) -> Tensor:
        context, target = ct
        out = resized(self.output, context.shape[:2])
        row_dots(context, target, out)
        return out

    def backward(self, ct: tuple[Tensor, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
        context, target = ct
        gc = resized(self.gi0, (g.shape[0], g.shape[1], target.shape[1]))
        torch.mul(g.unsqueeze(2), target.unsqueeze(1), out=gc)
        gt = resized(self.gi1, target.shape)
        torch.bmm(g.unsqueeze(1), context, out=gt.unsqueeze(1))
        return self.grad_input


class MMContext(_Binary):
    """Attention MM2: c[b] = sum_s attn[b, s] context[b, s] (attn B x S, context B x S x H)."""

    ATTENTION_PRODUCTS = tuple(_OUT_GI2)

    def forward(self, ac: tuple[Tensor, Tensor]) -> Tensor:
        attn, context = ac
        out = resized(self.output, (context.shape[0], context.shape[2]))
        torch.bmm(attn.unsqueeze(1), context, out=out.unsqueeze(1))
        return out

    def backward(self, ac: tuple[Tensor, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
        attn, context = ac
        row_dots(context, g, resized(self.gi0, attn.shape))
        gc = resized(self.gi1, (attn.shape[0], attn.shape[1], g.shape[1]))
        torch.mul(attn.unsqueeze(2), g.unsqueeze(1), out=gc)
        return self.grad_input


MM = (MMScores, MMContext)  # the two attention matrix products (seq2seq-attn PR #45)


class BottleLinear(Node):
    """y = x W^T over the last dimension of x B x S x I (Torch7 nn.Bottle(nn.Linear), no
    bias): the mlp attention's W_k h_s. Backward reads x for the weight gradient."""

    ROLES = _OUT_GI
    BWD_READS_INPUTS = (0,)

    def __init__(self, name: str, weight: Parameter, device: torch.device, dtype: torch.dtype):
        self.weight = weight
        super().__init__(name, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        w = self.weight
        out = resized(self.output, (*x.shape[:-1], w.shape[0]))
        torch.mm(x.reshape(-1, w.shape[1]), w.t(), out=out.view(-1, w.shape[0]))
        return out

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        w = self.weight
        g2 = g.reshape(-1, w.shape[0])
        gi = resized(self.grad_input, (*g.shape[:-1], w.shape[1]))
        torch.mm(g2, w, out=gi.view(-1, w.shape[1]))
        w.grad.addmm_(g2.t(), x.reshape(-1, w.shape[1]))
        return gi


class AddAcross(Node):
    """a + b added to every row s: a B x S x H, b B x H (the mlp attention's W_k h_s + W_q h_t).
    grad_input: (grad_output itself, an alias; its sum over S, owned). Reads no input."""

    ROLES = {"output": "output", "grad_input[1]": "gi1"}
    N_INPUTS = 2

    def forward(self, ab: tuple[Tensor, Tensor]) -> Tensor:
        a, b = ab
        return torch.add(a, b.unsqueeze(1), out=resized(self.output, a.shape))

    def backward(self, ab: tuple[Tensor, Tensor], g: Tensor) -> tuple[Tensor, Tensor]:
        gb = resized(self.gi1, (g.shape[0], g.shape[2]))
        torch.sum(g, 1, out=gb)
        self.grad_input = (g, gb)
        return self.grad_input


class VScores(Node):
    """scores[b, s] = v . e[b, s]: e B x S x H, v the 1 x H weight of the mlp attention's
    Linear(H, 1). Backward reads e for v's gradient."""

    ROLES = _OUT_GI
    BWD_READS_INPUTS = (0,)

    def __init__(self, name: str, weight: Parameter, device: torch.device, dtype: torch.dtype):
        self.weight = weight
        super().__init__(name, device, dtype)

    def forward(self, e: Tensor) -> Tensor:
        out = resized(self.output, e.shape[:2])
        torch.mm(e.reshape(-1, e.shape[2]), self.weight.t(), out=out.view(-1, 1))
        return out

    def backward(self, e: Tensor, g: Tensor) -> Tensor:
        gi = resized(self.grad_input, (*g.shape, self.weight.shape[1]))
        torch.mul(g.unsqueeze(2), self.weight.view(1, 1, -1), out=gi)
        self.weight.grad.addmm_(g.reshape(1, -1), e.reshape(-1, e.shape[2]))
        return gi


class Dropout(Node):
    """x * mask with the masks of `nmt.kernels.dropout_mask` (the same draws, into the
    node's own buffer), drawn in forward; identity (a copy)
    when the module is not training. The mask is kept for backward (role "mask")."""

    ROLES = {"output": "output", "grad_input": "grad_input", "mask": "mask"}
    BWD_READS_ROLES = ("mask",)

    def __init__(
        self, name: str, p: float, module: Module, device: torch.device, dtype: torch.dtype
    ):
        self.p, self.module = p, module
        self._active = True
        super().__init__(name, device, dtype)

    def forward(self, x: Tensor) -> Tensor:
        out = resized(self.output, x.shape)
        self._active = self.module.training
        if not self._active:
            return out.copy_(x)
        mask = keep_mask_(resized(self.mask, x.shape), self.p).div_(1.0 - self.p)
        return torch.mul(x, mask, out=out)

    def backward(self, x: Tensor, g: Tensor) -> Tensor:
        gi = resized(self.grad_input, g.shape)
        if not self._active:
            return gi.copy_(g)
        return torch.mul(g, self.mask, out=gi)
