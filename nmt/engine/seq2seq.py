"""The seq2seq-attn clone graphs, built from a `Seq2SeqAttn`'s own parameters and layers.

The arithmetic mirrors `nmt.model` exactly: dropout on the embeddings, the layers of each
recurrent stack, dropout on the input of every layer above the first, the attention on the
decoder's top state, dropout on its output. Each layer wires itself (`RecurrentLayer.wire`,
`Attention.wire`) or runs as one fused node, as the model's granularity says
(`nmt.granularities`); this module only puts the layers in order and declares what the graph
carries.

Node names are per layer, not per clone ("l1.i2h", "attn.mm1"): the planner shares buffers by
name, so the encoder, backward-encoder and decoder nodes of one name may share one buffer.

Graph inputs: x (token ids; or, where the granularity gathers the embeddings once a step,
the position's embedding rows), [feed], [context], then the state the cell declares for every
layer (LSTM: h0, c0, h1, c1, ...; GRU: h0, h1, ...). Graph outputs: that state, then [out].
The executor learns the state's names, and which one feeds the context, from the built
graph (`Graph.state`).
"""

from __future__ import annotations

import torch

from nmt.engine.graph import Graph, GraphBuilder, StateSpec, Value
from nmt.model import RNNStack, Seq2SeqAttn
from nmt.nodes.modules import Join, LookupTable


def state_spec(state: tuple[str, ...], layers: int) -> StateSpec:
    """What a stack of `layers` cells carries: each cell's `state` (its first is its output),
    for every layer; the top layer's output is the stack's."""
    names = tuple(f"{k}{i}" for i in range(layers) for k in state)
    return StateSpec(names, top=f"{state[0]}{layers - 1}")


def _stack(g: GraphBuilder, model: Seq2SeqAttn, stack: RNNStack, x: Value) -> dict[str, Value]:
    """Wire the layers of one position and declare the state they carry (`state_spec`);
    returns the next value of every state, by name."""
    granularity, dropout, state = model.granularity, model.cfg.dropout, stack.cell.STATE
    spec = state_spec(state, len(stack.layers))
    g.carry(spec)
    prev = {name: g.input(name) for name in spec.names}
    nxt: dict[str, Value] = {}
    for i, layer in enumerate(stack.layers):
        if i > 0:
            x = nxt[f"{state[0]}{i - 1}"]
            if dropout > 0:
                x = granularity.wire_dropout(g, f"l{i}.dropout", dropout, x)
        now = tuple(prev[f"{k}{i}"] for k in state)
        new = granularity.wire_cell(g, layer, f"l{i}.", x, now)
        nxt.update({f"{k}{i}": v for k, v in zip(state, new, strict=True)})
    return nxt


def _drop_embedding(g: GraphBuilder, model: Seq2SeqAttn, emb: Value) -> Value:
    """`model.embedding_dropout` on the looked-up embeddings (before the input feed joins)."""
    p = model.cfg.embedding_dropout
    return model.granularity.wire_dropout(g, "emb.dropout", p, emb) if p > 0 else emb


def _embedding(g: GraphBuilder, model: Seq2SeqAttn, weight: torch.Tensor) -> Value:
    """The position's embedding rows: a LookupTable node on its token ids (input "x"), or,
    where the granularity gathers them once a step (`embeddings_per_step`), the rows
    themselves as input "x" - the executor gathers them and adds their gradient (the input's)
    into the table."""
    if model.granularity.embeddings_per_step:
        return g.input("x")
    return g.add(LookupTable, "lookup", g.input("x", needs_grad=False), weight=weight)


def _outputs(g: GraphBuilder, states: dict[str, Value]) -> None:
    """The next state, as the first outputs, in the order the cell declared."""
    assert g.state is not None
    for name in g.state.names:
        g.output(name, states[name])


def encoder_graph(
    model: Seq2SeqAttn,
    stack: RNNStack,
    device: torch.device,
    dtype: torch.dtype,
    owner: Seq2SeqAttn | None = None,
) -> Graph:
    """One source position of `stack` (model.encoder or model.encoder_bwd). `owner`: the
    model whose training flag dropout follows (default `model`; a compute copy's master)."""
    g = GraphBuilder(device, dtype, owner=owner or model)
    emb = _drop_embedding(g, model, _embedding(g, model, model.src_embedding.weight))
    _outputs(g, _stack(g, model, stack, emb))
    return g.build()


def decoder_graph(
    model: Seq2SeqAttn,
    device: torch.device,
    dtype: torch.dtype,
    owner: Seq2SeqAttn | None = None,
) -> Graph:
    """One target position: embedding [+ input feed], the stack, attention, output dropout."""
    g = GraphBuilder(device, dtype, owner=owner or model)
    cfg, granularity = model.cfg, model.granularity
    emb = _embedding(g, model, model.tgt_embedding.weight)
    feed = g.input("feed") if cfg.input_feed else None
    context = g.input("context")
    x = _drop_embedding(g, model, emb)
    if feed is not None:
        x = g.add(Join, "feed_join", x, feed)
    states = _stack(g, model, model.decoder, x)
    assert g.state is not None
    out = granularity.wire_attention(g, model.attention, states[g.state.top], context)
    if cfg.dropout > 0:
        out = granularity.wire_dropout(g, "attn.dropout", cfg.dropout, out)
    _outputs(g, states)
    g.output("out", out)
    return g.build()
