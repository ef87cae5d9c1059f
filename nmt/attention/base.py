"""Global attention: what every type shares, and the contract of a type's score.

Every type scores each source position s against the decoder's top state h_t, then shares
the rest (Luong et al. 2015):

    a_t = softmax_s(score(h_t, h_s))          (masked source positions get -inf)
    c_t = sum_s a_t[s] h_s
    out = tanh(W_c [c_t ; h_t])               (W_c: 2H -> H, no bias, for every type)

`Attention` holds that common part in every form: the module form (`forward`, recorded by
autograd), the fused form into persistent buffers (`fused`: the fused granularity's node,
and inference with a fused model), its hand-written backward (`fused_backward`), its nngraph
nodes (`wire`) and its multiply-adds. A type (one file each, registered in
`nmt.attention`) supplies its score in the same forms: `score`, `fused_score`,
`fused_score_backward`, `wire_score`, the buffers its fused score adds (`FUSED`, extending
`COMMON_FACTS`) and `score_macs`. The parameter registration order (score parameters first,
then W_c) fixes the initialisation order.

The fused form runs the same ops in the same order as the module form, so it gives the same
numbers. Shapes: B batch, S source length, H rnn_size.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from nmt.kernels import PACKED_LINEAR, row_dots
from nmt.nodes.modules import Join, Linear, MMContext, SoftMax, Tanh
from nmt.wiring import Buf, FusedBuffers, FusedFacts, Value, Wiring, fresh

_tanh_backward = torch.ops.aten.tanh_backward.grad_input
_softmax_backward = torch.ops.aten._softmax_backward_data.out

# The legacy parameter names of the "general" attention (checkpoints written before the
# attention became a module) -> the names they load into now.
LEGACY_NAMES = {
    "attn_in.weight": "attention.linear_in.weight",
    "attn_out.weight": "attention.linear_out.weight",
}

# The fused node of the common part: it reads both inputs, its output (the tanh), the
# attention and [c_t ; h_t] in backward; mm2 (c_t) and its gradients are the attention
# products of seq2seq-attn PR #45 (the context's gradient is mm1's too, where a score has one)
COMMON_FACTS = FusedFacts(
    outputs=("output",),
    tuple_output=False,
    grad_inputs=("grad_h", "grad_context"),
    reads_inputs=(0, 1),
    reads_output=True,
    saved=("attn", "joined"),
    forward_scratch=("scores", "ctx"),
    backward_scratch=("grad_lin", "grad_joined", "grad_attn", "grad_scores"),
    attention_products=("ctx", "grad_attn", "grad_input[1]"),
    accumulates=(1,),  # the context's gradient: added into the executor's sum over positions
)


def output_layer(rnn_size: int) -> nn.Linear:
    return nn.Linear(2 * rnn_size, rnn_size, bias=False)  # W_c of tanh(W_c [c_t ; h_t])


def viewed(t: Tensor | None, *shape: int) -> Tensor | None:
    """A buffer seen in the shape an op's out= needs, or None (a new tensor)."""
    return None if t is None else t.view(shape)


def bmm_scores(context: Tensor, query: Tensor, buf: Buf) -> Tensor:
    """scores[b, s] = context[b, s] . query[b], into buffer "scores"."""
    B, S, _ = context.shape
    return row_dots(context, query, buf("scores", (B, S)))


