"""Luong's "dot" score: score(h_t, h_s) = h_s . h_t. No parameters of its own.

nngraph: MM1 ("attn.mm1") on h_t itself; fused: MM1's scores.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.attention.base import COMMON_FACTS, Attention, bmm_scores, output_layer
from nmt.kernels import row_dots
from nmt.nodes.modules import MMScores
from nmt.wiring import Buf, FusedBuffers, Value, Wiring


class DotAttention(Attention):
    """score = h_s . h_t."""

    SUMMARY = "h_s . h_t (Luong)"
    FUSED = COMMON_FACTS.extended(
        backward_scratch=("grad_target",),
        attention_products=("scores", "grad_target"),  # MM1 and its gradient
    )

    def __init__(self, rnn_size: int):
        super().__init__()
        self.linear_out = output_layer(rnn_size)

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        return row_dots(context, h_t)

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        return bmm_scores(context, h_t, buf)

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
        g_context.baddbmm_(g_scores.unsqueeze(2), h.unsqueeze(1))
        torch.add(g_h_out, g_target, out=g_h)

    def wire_score(self, g: Wiring, h_top: Value, context: Value) -> Value:
        return g.add(MMScores, "attn.mm1", context, h_top)

    @classmethod
    def score_macs(cls, rnn_size: int, source_length: int) -> int:
        return source_length * rnn_size
