"""The LSTM cell as seq2seq-attn builds it, in every form (`model.rnn_type: lstm`).

    gates = x W_ih^T + b + h W_hh^T          i2h (with bias) + h2h (without), B x 4H
    i, f, o = sigmoid(gates[i, f, o]),  g = tanh(gates[g])
    c' = f * c + i * g
    h' = o * tanh(c')

State (h, c); gates in the order i f o g. The fused cell takes eight ops where the module
form takes twelve: one gates buffer filled by two products (addmm, addmm_), the activations
in place on its slices (two ops), the cell update as mul + addcmul_, then tanh and mul. It
equals the module form to rounding, not bit for bit (the recurrent product is accumulated
into the gates, and the cell update is a fused multiply-add). Its backward reads the three
inputs (x and h for the weight gradients, c for the forget gate's), the activated gates and
tanh(c'): what nngraph's nodes keep, so the fused cell holds no more memory than they do.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from nmt.cells.base import Packer, RecurrentLayer, State
from nmt.kernels import LSTM_CELL, PACKED_LINEAR, add_row_sums
from nmt.nodes.modules import CAdd, CMul, Linear, Sigmoid, Split, Tanh
from nmt.wiring import Buf, FusedBuffers, FusedFacts, Value, Wiring, fresh

_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward = torch.ops.aten.tanh_backward.grad_input


class LSTMLayer(RecurrentLayer):
    """One LSTM layer: i2h (with bias) + h2h (without), gates i f o g."""

    SUMMARY = "the LSTM of seq2seq-attn (state h, c)"
    STATE = ("h", "c")
    GATES = 4
    FUSED = FusedFacts(
        outputs=("h", "c"),
        grad_inputs=("grad_x", "grad_h", "grad_c"),
        reads_inputs=(0, 1, 2),
        saved=("gates", "tanh_c"),
        backward_scratch=("grad_gates", "grad_next_c", "ones"),
    )
    STEP_OP = LSTM_CELL  # the fused step by device: this file's, or a kernel's (nmt.kernels)
    KERNEL_GATES = (0, 1, 3, 2)  # torch's gates i f g o as blocks of ours (i f o g)
    packed_gates: Any = None  # a pack of [W_ih W_hh] (oneDNN's, or int8), for search only

    def pack_for_search(self, packer: Packer | None = None) -> bool:
        """Let the fused cell's gates be one product of [x h] with [W_ih W_hh], packed once
        by `packer`, or without one by oneDNN where this device and dtype have it
        (`nmt.kernels.PACKED_LINEAR`; None where it cannot be). A `packer` that cannot pack
        leaves the layer as it was. For a model that only searches from here on: the pack
        does not follow the weights."""
        weight = torch.cat([self.i2h.weight, self.h2h.weight], 1).detach()
        chosen = packer or PACKED_LINEAR.choose(weight.device, weight.dtype)
        packed = chosen.pack(weight, self.i2h.bias)
        if packer is not None and packed is None:
            return self.packed_gates is not None
        self._packer, self.packed_gates = chosen, packed
        return packed is not None

    def cell(self, x: Tensor, state: State) -> State:
        h, c = state
        gates = self.i2h(x) + self.h2h(h)
        i, f, o, g = gates.chunk(4, dim=1)
        next_c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        next_h = torch.sigmoid(o) * torch.tanh(next_c)
        return next_h, next_c

    def fused(self, x: Tensor, state: State, buf: Buf = fresh) -> State:
        """Into the buffers "gates" (activated, B x 4H), "c", "tanh_c" and "h" (the gates a
        fresh tensor where the layer is packed for search, `pack_for_search`)."""
        h, c = state
        B, H = h.shape
        if self.packed_gates is not None:  # [x h] @ [W_ih W_hh]^T + b: one product
            gates = self._packer.linear(torch.cat([x, h], 1), self.packed_gates, self.i2h.bias)
        else:
            gates = torch.addmm(self.i2h.bias, x, self.i2h.weight.t(), out=buf("gates", (B, 4 * H)))
            gates.addmm_(h, self.h2h.weight.t())
        gates[:, : 3 * H].sigmoid_()
        gates[:, 3 * H :].tanh_()
        i, f, o, g = gates.chunk(4, 1)
        c_next = torch.mul(f, c, out=buf("c", (B, H)))
        c_next.addcmul_(i, g)
        tanh_c = torch.tanh(c_next, out=buf("tanh_c", (B, H)))
        h_next = torch.mul(o, tanh_c, out=buf("h", (B, H)))
        return h_next, c_next

    def fused_backward(
        self, inputs: tuple[Tensor, ...], grads: tuple[Tensor, ...], bufs: FusedBuffers
    ) -> None:
        x, h, c = inputs
        g_h, g_c = grads
        B, H = h.shape
        gates, tanh_c = bufs.saved("gates"), bufs.saved("tanh_c")
        i, f, o, g = gates.chunk(4, 1)
        dc = torch.mul(g_h, o, out=bufs("grad_next_c", (B, H)))  # dL/dc' =
        _tanh_backward(dc, tanh_c, grad_input=dc)  # g_h o (1 - tanh(c')^2)
        dc.add_(g_c)  # + what the next position sends back
        gg = bufs("grad_gates", (B, 4 * H))
        g_i, g_f, g_o, g_g = gg.chunk(4, 1)
        torch.mul(dc, g, out=g_i)
        torch.mul(dc, c, out=g_f)
        torch.mul(g_h, tanh_c, out=g_o)
        torch.mul(dc, i, out=g_g)
        ifo = gg[:, : 3 * H]
        _sigmoid_backward(ifo, gates[:, : 3 * H], grad_input=ifo)
        _tanh_backward(g_g, g, grad_input=g_g)
        w_ih, w_hh = self.i2h.weight, self.h2h.weight
        torch.mul(dc, f, out=bufs("grad_c", (B, H)))
        torch.mm(gg, w_ih, out=bufs("grad_x", tuple(x.shape)))
        torch.mm(gg, w_hh, out=bufs("grad_h", (B, H)))
        w_ih.grad.addmm_(gg.t(), x)
        w_hh.grad.addmm_(gg.t(), h)
        add_row_sums(self.i2h.bias.grad, gg, bufs.constant("ones", (B,), 1.0))

    def wire(self, g: Wiring, prefix: str, x: Value, state: tuple[Value, ...]) -> tuple:
        """13 nodes, seq2seq-attn's: i2h, h2h, their sum, the split into i f o g, three
        sigmoids and a tanh, f*c, i*g, their sum c', tanh(c'), o*tanh(c')."""
        h, c = state
        p = prefix
        i2h = g.add(Linear, p + "i2h", x, weight=self.i2h.weight, bias=self.i2h.bias)
        h2h = g.add(Linear, p + "h2h", h, weight=self.h2h.weight, bias=None)
        gates = g.add(CAdd, p + "gates", i2h, h2h)
        i, f, o, t = g.add(Split, p + "split", gates, n=4)
        in_gate = g.add(Sigmoid, p + "in_gate", i)
        forget_gate = g.add(Sigmoid, p + "forget_gate", f)
        out_gate = g.add(Sigmoid, p + "out_gate", o)
        in_transform = g.add(Tanh, p + "in_transform", t)
        forget_c = g.add(CMul, p + "forget_c", forget_gate, c)
        in_c = g.add(CMul, p + "in_c", in_gate, in_transform)
        next_c = g.add(CAdd, p + "next_c", forget_c, in_c)
        tanh_c = g.add(Tanh, p + "tanh_c", next_c)
        next_h = g.add(CMul, p + "next_h", out_gate, tanh_c)
        return next_h, next_c

    @staticmethod
    def kernel(
        x: Tensor, zeros: Tensor, weights: list[Tensor], layers: int, train: bool
    ) -> tuple[Tensor, list[State]]:
        out, h, c = torch.lstm(x, (zeros, zeros), weights, True, layers, 0.0, train, False, False)
        return out, list(zip(h.unbind(0), c.unbind(0), strict=True))
