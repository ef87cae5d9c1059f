"""The seq2seq-attn clone graphs, built node by node from a `Seq2SeqAttn`'s own parameters.

Node names are per layer, not per clone ("l1.i2h", "attn.mm1"): the planner shares buffers by
name, so the encoder, backward-encoder and decoder nodes of one name may share one buffer.
The arithmetic mirrors `nmt.model` exactly: gates i f o g, c = f*c + i*g, h = o*tanh(c),
dropout on h below every layer above the first, "general" attention, dropout on the output.

Graph inputs: x (token ids), [feed], [context], h0, c0, h1, c1, ...
Graph outputs: h0, c0, h1, c1, ..., [out].
"""

from __future__ import annotations

import torch
from torch.nn import Module

from nmt.engine.graph import Graph, GraphBuilder, Value
from nmt.engine.nodes import (
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
)
from nmt.model import LSTMStack, Seq2SeqAttn


def _lstm_stack(
    g: GraphBuilder, stack: LSTMStack, x: Value, dropout: float, owner: Module
) -> list[tuple[Value, Value]]:
    """Wire the LSTM layers of one position; returns (next_h, next_c) per layer."""
    dev, dt = g.device, g.dtype
    states: list[tuple[Value, Value]] = []
    prev = [(g.input(f"h{i}"), g.input(f"c{i}")) for i in range(len(stack.layers))]
    for i, (layer, (h_prev, c_prev)) in enumerate(zip(stack.layers, prev, strict=True)):
        p = f"l{i}."
        if i > 0:
            x = states[-1][0]
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
        states.append((next_h, next_c))
    return states


def _outputs(g: GraphBuilder, states: list[tuple[Value, Value]]) -> None:
    for i, (h, c) in enumerate(states):
        g.output(f"h{i}", h)
        g.output(f"c{i}", c)


def _dropout(model: Seq2SeqAttn) -> float:
    return model.cfg.dropout


def encoder_graph(
    model: Seq2SeqAttn, stack: LSTMStack, device: torch.device, dtype: torch.dtype
) -> Graph:
    """One source position of `stack` (model.encoder or model.encoder_bwd)."""
    g = GraphBuilder(device, dtype)
    x = g.input("x", needs_grad=False)
    emb = g.add(LookupTable("lookup", model.src_embedding.weight, device, dtype), x)
    _outputs(g, _lstm_stack(g, stack, emb, _dropout(model), model))
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
    states = _lstm_stack(g, model.decoder, x, _dropout(model), model)
    h_top = states[-1][0]
    target = g.add(Linear("attn.in", model.attn_in.weight, None, device, dtype), h_top)
    scores = g.add(MMScores("attn.mm1", device, dtype), context, target)
    attn = g.add(SoftMax("attn.softmax", device, dtype), scores)
    ctx = g.add(MMContext("attn.mm2", device, dtype), attn, context)
    joined = g.add(Join("attn.join", device, dtype), ctx, h_top)
    lin = g.add(Linear("attn.out", model.attn_out.weight, None, device, dtype), joined)
    out = g.add(Tanh("attn.tanh", device, dtype), lin)
    if _dropout(model) > 0:
        out = g.add(Dropout("attn.dropout", _dropout(model), model, device, dtype), out)
    _outputs(g, states)
    g.output("out", out)
    return g.build()
