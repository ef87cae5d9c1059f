"""How a layer describes its part of a clone graph, without importing the engine.

The clone executor (`nmt.engine`) builds one graph per time step out of nodes that own
persistent buffers. Each layer of the model - a recurrent cell (`nmt.cells`), an attention
type (`nmt.attention`) - states its own part in its own file, in two forms:

- nngraph style, through a `Wiring`: every call adds one node (Torch7's nn modules:
  Linear, Sigmoid, CMulTable, ...) and returns the handle of its output;
- as one fused node: the layer's `fused_forward` / `fused_backward` run into the node's
  buffers, and its `FusedFacts` tell the planner what the node owns and what its backward
  reads.

The engine's `GraphBuilder` implements `Wiring` and its `FusedLayer` node runs the fused form,
so the model's floor never imports the engine, and a new cell or attention type is one file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor
from torch.nn import Parameter

Value = Any  # the handle of a value in the graph being wired (the engine's `Value`)

# buf(name, shape): the node's persistent buffer `name` at `shape`, or None where there are
# no persistent buffers (inference: every op allocates its result)
Buf = Callable[[str, tuple[int, ...]], Tensor | None]


def fresh(name: str, shape: tuple[int, ...]) -> None:
    """The `Buf` of inference: no persistent buffers."""
    return None


class FusedBuffers(Protocol):
    """What a fused node hands its layer's backward: its buffers by name."""

    def __call__(self, name: str, shape: tuple[int, ...]) -> Tensor:
        """Buffer `name` at `shape` (written before it is read, in this call)."""

    def saved(self, name: str) -> Tensor:
        """Buffer `name` as the forward left it."""

    def constant(self, name: str, shape: tuple[int, ...], value: float) -> Tensor:
        """Buffer `name` at `shape`, holding `value` everywhere (filled only when needed)."""


@dataclass(frozen=True)
class FusedFacts:
    """What a layer's fused node owns and reads: the planner's facts (`nmt.engine.node`).
    Every name is a buffer of the node; the node hands out `outputs` as its output (a
    tuple when `tuple_output`) and `grad_inputs` as its inputs' gradients, in input order."""

    outputs: tuple[str, ...]
    grad_inputs: tuple[str, ...]
    reads_inputs: tuple[int, ...]  # inputs the backward reads
    saved: tuple[str, ...] = ()  # written in forward, read by backward
    forward_scratch: tuple[str, ...] = ()  # written and read inside one forward
    backward_scratch: tuple[str, ...] = ()  # written and read inside one backward
    reads_output: bool = False
    tuple_output: bool = True
    attention_products: tuple[str, ...] = ()  # roles of seq2seq-attn PR #45's products

    def extended(self, **more: tuple[str, ...]) -> FusedFacts:
        """These facts with more buffers of the kinds named (a score's own, say)."""
        fields = {k: getattr(self, k) + v for k, v in more.items()}
        return FusedFacts(**{**self.__dict__, **fields})

    @property
    def buffers(self) -> tuple[str, ...]:
        parts = (self.outputs, self.grad_inputs, self.saved)
        return sum((*parts, self.forward_scratch, self.backward_scratch), ())


class Fusable(Protocol):
    """A layer that runs as one node of the fused granularity."""

    FUSED: FusedFacts

    def fused_forward(self, inputs: tuple[Tensor, ...], buf: Buf) -> Any:
        """The layer's forward into the buffers `buf` gives; returns the outputs."""

    def fused_backward(self, inputs: tuple[Tensor, ...], grads: Any, bufs: FusedBuffers) -> None:
        """Write the inputs' gradients into the `grad_inputs` buffers and add the
        parameters' gradients into their `.grad`."""


class Wiring(Protocol):
    """The node vocabulary a layer wires its clone-graph part with (nngraph style): each
    method adds one node named `name` (names are per layer, not per clone: the planner
    shares buffers by name) and returns its output's handle. Shapes: B batch, S source
    positions, H and I feature sizes."""

    def linear(self, name: str, weight: Parameter, bias: Parameter | None, x: Value) -> Value:
        """x W^T (+ b)."""

    def sigmoid(self, name: str, x: Value) -> Value: ...

    def tanh(self, name: str, x: Value) -> Value: ...

    def softmax(self, name: str, x: Value) -> Value:
        """Over dimension 1 (source positions)."""

    def cadd(self, name: str, a: Value, b: Value) -> Value:
        """a + b."""

    def cmul(self, name: str, a: Value, b: Value) -> Value:
        """a * b."""

    def one_minus(self, name: str, x: Value) -> Value:
        """1 - x."""

    def split(self, name: str, n: int, x: Value) -> tuple[Value, ...]:
        """B x nW -> n views B x W."""

    def join(self, name: str, a: Value, b: Value) -> Value:
        """[a ; b] along dimension 1."""

    def mm_scores(self, name: str, context: Value, target: Value) -> Value:
        """scores[b, s] = context[b, s] . target[b] (attention MM1)."""

    def mm_context(self, name: str, attn: Value, context: Value) -> Value:
        """c[b] = sum_s attn[b, s] context[b, s] (attention MM2)."""

    def bottle_linear(self, name: str, weight: Parameter, x: Value) -> Value:
        """x W^T over the last dimension of x B x S x I."""

    def add_across(self, name: str, a: Value, b: Value) -> Value:
        """a B x S x H + b B x H added to every row s."""

    def v_scores(self, name: str, weight: Parameter, e: Value) -> Value:
        """scores[b, s] = v . e[b, s] (v: the 1 x H weight)."""

    def dropout(self, name: str, p: float, x: Value) -> Value: ...

    # ---- the fused granularity: one node per layer ------------------------------------

    def fused_layer(self, name: str, layer: Fusable, *inputs: Value) -> Value:
        """One node running `layer.fused_forward` (a tuple of handles for `tuple_output`)."""

    def fused_dropout(self, name: str, p: float, x: Value) -> Value: ...
