"""How a layer describes its part of a clone graph, without importing the engine.

The clone executor (`nmt.engine`) builds one graph per time step out of nodes that own
persistent buffers (`nmt.nodes`). Each layer of the model - a recurrent cell (`nmt.cells`),
an attention type (`nmt.attention`) - states its own part in its own file, in two forms:

- nngraph style, through a `Wiring`: each `add` makes one node (Torch7's nn modules:
  Linear, Sigmoid, CMul, ...) and returns the handle of its output;
- as one fused node (`nmt.nodes.fused.FusedLayer`): the layer's `fused_forward` /
  `fused_backward` run into the node's buffers, and its `FusedFacts` tell the planner what
  the node owns and what its backward reads.

The engine's `GraphBuilder` implements `Wiring`, so the model's floor never imports the
engine, and a new cell or attention type is one file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor
from torch.nn import Module

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

    def accumulates(self, name: str) -> bool:
        """Whether input gradient `name` is an accumulator the executor handed the node (one
        of `FusedFacts.accumulates`): the backward adds into it rather than writing it."""

    def addend(self, name: str) -> Tensor | None:
        """What input gradient `name` (one of `FusedFacts.adds_to`) is to have added in the
        op that writes it (None: nothing this call)."""

    def window_slot(self, shapes: tuple[tuple[int, ...], ...]) -> list[Tensor] | None:
        """This position's slot of the executor's weight-gradient window, one tensor per
        `FusedFacts.window_parts` at `shapes` (the backward copies those parts there and
        adds no weight gradient: the window's flush calls its `add_weight_grads` over many
        positions at once); None: no window, the backward adds its own."""


@dataclass(frozen=True)
class FusedFacts:
    """What a layer's fused node owns and reads: the planner's facts (`nmt.nodes.node`).
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
    # inputs whose gradient the backward can add into an accumulator it is handed, in the
    # same ops (`FusedBuffers.accumulates`): the attention's context gradient, summed over
    # the target positions
    accumulates: tuple[int, ...] = ()
    # inputs whose gradient the backward can write with an addend it is handed added, in the
    # same op (`FusedBuffers.addend`): the encoder's top state, whose gradient also takes its
    # position's context gradient
    adds_to: tuple[int, ...] = ()
    # what the backward can leave in the executor's weight-gradient window instead of adding
    # its weights' gradients itself (`FusedBuffers.window_slot`), in the order of the
    # layer's `add_weight_grads` arguments
    window_parts: tuple[str, ...] = ()

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
    """How a layer adds its nodes to the clone graph being built, nngraph style: `add` makes
    a node of a class from `nmt.nodes` (its name is per layer, not per clone: the planner
    shares buffers by name) on the inputs' handles and returns its output's handle (one per
    output for a node with several); `owner` is the module whose `training` flag a dropout
    node follows. The engine's `GraphBuilder` is one."""

    owner: Module

    def add(self, cls: type, name: str, *inputs: Value, **params: Any) -> Any: ...
