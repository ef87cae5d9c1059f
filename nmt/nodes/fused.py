"""The nodes of the fused granularity (`model.granularity: fused`): fewer, larger nodes.

nngraph's graph (`nmt.nodes.modules`) has a node per Torch7 module: an LSTM layer is 13
nodes, and each node's forward and backward are separate ops. Here one node does what a
group of them did, with a hand-written backward (the layer's own, for cells and attention):

    FusedLayer  a layer's own fused form: a cell at one position, or the attention
    Dropout     x * mask / (1 - p) as one op each way; the 0/1 mask drawn like nngraph's;
                its backward adds x's other gradient where the graph gives it one

(The output layer and the loss as one node, `OutputLoss`, is the engine's: `nmt.engine.generator`.)

The arithmetic is nngraph's to rounding (float64 gradients equal autograd to 1e-10). Each
node states the planner's facts like any other: what its backward reads, and which of its
own buffers are scratch that lives inside one forward() or one backward() call.

Shapes: B batch, S source length, H rnn_size, V target vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module

from nmt.kernels import keep_mask_
from nmt.nodes.node import Node, resized
from nmt.wiring import Fusable

_ZEROS: dict[tuple[torch.device, torch.dtype], Tensor] = {}


def _zero(device: torch.device, dtype: torch.dtype) -> Tensor:
    """A 0-dim zero: addcmul's `input` where only the product is wanted (one per device
    and dtype, made once and kept: a CUDA graph of a step reads it where it was)."""
    key = (device, dtype)
    if key not in _ZEROS:
        _ZEROS[key] = torch.zeros((), device=device, dtype=dtype)
    return _ZEROS[key]


def cached_constants() -> list[Tensor]:
    """The constants the fused nodes keep outside any node's buffers (`_zero`'s)."""
    return list(_ZEROS.values())


class _Fused(Node):
    """`_buf` is the `nmt.wiring.Buf` over the node's buffers, by attribute name. Buffers of
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


