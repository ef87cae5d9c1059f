"""Luong's "general" score, seq2seq-attn's (the default): score(h_t, h_s) = h_s . (W_a h_t).

Parameters of its own: W_a (H x H, no bias). nngraph: a Linear (W_a h_t, "attn.in") and MM1
("attn.mm1"); fused: W_a h_t in buffer "target", which backward reads, and MM1's scores.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.attention.base import COMMON_FACTS, Attention, bmm_scores, output_layer
from nmt.kernels import row_dots
from nmt.nodes.modules import Linear, MMScores
from nmt.wiring import Buf, FusedBuffers, Value, Wiring


class GeneralAttention(Attention):
    """score = h_s . (W_a h_t)."""

    SUMMARY = "h_s . (W_a h_t) (Luong; seq2seq-attn's)"
    FUSED = COMMON_FACTS.extended(
        saved=("target",),
        backward_scratch=("grad_target",),
        attention_products=("scores", "grad_target"),  # MM1 and its gradient
    )
    PACKED_LAYERS = ("linear_in", "linear_out")

    def __init__(self, rnn_size: int):
        super().__init__()
        self.linear_in = nn.Linear(rnn_size, rnn_size, bias=False)  # W_a
        self.linear_out = output_layer(rnn_size)

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        return row_dots(context, self.linear_in(h_t))

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        """W_a h_t in buffer "target"."""
        target = self.product(self.linear_in, h_t, buf("target", tuple(h_t.shape)))
        return bmm_scores(context, target, buf)

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
        g_target = bufs("grad_target", (B, H))
        torch.bmm(g_scores.unsqueeze(1), context, out=g_target.unsqueeze(1))
        g_context.baddbmm_(g_scores.unsqueeze(2), bufs.saved("target").unsqueeze(1))
        w_a = self.linear_in.weight
        torch.addmm(g_h_out, g_target, w_a, out=g_h)
        w_a.grad.addmm_(g_target.t(), h)

    def wire_score(self, g: Wiring, h_top: Value, context: Value) -> Value:
        target = g.add(Linear, "attn.in", h_top, weight=self.linear_in.weight, bias=None)
        return g.add(MMScores, "attn.mm1", context, target)

    @classmethod
    def score_macs(cls, rnn_size: int, source_length: int) -> int:
        return rnn_size * rnn_size + source_length * rnn_size
