"""The node granularities of the clone executor, chosen by `model.granularity`.

A granularity decides what the clone graphs are made of, and everything that follows:

                     nngraph (the seed's graph)          fused
    a cell           one node per Torch7 module          one node (the cell's fused form)
                     (`RecurrentLayer.wire`)
    the attention    one node per module                 one node (`Attention.fused`)
    a dropout        a multiply by a stored mask         one op each way (mask * 1/(1-p))
    an embedding     a LookupTable node per position:    the executor gathers every
                     one gather, one index_add_          position's rows at once, and adds
                                                         their gradients in one index_add_
    the output layer Linear + LogSoftMaxNLL on every     one node: Linear + log-softmax +
     and the loss    row, one target position at a time  loss over `train.loss_chunk`
                                                         positions, leading PAD rows skipped
    inference        the module form                     the fused cell and attention

Both give the same numbers to rounding; the planner shares buffers in either. A granularity
wires through `nmt.wiring.Wiring`, so it names no engine class; the engine reads everything
else it needs here, and a name that is not registered is an error, never a silent default.
"""

from __future__ import annotations

from typing import ClassVar

from nmt.errors import NmtError
from nmt.nodes import fused, modules
from nmt.wiring import Value, Wiring


class Granularity:
    """One node set: how a cell, the attention and a dropout are wired, and how the output
    layer runs."""

    name: ClassVar[str]
    description: ClassVar[str]  # one line: the config reference, --help
    fused_output_layer: ClassVar[bool]  # one fused node: several positions, PAD rows skipped
    fused_inference: ClassVar[bool]  # translation and validation run the fused forms
    seed_graph: ClassVar[bool] = False  # seq2seq-attn's own node set: its figures compare
    # the clone graphs take their embedding rows as an input, gathered for all positions at
    # once by the executor, which adds their gradients into the table once a step; else a
    # LookupTable node per position
    embeddings_per_step: ClassVar[bool]
    # a cell is one node running its step's form (`nmt.kernels.LSTM_CELL`...), whose buffers
    # depend on the device's choice of form
    fused_cells: ClassVar[bool]

    def wire_cell(self, g: Wiring, layer, prefix: str, x: Value, state: tuple) -> tuple:
        """One recurrent layer at one position; returns its next state."""
        raise NotImplementedError

    def wire_attention(self, g: Wiring, attention, h_top: Value, context: Value) -> Value:
        raise NotImplementedError

    def wire_dropout(self, g: Wiring, name: str, p: float, x: Value) -> Value:
        raise NotImplementedError

    def output_positions(self, loss_chunk: int, positions: int) -> int:
        """Target positions the clone executor's output layer runs at once, given
        `train.loss_chunk` (0: all) and the decoder's positions."""
        raise NotImplementedError


class NnGraph(Granularity):
    name = "nngraph"
    description = "one node per Torch7 module (the seed's graph)"
    seed_graph = True
    fused_output_layer = False
    fused_inference = False
    embeddings_per_step = False
    fused_cells = False

    def wire_cell(self, g, layer, prefix, x, state):
        return layer.wire(g, prefix, x, state)

    def wire_attention(self, g, attention, h_top, context):
        return attention.wire(g, h_top, context)

    def wire_dropout(self, g, name, p, x):
        return g.add(modules.Dropout, name, x, p=p, module=g.owner)

    def output_positions(self, loss_chunk, positions):
        return 1  # seq2seq-attn's generator: one target position at a time


class Fused(Granularity):
    name = "fused"
    description = (
        "one node per cell, attention, dropout and output layer + loss (fewer ops a step, "
        "the same numbers to rounding)"
    )
    fused_output_layer = True
    fused_inference = True
    embeddings_per_step = True
    fused_cells = True

    def wire_cell(self, g, layer, prefix, x, state):
        return g.add(fused.FusedLayer, prefix + "cell", x, *state, layer=layer)

    def wire_attention(self, g, attention, h_top, context):
        return g.add(fused.FusedLayer, "attn", h_top, context, layer=attention)

    def wire_dropout(self, g, name, p, x):
        return g.add(fused.Dropout, name, x, p=p, module=g.owner)

    def output_positions(self, loss_chunk, positions):
        return min(loss_chunk or positions, positions)


REGISTRY: dict[str, Granularity] = {g.name: g for g in (NnGraph(), Fused())}


def names() -> tuple[str, ...]:
    """The `model.granularity` choices, in registry order."""
    return tuple(REGISTRY)


def get(name: str) -> Granularity:
    try:
        return REGISTRY[name]
    except KeyError:
        raise NmtError(
            f"model.granularity must be one of {', '.join(names())}, got {name!r}"
        ) from None


def describe(sep: str = "; ") -> str:
    """`name: description` for every granularity, joined by `sep`."""
    return sep.join(f"{g.name}: {g.description}" for g in REGISTRY.values())
