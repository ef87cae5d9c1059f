"""The fused LSTM cell: one implementation for the clone executor and for inference.

With `model.granularity: fused` the clone executor's LSTM node (`nmt.engine.fused.LSTMCell`)
calls `lstm_cell` with its persistent buffers, and `nmt.model` calls it without any (every
op then allocates its result) wherever no gradient is recorded: translation, validation,
scoring. Eight ops where the module form (`nmt.model.LSTMLayer`) takes twelve:

    gates = b + x W_ih^T + h W_hh^T     one buffer, filled by two products (addmm, addmm_)
    i f o |= sigmoid,  g |= tanh         in place on the slices of that buffer (two ops)
    c' = f*c + i*g                       mul, addcmul_
    h' = o * tanh(c')                    tanh, mul

Gates in the order i f o g, as `nmt.model.LSTMLayer`. The result equals the module form to
rounding, not bit for bit (the recurrent product is accumulated into the gates, and the
cell update uses a fused multiply-add).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# buf(name, shape): the persistent buffer `name` resized to `shape`, or None for a new tensor
Buf = Callable[[str, tuple[int, ...]], Tensor | None]


def fresh(name: str, shape: tuple[int, ...]) -> None:
    """The `Buf` of inference: no persistent buffers, every op allocates its result."""
    return None


def lstm_cell(
    x: Tensor,
    h: Tensor,
    c: Tensor,
    w_ih: Tensor,
    b_ih: Tensor,
    w_hh: Tensor,
    buf: Buf = fresh,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One LSTM layer at one position: returns (h', c', the activated gates B x 4H,
    tanh(c')), written into the buffers "h", "c", "gates", "tanh_c" that `buf` gives."""
    B, H = h.shape
    gates = torch.addmm(b_ih, x, w_ih.t(), out=buf("gates", (B, 4 * H)))
    gates.addmm_(h, w_hh.t())
    gates[:, : 3 * H].sigmoid_()
    gates[:, 3 * H :].tanh_()
    i, f, o, g = gates.chunk(4, 1)
    c_next = torch.mul(f, c, out=buf("c", (B, H)))
    c_next.addcmul_(i, g)
    tanh_c = torch.tanh(c_next, out=buf("tanh_c", (B, H)))
    h_next = torch.mul(o, tanh_c, out=buf("h", (B, H)))
    return h_next, c_next, gates, tanh_c
