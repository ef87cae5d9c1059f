"""Bahdanau's score, OpenNMT-py's `global_attention mlp`:
score(h_t, h_s) = v . tanh(W_k h_s + W_q h_t + b).

Parameters of its own: W_k, W_q (H x H), b (H), v (H). One bias b inside the tanh (on W_q, as
OpenNMT-py's `linear_query`); none on W_k (it would duplicate b) and none on v (a constant
added to every score cancels in the softmax, so it would never learn). Unlike OpenNMT-py, W_c
has no bias for mlp either: the output layer is the same for every type.

W_k h_s is recomputed at every target position, as OpenNMT-py does with input feeding:
simple, B x S x H x H multiply-adds a position more than `general`, and one B x S x H buffer
per decoder clone that backward reads (the tanh). Its score is no matrix product, so of
seq2seq-attn PR #45's two products only the context's (MM2) is one here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.attention.base import COMMON_FACTS, Attention, output_layer, viewed
from nmt.kernels import add_row_sums
from nmt.nodes.modules import AddAcross, BottleLinear, Linear, Tanh, VScores
from nmt.wiring import Buf, FusedBuffers, Value, Wiring

_tanh_backward = torch.ops.aten.tanh_backward.grad_input


class MLPAttention(Attention):
    """score = v . tanh(W_k h_s + W_q h_t + b)."""

    SUMMARY = "v . tanh(W_k h_s + W_q h_t + b) (Bahdanau; OpenNMT-py's mlp)"
    FUSED = COMMON_FACTS.extended(
        saved=("hidden",),
        forward_scratch=("query",),
        backward_scratch=("grad_hidden", "grad_query", "ones"),
    )
    PACKED_LAYERS = ("linear_context", "linear_query", "linear_out")

    def __init__(self, rnn_size: int):
        super().__init__()
        self.linear_query = nn.Linear(rnn_size, rnn_size, bias=True)  # W_q, b
        self.linear_context = nn.Linear(rnn_size, rnn_size, bias=False)  # W_k
        self.v = nn.Linear(rnn_size, 1, bias=False)
        self.linear_out = output_layer(rnn_size)

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        keys = self.linear_context(context)  # B x S x H
        query = self.linear_query(h_t)  # B x H
        hidden = torch.tanh(keys + query.unsqueeze(1))  # B x S x H
        return self.v(hidden).squeeze(2)  # B x S

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        """W_k h_s in buffer "hidden", which becomes tanh(W_k h_s + W_q h_t + b) in place;
        W_q h_t + b in buffer "query"."""
        B, S, H = context.shape
        flat = viewed(buf("hidden", (B, S, H)), B * S, H)
        keys = self.product(self.linear_context, context.reshape(B * S, H), flat)
        query = self.product(self.linear_query, h_t, buf("query", (B, H)))
        hidden = keys.view(B, S, H).add_(query.unsqueeze(1)).tanh_()
        scores = viewed(buf("scores", (B, S)), B * S, 1)
        return torch.mm(hidden.view(B * S, H), self.v.weight.t(), out=scores).view(B, S)

    def fused_score_backward(
        self,
        h: Tensor,
        context: Tensor,
        g_scores: Tensor,
        g_h_out: Tensor,
        g_h: Tensor,
        g_context: Tensor,
        bufs: FusedBuffers,
    ) -> None:
        B, S, H = context.shape
        v, w_k, q = self.v.weight, self.linear_context.weight, self.linear_query
        saved = bufs.saved("hidden")
        hidden = saved.view(B * S, H)
        g_hidden = bufs("grad_hidden", (B, S, H))
        torch.mul(g_scores.unsqueeze(2), v.view(1, 1, H), out=g_hidden)
        v.grad.addmm_(g_scores.reshape(1, B * S), hidden)
        g_sum = _tanh_backward(g_hidden, saved, grad_input=g_hidden).view(B * S, H)
        g_query = torch.sum(g_hidden, 1, out=bufs("grad_query", (B, H)))
        g_context.view(B * S, H).addmm_(g_sum, w_k)
        w_k.grad.addmm_(g_sum.t(), context.reshape(B * S, H))
        q.weight.grad.addmm_(g_query.t(), h)
        add_row_sums(q.bias.grad, g_query, bufs.constant("ones", (B,), 1.0))
        torch.addmm(g_h_out, g_query, q.weight, out=g_h)

    def wire_score(self, g: Wiring, h_top: Value, context: Value) -> Value:
        keys = g.add(BottleLinear, "attn.keys", context, weight=self.linear_context.weight)
        q = self.linear_query
        query = g.add(Linear, "attn.query", h_top, weight=q.weight, bias=q.bias)
        hidden = g.add(Tanh, "attn.hidden", g.add(AddAcross, "attn.add", keys, query))
        return g.add(VScores, "attn.v", hidden, weight=self.v.weight)

    @classmethod
    def score_macs(cls, rnn_size: int, source_length: int) -> int:
        H, S = rnn_size, source_length
        return H * H + S * H * H + S * H