class FusedLayer(_Fused):
    """One layer of the model as one node: a recurrent cell at one position (`nmt.cells`) or
    the attention (`nmt.attention`), run by the layer's own `fused_forward` into this node's
    buffers and backward by its `fused_backward` - or, for a cell, by the form of its step
    that its `STEP_OP` chooses for the node's device and dtype (`nmt.kernels`), once. The
    layer's `FUSED` facts name the buffers and say what its backward reads; the node turns
    them into the planner's facts: outputs are roles `output` (or `output[i]`), the inputs'
    gradients `grad_input[i]`, every other buffer the role of its name."""

    def __init__(self, name: str, layer: Fusable, device: torch.device, dtype: torch.dtype):
        step_op = getattr(layer, "STEP_OP", None)  # a cell: its step as this device runs it
        if step_op is not None:
            layer = step_op.choose(device, dtype).bind(layer, device)
        facts = layer.FUSED
        self.layer, self.facts = layer, facts
        outs = facts.outputs
        single = len(outs) == 1 and not facts.tuple_output
        roles = {"output": outs[0]} if single else {f"output[{i}]": b for i, b in enumerate(outs)}
        roles |= {f"grad_input[{i}]": b for i, b in enumerate(facts.grad_inputs)}
        roles |= {b: b for b in (*facts.saved, *facts.forward_scratch, *facts.backward_scratch)}
        self.ROLES = roles
        self.N_INPUTS = len(facts.grad_inputs)
        self.BWD_READS_INPUTS = facts.reads_inputs
        self.BWD_READS_OUTPUT = facts.reads_output
        self.BWD_READS_ROLES = facts.saved
        self.FWD_SCRATCH_ROLES = facts.forward_scratch
        self.BWD_SCRATCH_ROLES = facts.backward_scratch
        self.ATTENTION_PRODUCTS = facts.attention_products
        self.ACCUMULATES_GRAD_INPUTS = facts.accumulates
        self.ADDENDS_TO_GRAD_INPUTS = facts.adds_to
        self.n_outputs = None if single else len(outs)
        self._into: dict[str, Tensor] = {}  # input gradients added into accumulators
        self._window: Any = None  # the executor's weight-gradient window (`defer_weight_grads`)
        self._addends: dict[str, Tensor] = {}  # input gradient -> its next backward's addend
        super().__init__(name, device, dtype)

    def _bind(self) -> None:
        outs = [getattr(self, b) for b in self.facts.outputs]
        self.output = outs[0] if self.n_outputs is None else tuple(outs)
        self.grad_input = tuple(getattr(self, b) for b in self.facts.grad_inputs)

    def accumulate_into(self, index: int, into: Tensor) -> None:
        """The buffer of that input's gradient becomes `into` (the executor's, not a role of
        this node: `buffers` leaves it out), which the backward adds into."""
        if index not in self.ACCUMULATES_GRAD_INPUTS:
            raise ValueError(f"{self} cannot add input {index}'s gradient into an accumulator")
        name = self.facts.grad_inputs[index]
        self._into[name] = into
        setattr(self, name, into)
        self._bind()

    def set_addend(self, index: int, addend: Tensor | None) -> None:
        if index not in self.ADDENDS_TO_GRAD_INPUTS:
            raise ValueError(f"{self} cannot add an addend to input {index}'s gradient")
        name = self.facts.grad_inputs[index]
        if addend is None:
            self._addends.pop(name, None)
        else:
            self._addends[name] = addend

    def defer_weight_grads(self, window: Any) -> None:
        """The backward leaves its `window_parts` in `window` (the executor's: its `slot`
        gives this position's tensors, its flush adds the weights' gradients of many
        positions at once through the layer's `add_weight_grads`)."""
        if not self.facts.window_parts:
            raise ValueError(f"{self} has no weight gradients to leave in a window")
        self._window = window

    def buffers(self) -> Iterator[tuple[str, Tensor]]:
        """(role, owned base tensor) pairs: not the accumulators it was handed."""
        for role, attr in self.ROLES.items():
            if attr not in self._into:
                yield role, getattr(self, attr)

    def backward_reads(self, input: Any) -> list[Tensor]:
        """The declared reads, the accumulators it adds into and the addends it adds."""
        return [*super().backward_reads(input), *self._into.values(), *self._addends.values()]

    def forward(self, inputs: tuple[Tensor, ...]) -> Any:
        self.layer.fused_forward(inputs, self._buf)
        return self.output

    def backward(self, inputs: tuple[Tensor, ...], grads: Any) -> tuple[Tensor, ...]:
        self.layer.fused_backward(inputs, grads, self)
        return self.grad_input

    # ---- nmt.wiring.FusedBuffers: what the layer's backward sees -----------------------------

    def __call__(self, name: str, shape: tuple[int, ...]) -> Tensor:
        return self._buf(name, shape)

    def accumulates(self, name: str) -> bool:
        return name in self._into

    def saved(self, name: str) -> Tensor:
        return getattr(self, name)

    def constant(self, name: str, shape: tuple[int, ...], value: float) -> Tensor:
        return self._constant(name, shape, value)

    def addend(self, name: str) -> Tensor | None:
        return self._addends.get(name)

    def window_slot(self, shapes: tuple[tuple[int, ...], ...]) -> list[Tensor] | None:
        return None if self._window is None else self._window.slot(shapes)


class Dropout(_Fused):
    """Inverted dropout in one op each way: x * mask * 1/(1-p) (an addcmul) with a 0/1 mask
    drawn by `nmt.kernels.keep_mask_`, the draws of `dropout_mask` (so the same masks as the
    autograd model, in the same order). A copy when the module is not training."""

    ROLES = {"output": "output", "grad_input": "grad_input", "mask": "mask"}
    BWD_READS_ROLES = ("mask",)
    ADDS_TO_GRAD_INPUT = True  # addend + g * mask / (1 - p): the same one op

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

    def backward(self, x: Tensor, g: Tensor, addend: Tensor | None = None) -> Tensor:
        """d loss / d x, plus `addend` where the graph gives one (x's gradient from a graph
        output: the next position's state gradient), in one op either way."""
        gi = self._buf("grad_input", tuple(g.shape))
        if not self._active:
            return gi.copy_(g) if addend is None else torch.add(addend, g, out=gi)
        start = _zero(g.device, g.dtype) if addend is None else addend
        return torch.addcmul(start, g, self.mask, value=self.scale, out=gi)
