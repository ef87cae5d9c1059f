"""The fused granularity's LSTM and GRU cell steps through torch's fused CUDA cell kernels.

torch ships the pointwise part of a cell step as one CUDA kernel each way:

    aten._thnn_fused_lstm_cell(input_gates, hidden_gates, cx, input_bias, hidden_bias)
        -> (hy, cy, workspace)         gates i f g o; workspace: the four activated gates
    aten._thnn_fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias)
        -> (grad_gates, grad_cx, grad_bias)
    aten._thnn_fused_gru_cell(input_gates, hidden_gates, hx, input_bias, hidden_bias)
        -> (hy, workspace)             gates r z n; hy = n + z (hx - n);
                                       workspace: r, z, n, hx and hidden_gates' n block
    aten._thnn_fused_gru_cell_backward(grad_hy, workspace, has_bias)
        -> (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias)

CUDA and (but for the GRU's, registered below) Meta kernels, no CPU kernel. With the
products around them an LSTM cell step is 11 ops (4 forward, 7 backward) where the
reference cell takes 23, a GRU step 11 where it takes 21; 8 where the executor gives the
step a window for its weight gradients (`FusedBuffers.window_slot`,
`nmt.engine.weight_grads`): the backward's one copy takes its gate gradients and inputs
there too, and `add_weight_grads` adds the window's positions at once. The LSTM's product
that writes h's gradient adds what the executor hands it (`FusedBuffers.addend`: the
encoder's context gradient) in the same op.

`nmt`'s LSTM keeps its gates in the order i f o g (seq2seq-attn's), the kernel reads and
writes i f g o. The step computes with weights whose gate rows are in the kernel's order
(`CellForm.weight_gates`), as the training step holds them (`nmt.engine.weights`: a mixed
precision's compute copy made in that order; in one dtype the masters' gate blocks swapped
in place for the step), so that its products come out in the kernel's order and its gate
gradients go into the products as they come - no permutation at any position. Between
steps the masters, the checkpoints and every other form keep seq2seq-attn's order. The
GRU's gates r z n are the kernel's.

The numbers are the reference cell's to rounding, not bitwise: the kernel computes the
gate activations, the cell update and tanh(c') in one pass in float32 arithmetic (its
accumulate type; bfloat16 and float16 rounded once at the end, where the reference rounds
after every op), contracts f c + i g as the compiler chooses, and its backward recomputes
tanh(c') from c' where the reference saves it. Gradients agree within the tolerances of
scripts/gpu_check.sh's check.

Buffers: the kernels return new tensors, which are copied into the node's buffers (one
`_foreach_copy_` each way), so the outputs stay preallocated and shared as the plan says;
each call's returned tensors are transients of one cell (B x 6H for the LSTM; its
backward's gate gradients, B x 4H, go straight into the products), freed before the next.
The facts differ from the reference cell's (`FUSED` below): the LSTM saves the kernel's
workspace, reads its own output c' rather than a saved tanh(c'); the GRU saves the
workspace (B x 5H) in place of its gates and recurrent product.

On the CPU each kernel runs as `EMULATED_*`, written from the contract above, so that the
planner's probe of a CUDA run and the tests see the buffers and reads of this form; the
counts of a step's ops through this form are taken on meta, where each kernel is one op.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nmt.kernels.ops import GRU_CELL, LSTM_CELL, add_row_sums
from nmt.wiring import Buf, FusedBuffers, FusedFacts

aten = torch.ops.aten
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def on_cuda(device: str, dtype: torch.dtype) -> bool:
    return device == "cuda" and dtype in FLOATS


def has_cuda_kernels(*names: str) -> bool:
    """Whether this torch has CUDA kernels for the aten ops `names`; where it has not, the
    reference cell serves, and one line on stderr says so (once). A torch without CUDA runs
    nothing there: its stand-ins (the planner's probe, meta) choose as a CUDA build would.
    Only the kernels' presence is cached: whether CUDA is there is asked at each choice."""
    return not torch.cuda.is_available() or _cuda_kernels_present(names)


@functools.cache
def _cuda_kernels_present(names: tuple[str, ...]) -> bool:
    missing = [
        n for n in names if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{n}", "CUDA")
    ]
    if missing:
        print(
            f"nmt: this torch has no CUDA kernel for {', '.join(missing)}: the fused "
            "granularity's cells run their reference form on CUDA",
            file=sys.stderr,
        )
    return not missing


def _serves(*names: str) -> Callable[[str, torch.dtype], bool]:
    return lambda device, dtype: on_cuda(device, dtype) and has_cuda_kernels(*names)


# ---- the kernels' contract on the CPU ------------------------------------------------------


def _contiguous(*tensors: Tensor | None) -> None:
    """The CUDA kernels index their arguments as contiguous blocks (torch checks the forward's
    and reads the backward's so): the emulation refuses what they would misread."""
    if not all(t is None or t.is_contiguous() for t in tensors):
        raise RuntimeError("the fused cell kernels take contiguous tensors")


def _emulated_lstm(
    input_gates: Tensor,
    hidden_gates: Tensor,
    cx: Tensor,
    input_bias: Tensor | None = None,
    hidden_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    _contiguous(input_gates, hidden_gates, cx, input_bias, hidden_bias)
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _emulated_lstm_backward(
    grad_hy: Tensor | None,
    grad_cy: Tensor | None,
    cx: Tensor,
    cy: Tensor,
    workspace: Tensor,
    has_bias: bool,
) -> tuple[Tensor, Tensor, Tensor | None]:
    _contiguous(grad_hy, grad_cy, cx, cy, workspace)
    i, f, g, o = workspace.chunk(4, 1)
    go = grad_hy if grad_hy is not None else torch.zeros_like(cx)
    gc = go * o * (1 - cy.tanh() ** 2) + (grad_cy if grad_cy is not None else 0)
    grad_gates = torch.cat(
        [
            gc * g * (1 - i) * i,
            gc * cx * (1 - f) * f,
            gc * i * (1 - g * g),
            go * cy.tanh() * (1 - o) * o,
        ],
        1,
    )
    return grad_gates, gc * f, grad_gates.sum(0) if has_bias else None


def _emulated_gru(
    input_gates: Tensor,
    hidden_gates: Tensor,
    hx: Tensor,
    input_bias: Tensor | None = None,
    hidden_bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    _contiguous(input_gates, hidden_gates, hx, input_bias, hidden_bias)
    if input_bias is not None:
        input_gates, hidden_gates = input_gates + input_bias, hidden_gates + hidden_bias
    i_r, i_z, i_n = input_gates.chunk(3, 1)
    h_r, h_z, h_n = hidden_gates.chunk(3, 1)
    r, z = (i_r + h_r).sigmoid(), (i_z + h_z).sigmoid()
    n = (i_n + r * h_n).tanh()
    return n + z * (hx - n), torch.cat([r, z, n, hx, h_n], 1)


def _emulated_gru_backward(grad_hy: Tensor, workspace: Tensor, has_bias: bool) -> tuple:
    _contiguous(grad_hy, workspace)
    r, z, n, hx, h_n = workspace.chunk(5, 1)
    g_n = grad_hy * (1 - z) * (1 - n * n)
    g_z = grad_hy * (hx - n) * (1 - z) * z
    g_r = g_n * h_n * (1 - r) * r
    grad_input = torch.cat([g_r, g_z, g_n], 1)
    grad_hidden = torch.cat([g_r, g_z, g_n * r], 1)
    biases = (grad_input.sum(0), grad_hidden.sum(0)) if has_bias else (None, None)
    return grad_input, grad_hidden, grad_hy * z, *biases


# ---- a meta form where torch has none (the GRU's), and the LSTM's without biases ------------


def _gru_meta(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):  # noqa: ANN001, ANN202
    B, H = hx.shape
    return hx.new_empty((B, H)), input_gates.new_empty((B, 5 * H))


def _gru_backward_meta(grad_hy, workspace, has_bias):  # noqa: ANN001, ANN202
    B, H = grad_hy.shape
    biases = (workspace.new_empty(3 * H), workspace.new_empty(3 * H)) if has_bias else (None, None)
    new = workspace.new_empty
    return new((B, 3 * H)), new((B, 3 * H)), new((B, H)), *biases


_META_LIBRARY = torch.library.Library("aten", "IMPL")  # noqa: TID251 - kept for the process
for _name, _fn in (
    ("_thnn_fused_gru_cell", _gru_meta),
    ("_thnn_fused_gru_cell_backward", _gru_backward_meta),
):
    if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{_name}", "Meta"):
        _META_LIBRARY.impl(_name, _fn, "Meta")


@functools.cache
def _meta_zeros(n: int) -> Tensor:
    """torch's LSTM cell meta form wants both biases (it reads their devices): zeros."""
    return torch.empty(n, device="meta")


def _meta_lstm(input_gates: Tensor, hidden_gates: Tensor, cx: Tensor) -> tuple:
    zeros = _meta_zeros(input_gates.shape[1])
    return aten._thnn_fused_lstm_cell(input_gates, hidden_gates, cx, zeros, zeros)


@dataclass(frozen=True)
class CellKernels:
    """The pair of kernels a cell step calls, on one kind of device."""

    forward: Any
    backward: Any


ATEN_LSTM = CellKernels(aten._thnn_fused_lstm_cell, aten._thnn_fused_lstm_cell_backward_impl)
META_LSTM = CellKernels(_meta_lstm, aten._thnn_fused_lstm_cell_backward_impl)
EMULATED_LSTM = CellKernels(_emulated_lstm, _emulated_lstm_backward)
ATEN_GRU = CellKernels(aten._thnn_fused_gru_cell, aten._thnn_fused_gru_cell_backward)
EMULATED_GRU = CellKernels(_emulated_gru, _emulated_gru_backward)


# ---- the cell steps -----------------------------------------------------------------------


class FusedLSTMStep:
    """The LSTM cell step of one layer through the fused kernels (a `Fusable`), on weights
    whose gate rows are in the kernel's order (`READS_KERNEL_GATES`)."""

    FUSED = FusedFacts(
        outputs=("h", "c"),
        grad_inputs=("grad_x", "grad_h", "grad_c"),
        reads_inputs=(0, 1, 2),  # x and h for the weights' gradients, c for the forget gate's
        saved=("gates",),  # the kernel's workspace: the activated gates, i f g o
        forward_scratch=("gate_sums",),
        backward_scratch=("ones",),
        reads_output=True,  # c': the kernel recomputes tanh(c') from it
        window_parts=("gates", "x", "h"),
        adds_to=(1,),  # h's gradient: the product adds it
    )
    READS_KERNEL_GATES = True

    def __init__(self, layer: Any, kernels: CellKernels, device: torch.device):
        if layer.weight_gates != layer.KERNEL_GATES:
            raise ValueError(
                f"the fused CUDA LSTM step computes with gate rows in the kernel's order "
                f"{layer.KERNEL_GATES}, this layer's are in {layer.weight_gates or 'its own'}: "
                "bind it to the weights a training step computes with (nmt.engine.weights)"
            )
        self.layer, self.kernels = layer, kernels

    def fused_forward(self, inputs: tuple[Tensor, ...], buf: Buf) -> tuple[Tensor, Tensor]:
        x, h, c = inputs
        B, H = h.shape
        layer = self.layer
        sums = buf("gate_sums", (2, B, 4 * H))  # [x W_ih^T + b ; h W_hh^T], the kernel's order
        torch.addmm(layer.i2h.bias, x, layer.i2h.weight.t(), out=sums[0])
        torch.mm(h, layer.h2h.weight.t(), out=sums[1])
        hy, cy, workspace = self.kernels.forward(sums[0], sums[1], c)
        outs = [buf("h", (B, H)), buf("c", (B, H)), buf("gates", (B, 4 * H))]
        torch._foreach_copy_(outs, [hy, cy, workspace])
        return outs[0], outs[1]

    def fused_backward(
        self, inputs: tuple[Tensor, ...], grads: tuple[Tensor, ...], bufs: FusedBuffers
    ) -> None:
        x, h, c = inputs
        g_h, g_c = grads
        B, H = h.shape
        layer = self.layer
        gg, grad_c, _ = self.kernels.backward(
            g_h, g_c, c, bufs.saved("c"), bufs.saved("gates"), False
        )
        slot = bufs.window_slot((tuple(gg.shape), tuple(x.shape), tuple(h.shape)))
        if slot is None:
            bufs("grad_c", (B, H)).copy_(grad_c)
        else:  # the weights' gradients left for the window's flush, in the same one op
            torch._foreach_copy_([bufs("grad_c", (B, H)), *slot], [grad_c, gg, x, h])
        torch.mm(gg, layer.i2h.weight, out=bufs("grad_x", tuple(x.shape)))
        grad_h, addend = bufs("grad_h", (B, H)), bufs.addend("grad_h")
        if addend is None:
            torch.mm(gg, layer.h2h.weight, out=grad_h)
        else:  # the state's other gradient (the encoder's top: its context gradient)
            torch.addmm(addend, gg, layer.h2h.weight, out=grad_h)
        if slot is None:
            self.add_weight_grads(gg, x, h, bufs.constant("ones", (B,), 1.0))

    def add_weight_grads(self, gates: Tensor, x: Tensor, h: Tensor, ones: Tensor) -> None:
        """The weights' gradients of the rows of `gates` (d loss / d gate sums), `x` and `h`
        (the inputs they came from): one position's, or a window's (`window_parts`)."""
        layer = self.layer
        layer.i2h.weight.grad.addmm_(gates.t(), x)
        layer.h2h.weight.grad.addmm_(gates.t(), h)
        add_row_sums(layer.i2h.bias.grad, gates, ones)


class FusedGRUStep:
    """The GRU cell step of one layer through the fused kernels (a `Fusable`)."""

    READS_KERNEL_GATES = False  # the kernel's r z n are the GRU's

    FUSED = FusedFacts(
        outputs=("h",),
        grad_inputs=("grad_x", "grad_h"),
        reads_inputs=(0, 1),  # x and h for the weights' gradients
        saved=("workspace",),  # r, z, n, h and gh[n]: B x 5H
        forward_scratch=("gates", "hidden"),
        backward_scratch=("grad_gates", "grad_hidden", "ones"),
        window_parts=("gates", "hidden", "x", "h"),
    )

    def __init__(self, layer: Any, kernels: CellKernels, device: torch.device):
        self.layer, self.kernels = layer, kernels

    def fused_forward(self, inputs: tuple[Tensor, ...], buf: Buf) -> tuple[Tensor]:
        x, h = inputs
        B, H = h.shape
        layer = self.layer
        gi = torch.addmm(layer.i2h.bias, x, layer.i2h.weight.t(), out=buf("gates", (B, 3 * H)))
        gh = torch.mm(h, layer.h2h.weight.t(), out=buf("hidden", (B, 3 * H)))
        hy, workspace = self.kernels.forward(gi, gh, h)
        outs = [buf("h", (B, H)), buf("workspace", (B, 5 * H))]
        torch._foreach_copy_(outs, [hy, workspace])
        return (outs[0],)

    def fused_backward(
        self, inputs: tuple[Tensor, ...], grads: tuple[Tensor, ...], bufs: FusedBuffers
    ) -> None:
        x, h = inputs
        (g_h,) = grads
        B, H = h.shape
        layer = self.layer
        got = self.kernels.backward(g_h, bufs.saved("workspace"), False)
        grad_h = bufs("grad_h", (B, H))
        slot = bufs.window_slot(((B, 3 * H), (B, 3 * H), tuple(x.shape), (B, H)))
        if slot is None:
            gg, gh = bufs("grad_gates", (B, 3 * H)), bufs("grad_hidden", (B, 3 * H))
            torch._foreach_copy_([gg, gh, grad_h], list(got[:3]))
        else:  # the gate gradients go to the window, with the inputs, in the same one op
            gg, gh = slot[0], slot[1]
            torch._foreach_copy_([*slot, grad_h], [got[0], got[1], x, h, got[2]])
        torch.mm(gg, layer.i2h.weight, out=bufs("grad_x", tuple(x.shape)))
        grad_h.addmm_(gh, layer.h2h.weight)
        if slot is None:
            self.add_weight_grads(gg, gh, x, h, bufs.constant("ones", (B,), 1.0))

    def add_weight_grads(
        self, gates: Tensor, hidden: Tensor, x: Tensor, h: Tensor, ones: Tensor
    ) -> None:
        """The weights' gradients of the rows of `gates` and `hidden` (d loss / d the input
        and recurrent products), `x` and `h`: one position's, or a window's."""
        layer = self.layer
        layer.i2h.weight.grad.addmm_(gates.t(), x)
        layer.h2h.weight.grad.addmm_(hidden.t(), h)
        add_row_sums(layer.i2h.bias.grad, gates, ones)


@dataclass(frozen=True)
class CellForm:
    """Binds a layer to a cell step over one device's kernels (what `LSTM_CELL` and
    `GRU_CELL` choose between)."""

    step: type
    kernels: CellKernels

    def bind(self, layer: Any, device: torch.device) -> Any:
        return self.step(layer, self.kernels, device)

    def weight_gates(self, layer_type: Any) -> tuple[int, ...] | None:
        """The gate order the step reads its layer's weights in (None: the cell's own)."""
        if not self.step.READS_KERNEL_GATES:
            return None
        order = tuple(layer_type.KERNEL_GATES)
        return None if order == tuple(range(layer_type.GATES)) else order

    def runs_on(self, device_type: str) -> bool:
        return device_type in ("cuda", "meta")


LSTM_CELL.register(
    "cuda_fused",
    _serves("_thnn_fused_lstm_cell", "_thnn_fused_lstm_cell_backward_impl"),
    CellForm(FusedLSTMStep, ATEN_LSTM),
    forms={
        "meta": CellForm(FusedLSTMStep, META_LSTM),
        "cpu": CellForm(FusedLSTMStep, EMULATED_LSTM),
    },
    note="CUDA: torch's fused LSTM cell kernel each way, on weights in its gate order",
)
GRU_CELL.register(
    "cuda_fused",
    _serves("_thnn_fused_gru_cell", "_thnn_fused_gru_cell_backward"),
    CellForm(FusedGRUStep, ATEN_GRU),
    forms={"cpu": CellForm(FusedGRUStep, EMULATED_GRU)},
    note="CUDA: torch's fused GRU cell kernel each way",
)
