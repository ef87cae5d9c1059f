"""The GRU cell, as torch's nn.GRU (cuDNN's) defines it, in every form (`model.rnn_type: gru`).

    gi = x W_ih^T + b,  gh = h W_hh^T        i2h (with bias) + h2h (without), B x 3H each
    r = sigmoid(gi[r] + gh[r])               reset gate
    z = sigmoid(gi[z] + gh[z])               update gate
    n = tanh(gi[n] + r * gh[n])              candidate (the reset applied after the product)
    h' = (1 - z) * n + z * h

State (h); gates in the order r z n, nn.GRU's, so torch's kernel takes the parameters as they
are (its recurrent bias zero). The fused cell takes seven ops: two products, the sum and the
sigmoids of r and z in place, n's reset-product and tanh in place, and h' as one `lerp`
(n + z (h - n)); its backward reads x and h (the weight gradients, and h for z's), the
activated gates and the recurrent product gh - what nngraph's nodes keep, one B x H less.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.cells.base import RecurrentLayer, State
from nmt.kernels import GRU_CELL, add_row_sums
from nmt.nodes.modules import CAdd, CMul, Linear, OneMinus, Sigmoid, Split, Tanh
from nmt.wiring import Buf, FusedBuffers, FusedFacts, Value, Wiring, fresh

_sigmoid_backward = torch.ops.aten.sigmoid_backward.grad_input
_tanh_backward = torch.ops.aten.tanh_backward.grad_input


class GRULayer(RecurrentLayer):
    """One GRU layer: i2h (with bias) + h2h (without), gates r z n."""

    SUMMARY = "the GRU of torch's nn.GRU (state h)"
    STATE = ("h",)
    GATES = 3
    FUSED = FusedFacts(
        outputs=("h",),
        grad_inputs=("grad_x", "grad_h"),
        reads_inputs=(0, 1),
        saved=("gates", "hidden"),
        backward_scratch=("grad_gates", "grad_hidden", "ones"),
    )
    STEP_OP = GRU_CELL  # the fused step by device: this file's, or a kernel's (nmt.kernels)
    KERNEL_GATES = (0, 1, 2)  # torch's r z n are ours

    def cell(self, x: Tensor, state: State) -> State:
        (h,) = state
        i_r, i_z, i_n = self.i2h(x).chunk(3, dim=1)
        h_r, h_z, h_n = self.h2h(h).chunk(3, dim=1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return ((1 - z) * n + z * h,)

    def fused(self, x: Tensor, state: State, buf: Buf = fresh) -> State:
        """Into the buffers "gates" (r z n activated, B x 3H), "hidden" (gh) and "h"."""
        (h,) = state
        B, H = h.shape
        gates = torch.addmm(self.i2h.bias, x, self.i2h.weight.t(), out=buf("gates", (B, 3 * H)))
        hidden = torch.mm(h, self.h2h.weight.t(), out=buf("hidden", (B, 3 * H)))
        gates[:, : 2 * H].add_(hidden[:, : 2 * H]).sigmoid_()
        r, z, n = gates.chunk(3, 1)
        n.addcmul_(r, hidden[:, 2 * H :]).tanh_()
        return (torch.lerp(n, h, z, out=buf("h", (B, H))),)

    def fused_backward(
        self, inputs: tuple[Tensor, ...], grads: tuple[Tensor, ...], bufs: FusedBuffers
    ) -> None:
        x, h = inputs
        (g_h,) = grads
        B, H = h.shape
        gates, hidden = bufs.saved("gates"), bufs.saved("hidden")
        r, z, n = gates.chunk(3, 1)
        gg = bufs("grad_gates", (B, 3 * H))  # d loss / d gi
        g_r, g_z, g_n = gg.chunk(3, 1)
        grad_h = bufs("grad_h", (B, H))
        torch.mul(g_h, z, out=grad_h)  # h's part through z h
        torch.sub(g_h, grad_h, out=g_n)  # dL/dn = g_h (1 - z)
        _tanh_backward(g_n, n, grad_input=g_n)  # ... through the tanh
        torch.sub(h, n, out=g_z).mul_(g_h)  # dL/dz = g_h (h - n)
        torch.mul(g_n, hidden[:, 2 * H :], out=g_r)  # dL/dr = dn gh[n]
        rz = gg[:, : 2 * H]
        _sigmoid_backward(rz, gates[:, : 2 * H], grad_input=rz)
        gh = bufs("grad_hidden", (B, 3 * H))  # d loss / d gh: r and z as gi's, n times r
        gh[:, : 2 * H].copy_(rz)
        torch.mul(g_n, r, out=gh[:, 2 * H :])
        w_ih, w_hh = self.i2h.weight, self.h2h.weight
        torch.mm(gg, w_ih, out=bufs("grad_x", tuple(x.shape)))
        grad_h.addmm_(gh, w_hh)
        w_ih.grad.addmm_(gg.t(), x)
        w_hh.grad.addmm_(gh.t(), h)
        add_row_sums(self.i2h.bias.grad, gg, bufs.constant("ones", (B,), 1.0))

    def wire(self, g: Wiring, prefix: str, x: Value, state: tuple[Value, ...]) -> tuple:
        """15 nodes, as OpenNMT-lua's GRU: i2h, h2h, a split of each, r's and z's sums and
        sigmoids, r * gh[n], n's sum and tanh, z * h, 1 - z, (1 - z) * n, h'."""
        (h,) = state
        p = prefix
        i2h = g.add(Linear, p + "i2h", x, weight=self.i2h.weight, bias=self.i2h.bias)
        h2h = g.add(Linear, p + "h2h", h, weight=self.h2h.weight, bias=None)
        i_r, i_z, i_n = g.add(Split, p + "split_i2h", i2h, n=3)
        h_r, h_z, h_n = g.add(Split, p + "split_h2h", h2h, n=3)
        reset = g.add(Sigmoid, p + "reset_gate", g.add(CAdd, p + "reset_sum", i_r, h_r))
        update = g.add(Sigmoid, p + "update_gate", g.add(CAdd, p + "update_sum", i_z, h_z))
        reset_h = g.add(CMul, p + "reset_h", reset, h_n)
        candidate_sum = g.add(CAdd, p + "candidate_sum", i_n, reset_h)
        candidate = g.add(Tanh, p + "candidate", candidate_sum)
        keep = g.add(CMul, p + "keep_h", update, h)
        one_minus = g.add(OneMinus, p + "one_minus_update", update)
        new = g.add(CMul, p + "new_h", one_minus, candidate)
        return (g.add(CAdd, p + "next_h", new, keep),)

    @staticmethod
    def kernel(
        x: Tensor, zeros: Tensor, weights: list[Tensor], layers: int, train: bool
    ) -> tuple[Tensor, list[State]]:
        out, h = torch.gru(x, zeros, weights, True, layers, 0.0, train, False, False)
        return out, [(layer,) for layer in h.unbind(0)]
