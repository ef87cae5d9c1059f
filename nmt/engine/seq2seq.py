"""The seq2seq-attn clone graphs, built node by node from a `Seq2SeqAttn`'s own parameters.

Node names are per layer, not per clone ("l1.i2h", "attn.mm1"): the planner shares buffers by
name, so the encoder, backward-encoder and decoder nodes of one name may share one buffer.
The arithmetic mirrors `nmt.model` exactly: gates i f o g, c = f*c + i*g, h = o*tanh(c),
dropout on h below every layer above the first, the attention of `model.attention` (its
score wired by SCORES, mirroring `nmt.attention`), dropout on the output.

`model.granularity` picks the node set: nngraph wires one node per Torch7 module (below);
fused wires one `nmt.engine.fused` node per LSTM layer ("l0.cell"), dropout and attention
("attn"). Both declare the same state and have the same graph inputs and outputs.

Graph inputs: x (token ids), [feed], [context], then the state the cell declares (LSTM:
h0, c0, h1, c1, ...). Graph outputs: that state, then [out]. The executor learns the state's
names, and which one feeds the context, from the built graph (`Graph.state`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import Module

from nmt.engine import fused
from nmt.engine.graph import Graph, GraphBuilder, StateSpec, Value
from nmt.engine.nodes import (
    AddAcross,
    BottleLinear,
    CAdd,
    CMul,
    Dropout,
    Join,
    Linear,
    LookupTable,
    MMContext,
    MMScores,
    Sigmoid,
    SoftMax,
    Split,
    Tanh,
    VScores,
)
from nmt.model import LSTMStack, Seq2SeqAttn


def lstm_state(layers: int) -> StateSpec:
    """What an LSTM stack carries: h and c of every layer; the top layer's h is its output."""
    names = tuple(f"{k}{i}" for i in range(layers) for k in ("h", "c"))
    return StateSpec(names, top=f"h{layers - 1}")


def _lstm_stack(
    g: GraphBuilder, stack: LSTMStack, x: Value, dropout: float, owner: Module
) -> dict[str, Value]:
    """Wire the LSTM layers of one position and declare the state they carry (`lstm_state`);
    returns the next value of every state, by name."""
    dev, dt = g.device, g.dtype
    spec = lstm_state(len(stack.layers))
    g.carry(spec)
    prev = {name: g.input(name) for name in spec.names}
    nxt: dict[str, Value] = {}
    for i, layer in enumerate(stack.layers):
        p = f"l{i}."
        h_prev, c_prev = prev[f"h{i}"], prev[f"c{i}"]
        if i > 0:
            x = nxt[f"h{i - 1}"]
            if dropout > 0:
                x = g.add(Dropout(p + "dropout", dropout, owner, dev, dt), x)
        i2h = g.add(Linear(p + "i2h", layer.i2h.weight, layer.i2h.bias, dev, dt), x)
        h2h = g.add(Linear(p + "h2h", layer.h2h.weight, None, dev, dt), h_prev)
        gates = g.add(CAdd(p + "gates", dev, dt), i2h, h2h)
        split = g.add(Split(p + "split", 4, dev, dt), gates).node
        in_gate = g.add(Sigmoid(p + "in_gate", dev, dt), Value(split, 0))
        forget_gate = g.add(Sigmoid(p + "forget_gate", dev, dt), Value(split, 1))
        out_gate = g.add(Sigmoid(p + "out_gate", dev, dt), Value(split, 2))
        in_transform = g.add(Tanh(p + "in_transform", dev, dt), Value(split, 3))
        forget_c = g.add(CMul(p + "forget_c", dev, dt), forget_gate, c_prev)
        in_c = g.add(CMul(p + "in_c", dev, dt), in_gate, in_transform)
        next_c = g.add(CAdd(p + "next_c", dev, dt), forget_c, in_c)
        tanh_c = g.add(Tanh(p + "tanh_c", dev, dt), next_c)
        next_h = g.add(CMul(p + "next_h", dev, dt), out_gate, tanh_c)
        nxt[f"h{i}"], nxt[f"c{i}"] = next_h, next_c
    return nxt


def _fused_lstm_stack(
    g: GraphBuilder, stack: LSTMStack, x: Value, dropout: float, owner: Module
) -> dict[str, Value]:
    """`_lstm_stack` with one fused node per layer (and per inter-layer dropout)."""
    dev, dt = g.device, g.dtype
    spec = lstm_state(len(stack.layers))
    g.carry(spec)
    prev = {name: g.input(name) for name in spec.names}
    nxt: dict[str, Value] = {}
    for i, layer in enumerate(stack.layers):
        p = f"l{i}."
        if i > 0:
            x = nxt[f"h{i - 1}"]
            if dropout > 0:
                x = g.add(fused.Dropout(p + "dropout", dropout, owner, dev, dt), x)
        cell = fused.LSTMCell(p + "cell", layer, dev, dt)
        g.add(cell, x, prev[f"h{i}"], prev[f"c{i}"])
        nxt[f"h{i}"], nxt[f"c{i}"] = Value(cell, 0), Value(cell, 1)
    return nxt


