"""The recurrent cell contract: what one cell type provides, all of it in its own file.

A cell is one layer of a recurrent stack at one position. As Torch7's Linear.lua keeps a
layer's forward, gradient and parameter gradient together, a cell's file holds everything
about it:

    forward         the module form, recorded by autograd (`train.executor: autograd`)
    fused           the fused cell into persistent buffers (`nmt.wiring.Buf`): the fused
                    granularity's node and inference with a fused model
    fused_backward  its hand-written backward, parameter gradients included
    FUSED           the fused node's buffers and what its backward reads (the planner's facts)
    wire            the cell as nngraph nodes (the nngraph granularity), via `nmt.wiring.Wiring`
    STATE           what it carries from one position to the next, each B x H; the first is
                    its output (the next layer's input, the encoder's context column)
    GATES           blocks of H in its input products: i2h = Linear(I, GATES H) with a bias,
                    h2h = Linear(H, GATES H) without (seq2seq-attn's layout)
    KERNEL_GATES, kernel   torch's fused RNN kernel on the same parameters (cuDNN, oneDNN)
    weight_gates    the order of the gate blocks in this layer's weights: None, the cell's
                    own; the weights a training step computes with may be in a kernel's
                    (`nmt.engine.weights`), for a step form that reads them so
    STEP_OP         the registered op (`nmt.kernels`) whose form of the fused step a device
                    runs: this file's (its reference) or a kernel's (the fused CUDA cells)

`nmt.cells` registers the types by their `model.rnn_type` name. Shapes: B batch, I input
size, H rnn_size, S positions.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from torch import Tensor, nn

from nmt.kernels import KernelOp
from nmt.wiring import Buf, FusedBuffers, FusedFacts, Value, Wiring, fresh

State = tuple[Tensor, ...]  # one layer's state, in the order of `STATE`


class Packer(Protocol):
    """Packs a cell's gate weight once for search and runs its product from the pack
    (`nmt.kernels.PACKED_LINEAR`'s forms; `nmt.translate.quantize.Int8Products`)."""

    def pack(self, weight: Tensor, bias: Tensor | None) -> Any:
        """The packed (O x I) `weight` (with `bias` where the form keeps it), or None where
        it cannot be packed."""
        ...

    def linear(self, x: Tensor, packed: Any, bias: Tensor | None) -> Tensor:
        """x (N x I) @ weight^T + bias from the pack."""
        ...


class RecurrentLayer(nn.Module):
    """One layer of a recurrent stack: the parameters, and the cell in every form."""

    SUMMARY: ClassVar[str]  # one line: the config reference
    STATE: ClassVar[tuple[str, ...]]
    GATES: ClassVar[int]
    FUSED: ClassVar[FusedFacts]
    KERNEL_GATES: ClassVar[tuple[int, ...]]  # the kernel's gate blocks, as indices of ours
    STEP_OP: ClassVar[KernelOp]  # the fused step's forms by device (`nmt.kernels`)
    weight_gates: tuple[int, ...] | None = None  # the weights' gate blocks, as ours (None: ours)

    def __init__(self, input_size: int, rnn_size: int):
        super().__init__()
        self.i2h = nn.Linear(input_size, self.GATES * rnn_size)
        self.h2h = nn.Linear(rnn_size, self.GATES * rnn_size, bias=False)

    def forward(self, x: Tensor, state: State, fused: bool = False) -> State:
        """x B x I and the state -> the next state. `fused`: the fused cell (no gradient is
        recorded: its in-place ops are not for autograd)."""
        if fused:
            return self.fused(x, state)
        return self.cell(x, state)

    def cell(self, x: Tensor, state: State) -> State:
        """The module form."""
        raise NotImplementedError

    def pack_for_search(self, packer: Packer | None = None) -> bool:
        """Prepare the fused cell's products for a model that only searches from here on:
        from a weight packed once by `packer` (`nmt translate --quantize int8`'s 8-bit
        products), or without one where this device has a faster form (oneDNN's packed
        weights on a CPU: `nmt.onednn`). Whether the cell now runs from a pack; a cell
        without such a form keeps its products (False)."""
        return False

    def fused(self, x: Tensor, state: State, buf: Buf = fresh) -> State:
        """The fused cell, into the buffers `buf` gives."""
        raise NotImplementedError

    def fused_forward(self, inputs: tuple[Tensor, ...], buf: Buf) -> State:
        """The fused node's forward: inputs (x, *state)."""
        x, *state = inputs
        return self.fused(x, tuple(state), buf)

    def fused_backward(
        self, inputs: tuple[Tensor, ...], grads: tuple[Tensor, ...], bufs: FusedBuffers
    ) -> None:
        """d loss / d (x, *state) into the `FUSED.grad_inputs` buffers from the gradients of
        the next state; the parameters' gradients added into their `.grad`."""
        raise NotImplementedError

    def wire(self, g: Wiring, prefix: str, x: Value, state: tuple[Value, ...]) -> tuple:
        """The cell as nngraph nodes named `prefix` + a node name; returns the next state."""
        raise NotImplementedError

    @staticmethod
    def kernel(
        x: Tensor, zeros: Tensor, weights: list[Tensor], layers: int, train: bool
    ) -> tuple[Tensor, list[State]]:
        """torch's RNN kernel over x S x B x I from zero states (`zeros`: layers x B x H)
        with `weights` in its layout: the top layer's output at every position S x B x H,
        and every layer's final state."""
        raise NotImplementedError

    @classmethod
    def gate_row_blocks(cls, order: tuple[int, ...], rnn_size: int) -> list[tuple[slice, slice]]:
        """The gate rows of weights in `order` (blocks of H, as indices of ours) as pairs
        (rows there, the same rows in ours), adjacent blocks merged: a copy between the two
        layouts is one copy of views per pair."""
        H, pairs = rnn_size, []
        for j, b in enumerate(order):
            if pairs and pairs[-1][1].stop == b * H and pairs[-1][0].stop == j * H:
                there, ours = pairs.pop()
                pairs.append((slice(there.start, (j + 1) * H), slice(ours.start, (b + 1) * H)))
            else:
                pairs.append((slice(j * H, (j + 1) * H), slice(b * H, (b + 1) * H)))
        return pairs

    @classmethod
    def macs(cls, input_size: int, rnn_size: int) -> int:
        """Multiply-adds of the two products of one position (memreport's FLOPs)."""
        return cls.GATES * rnn_size * (input_size + rnn_size)