class Attention(nn.Module):
    """Base class: a subclass defines its score; softmax, context and output are common."""

    SUMMARY: ClassVar[str]  # one line: the config reference
    FUSED: ClassVar[FusedFacts] = COMMON_FACTS
    # the linear layers whose products the fused form runs from a pack in search (W_c, and
    # a type's own score layers): `pack_for_search`
    PACKED_LAYERS: ClassVar[tuple[str, ...]] = ("linear_out",)
    linear_out: nn.Linear
    search_packs: dict[nn.Linear, Any] | None = None  # the packs by layer, search only
    _packer: Any = None  # the `PACKED_LINEAR` form that made them

    # ---- a type's score --------------------------------------------------------------------

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        """h_t B x H, context B x S x H -> scores B x S."""
        raise NotImplementedError

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        """`score` into buffers: scores B x S in buffer "scores"."""
        raise NotImplementedError

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
        """Write h's gradient into g_h (g_h_out: its part from the output layer), add the
        score's part of the context's gradient to g_context, accumulate the score's
        parameter gradients."""
        raise NotImplementedError

    def wire_score(self, g: Wiring, h_top: Value, context: Value) -> Value:
        """The score as nngraph nodes."""
        raise NotImplementedError

    @classmethod
    def score_macs(cls, rnn_size: int, source_length: int) -> int:
        """Multiply-adds of the score at one target position."""
        raise NotImplementedError

    # ---- products from weights packed once, for search ------------------------------------

    def pack_for_search(self) -> bool:
        """Let the fused form's products with the layers of `PACKED_LAYERS` run from their
        weights packed once where this device and dtype have a packed form
        (`nmt.kernels.PACKED_LINEAR`: oneDNN's on a CPU; a layer it cannot pack keeps its
        product), as the LSTM's gates do (`RecurrentLayer.pack_for_search`). For a model
        that only searches from here on: the packs do not follow the weights. Whether any
        layer now runs from a pack."""
        weight = self.linear_out.weight
        packer = PACKED_LINEAR.choose(weight.device, weight.dtype)
        packs = {}
        for name in self.PACKED_LAYERS:
            layer = getattr(self, name)
            packed = packer.pack(layer.weight.detach(), layer.bias)
            if packed is not None:
                packs[layer] = packed
        self._packer, self.search_packs = packer, packs or None
        return bool(packs)

    def product(self, layer: nn.Linear, x: Tensor, out: Tensor | None) -> Tensor:
        """x @ W^T (+ b) of one of this module's linear layers: from its pack where search
        packed it (a new tensor), else into `out` - one attribute test on the training
        step's path."""
        packed = self.search_packs.get(layer) if self.search_packs is not None else None
        if packed is not None:
            return self._packer.linear(x, packed, layer.bias)
        if layer.bias is None:
            return torch.mm(x, layer.weight.t(), out=out)
        return torch.addmm(layer.bias, x, layer.weight.t(), out=out)

    # ---- the common part -------------------------------------------------------------------

    def forward(
        self,
        h_t: Tensor,
        context: Tensor,
        src_mask: Tensor | None = None,
        fused: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Returns (tanh(W_c [c_t ; h_t]) B x H, attention B x S); `src_mask` B x S is True at
        real source tokens. `fused`: run `fused` (no gradient is recorded)."""
        if fused:
            return self.fused(h_t, context, src_mask)
        scores = self.score(h_t, context)  # B x S
        if src_mask is not None:
            scores = scores.masked_fill(~src_mask, float("-inf"))
        attn = torch.softmax(scores, dim=1)
        ctx = torch.bmm(attn.unsqueeze(1), context).squeeze(1)  # B x H
        out = torch.tanh(self.linear_out(torch.cat([ctx, h_t], dim=1)))
        return out, attn

    def fused(
        self, h_t: Tensor, context: Tensor, src_mask: Tensor | None = None, buf: Buf = fresh
    ) -> tuple[Tensor, Tensor]:
        """`forward` into the buffers "scores" B x S (and the score's own), "attn" B x S,
        "ctx" B x H, "joined" B x 2H (= [c_t ; h_t]) and "output" B x H."""
        B, S, H = context.shape
        scores = self.fused_score(h_t, context, buf)
        if src_mask is not None:
            scores.masked_fill_(~src_mask, float("-inf"))
        attn = torch.softmax(scores, 1, out=buf("attn", (B, S)))
        ctx = viewed(buf("ctx", (B, H)), B, 1, H)
        ctx = torch.bmm(attn.unsqueeze(1), context, out=ctx).squeeze(1)
        joined = torch.cat([ctx, h_t], 1, out=buf("joined", (B, 2 * H)))
        out = self.product(self.linear_out, joined, buf("output", (B, H)))
        return out.tanh_(), attn

    def fused_forward(self, inputs: tuple[Tensor, ...], buf: Buf) -> Tensor:
        """The fused node's forward: inputs (h_t, context)."""
        h, context = inputs
        return self.fused(h, context, None, buf)[0]

    def fused_backward(self, inputs: tuple[Tensor, ...], g: Tensor, bufs: FusedBuffers) -> None:
        """From d loss / d out: the gradients of h_t and the context into the node's buffers
        "grad_h" and "grad_context", W_c's (and the score's parameters') into `.grad`."""
        h, context = inputs
        B, S, H = context.shape
        attn, joined = bufs.saved("attn"), bufs.saved("joined")
        g_lin = _tanh_backward(g, bufs.saved("output"), grad_input=bufs("grad_lin", (B, H)))
        w_c = self.linear_out.weight
        g_joined = torch.mm(g_lin, w_c, out=bufs("grad_joined", (B, 2 * H)))
        w_c.grad.addmm_(g_lin.t(), joined)
        g_ctx = g_joined[:, :H]
        g_attn = row_dots(context, g_ctx, bufs("grad_attn", (B, S)))
        g_scores = bufs("grad_scores", (B, S))
        _softmax_backward(g_attn, attn, 1, attn.dtype, grad_input=g_scores)
        g_context = bufs("grad_context", (B, S, H))
        if bufs.accumulates("grad_context"):  # the sum over positions: added into
            torch.addcmul(g_context, attn.unsqueeze(2), g_ctx.unsqueeze(1), out=g_context)
        else:
            torch.mul(attn.unsqueeze(2), g_ctx.unsqueeze(1), out=g_context)
        g_h = bufs("grad_h", (B, H))
        self.fused_score_backward(h, context, g_scores, g_joined[:, H:], g_h, g_context, bufs)

    def wire(self, g: Wiring, h_top: Value, context: Value) -> Value:
        """The attention as nngraph nodes: the score's, then softmax, MM2, the join, W_c and
        the tanh (seq2seq-attn's names)."""
        attn = g.add(SoftMax, "attn.softmax", self.wire_score(g, h_top, context))
        ctx = g.add(MMContext, "attn.mm2", attn, context)
        joined = g.add(Join, "attn.join", ctx, h_top)
        out = g.add(Linear, "attn.out", joined, weight=self.linear_out.weight, bias=None)
        return g.add(Tanh, "attn.tanh", out)

    @classmethod
    def macs(cls, rnn_size: int, source_length: int) -> int:
        """Multiply-adds at one target position: the score, c_t (S H), W_c (2 H H)."""
        H, S = rnn_size, source_length
        return cls.score_macs(H, S) + S * H + 2 * H * H