def _outputs(g: GraphBuilder, states: dict[str, Value]) -> None:
    """The next state, as the first outputs, in the order the cell declared."""
    assert g.state is not None
    for name in g.state.names:
        g.output(name, states[name])


def _dropout(model: Seq2SeqAttn) -> float:
    return model.cfg.dropout


# ---- attention: the score of each `model.attention` type, then the common rest ---------------

Scores = Callable[[GraphBuilder, Seq2SeqAttn, Value, Value], Value]  # (g, model, h_t, ctx)


def _general_scores(g: GraphBuilder, model: Seq2SeqAttn, h_top: Value, context: Value) -> Value:
    """h_s . (W_a h_t)."""
    w_a = model.attention.linear_in.weight
    target = g.add(Linear("attn.in", w_a, None, g.device, g.dtype), h_top)
    return g.add(MMScores("attn.mm1", g.device, g.dtype), context, target)


def _dot_scores(g: GraphBuilder, model: Seq2SeqAttn, h_top: Value, context: Value) -> Value:
    """h_s . h_t."""
    return g.add(MMScores("attn.mm1", g.device, g.dtype), context, h_top)


def _mlp_scores(g: GraphBuilder, model: Seq2SeqAttn, h_top: Value, context: Value) -> Value:
    """v . tanh(W_k h_s + W_q h_t + b)."""
    att, dev, dt = model.attention, g.device, g.dtype
    keys = g.add(BottleLinear("attn.keys", att.linear_context.weight, dev, dt), context)
    q = att.linear_query
    query = g.add(Linear("attn.query", q.weight, q.bias, dev, dt), h_top)
    summed = g.add(AddAcross("attn.add", dev, dt), keys, query)
    hidden = g.add(Tanh("attn.hidden", dev, dt), summed)
    return g.add(VScores("attn.v", att.v.weight, dev, dt), hidden)


SCORES: dict[str, Scores] = {"general": _general_scores, "dot": _dot_scores, "mlp": _mlp_scores}


def _attention(g: GraphBuilder, model: Seq2SeqAttn, h_top: Value, context: Value) -> Value:
    """tanh(W_c [c_t ; h_t]) with c_t = softmax(scores) . context (nmt.attention.Attention)."""
    dev, dt = g.device, g.dtype
    scores = SCORES[model.cfg.attention](g, model, h_top, context)
    attn = g.add(SoftMax("attn.softmax", dev, dt), scores)
    ctx = g.add(MMContext("attn.mm2", dev, dt), attn, context)
    joined = g.add(Join("attn.join", dev, dt), ctx, h_top)
    w_c = model.attention.linear_out.weight
    lin = g.add(Linear("attn.out", w_c, None, dev, dt), joined)
    return g.add(Tanh("attn.tanh", dev, dt), lin)


def _fused_attention(g: GraphBuilder, model: Seq2SeqAttn, h_top: Value, context: Value) -> Value:
    """The attention of `model.attention` as one fused node."""
    node = fused.ATTENTIONS[model.cfg.attention]("attn", model.attention, g.device, g.dtype)
    return g.add(node, h_top, context)


# per `model.granularity`: how an LSTM stack, the attention and a dropout are wired
STACKS = {"nngraph": _lstm_stack, "fused": _fused_lstm_stack}
ATTENTIONS = {"nngraph": _attention, "fused": _fused_attention}
DROPOUTS = {"nngraph": Dropout, "fused": fused.Dropout}


def encoder_graph(
    model: Seq2SeqAttn, stack: LSTMStack, device: torch.device, dtype: torch.dtype
) -> Graph:
    """One source position of `stack` (model.encoder or model.encoder_bwd)."""
    g = GraphBuilder(device, dtype)
    x = g.input("x", needs_grad=False)
    emb = g.add(LookupTable("lookup", model.src_embedding.weight, device, dtype), x)
    _outputs(g, STACKS[model.cfg.granularity](g, stack, emb, _dropout(model), model))
    return g.build()


def decoder_graph(model: Seq2SeqAttn, device: torch.device, dtype: torch.dtype) -> Graph:
    """One target position: embedding [+ input feed], LSTM stack, attention, output dropout."""
    g = GraphBuilder(device, dtype)
    cfg = model.cfg
    y = g.input("x", needs_grad=False)
    feed = g.input("feed") if cfg.input_feed else None
    context = g.input("context")
    x = g.add(LookupTable("lookup", model.tgt_embedding.weight, device, dtype), y)
    if feed is not None:
        x = g.add(Join("feed_join", device, dtype), x, feed)
    granularity = cfg.granularity
    states = STACKS[granularity](g, model.decoder, x, _dropout(model), model)
    assert g.state is not None
    out = ATTENTIONS[granularity](g, model, states[g.state.top], context)
    if _dropout(model) > 0:
        dropout = DROPOUTS[granularity]("attn.dropout", _dropout(model), model, device, dtype)
        out = g.add(dropout, out)
    _outputs(g, states)
    g.output("out", out)
    return g.build()
