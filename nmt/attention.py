"""Global attention, one class per score function, chosen by `model.attention`.

Every type scores each source position s against the decoder's top state h_t, then shares
the rest (Luong et al. 2015):

    a_t = softmax_s(score(h_t, h_s))          (masked source positions get -inf)
    c_t = sum_s a_t[s] h_s
    out = tanh(W_c [c_t ; h_t])               (W_c: 2H -> H, no bias, for every type)

The score functions:

    general  h_s . (W_a h_t)                  Luong "general", seq2seq-attn's (the default)
    dot      h_s . h_t                        Luong "dot": no parameters of its own
    mlp      v . tanh(W_k h_s + W_q h_t + b)  Bahdanau, OpenNMT-py's `global_attention mlp`

mlp biases: one bias b inside the tanh (on W_q, as OpenNMT-py's `linear_query`); none on W_k
(it would duplicate b) and none on v (a constant added to every score cancels in the
softmax, so it would never learn). Unlike OpenNMT-py, W_c has no bias for mlp either: the
output layer is the same for every type.

The clone executor mirrors each class node by node (`nmt.engine.seq2seq`); the parameter
registration order (score parameters first, then W_c) fixes the initialisation order.

`fused` is the same arithmetic with out= and in-place ops, into the buffers a `buf` gives
(`nmt.cells.Buf`): the fused granularity's attention node (`nmt.engine.fused`) runs it with
its persistent buffers, and inference with a fused model without (`forward(fused=True)`).
It runs the same ops in the same order as `forward`, so it gives the same numbers.

Shapes: B batch, S source length, H rnn_size.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from nmt.cells import Buf, fresh

# The legacy parameter names of the "general" attention (checkpoints written before the
# attention became a module) -> the names they load into now.
LEGACY_NAMES = {
    "attn_in.weight": "attention.linear_in.weight",
    "attn_out.weight": "attention.linear_out.weight",
}


def _output_layer(rnn_size: int) -> nn.Linear:
    return nn.Linear(2 * rnn_size, rnn_size, bias=False)  # W_c of tanh(W_c [c_t ; h_t])


class Attention(nn.Module):
    """Base class: a subclass defines `score`; softmax, context and output are common."""

    linear_out: nn.Linear

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        """h_t B x H, context B x S x H -> scores B x S."""
        raise NotImplementedError

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        """`score` into buffers: scores B x S in buffer "scores"."""
        raise NotImplementedError

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
        ctx = _viewed(buf("ctx", (B, H)), B, 1, H)
        ctx = torch.bmm(attn.unsqueeze(1), context, out=ctx).squeeze(1)
        joined = torch.cat([ctx, h_t], 1, out=buf("joined", (B, 2 * H)))
        out = torch.mm(joined, self.linear_out.weight.t(), out=buf("output", (B, H)))
        return out.tanh_(), attn


def _viewed(t: Tensor | None, *shape: int) -> Tensor | None:
    """A buffer seen in the shape an op's out= needs, or None (a new tensor)."""
    return None if t is None else t.view(shape)


def row_dots(context: Tensor, vector: Tensor, out: Tensor | None = None) -> Tensor:
    """out[b, s] = context[b, s] . vector[b] (B x S x H, B x H -> B x S): each vector as a
    row times its context transposed. That form of the batched product ran 5-11x faster
    than context times a column vector on this project's CPU (MKL, 2 threads; B 64-80,
    S 15-50, H 256-500: 923 -> 81 us at 64 x 50 x 500); the same dot products."""
    B, S, _ = context.shape
    if out is None:
        return torch.bmm(vector.unsqueeze(1), context.transpose(1, 2)).view(B, S)
    torch.bmm(vector.unsqueeze(1), context.transpose(1, 2), out=out.view(B, 1, S))
    return out


def _bmm_scores(context: Tensor, query: Tensor, buf: Buf) -> Tensor:
    """scores[b, s] = context[b, s] . query[b], into buffer "scores"."""
    B, S, _ = context.shape
    return row_dots(context, query, buf("scores", (B, S)))


class GeneralAttention(Attention):
    """score = h_s . (W_a h_t)."""

    def __init__(self, rnn_size: int):
        super().__init__()
        self.linear_in = nn.Linear(rnn_size, rnn_size, bias=False)  # W_a
        self.linear_out = _output_layer(rnn_size)

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        target = self.linear_in(h_t)  # B x H
        return row_dots(context, target)

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        """W_a h_t in buffer "target"."""
        target = torch.mm(h_t, self.linear_in.weight.t(), out=buf("target", tuple(h_t.shape)))
        return _bmm_scores(context, target, buf)


class DotAttention(Attention):
    """score = h_s . h_t."""

    def __init__(self, rnn_size: int):
        super().__init__()
        self.linear_out = _output_layer(rnn_size)

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        return row_dots(context, h_t)

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        return _bmm_scores(context, h_t, buf)


class MLPAttention(Attention):
    """score = v . tanh(W_k h_s + W_q h_t + b). W_k h_s is recomputed at every target
    position (as OpenNMT-py does with input feeding): simple, B x S x H x H per step."""

    def __init__(self, rnn_size: int):
        super().__init__()
        self.linear_query = nn.Linear(rnn_size, rnn_size, bias=True)  # W_q, b
        self.linear_context = nn.Linear(rnn_size, rnn_size, bias=False)  # W_k
        self.v = nn.Linear(rnn_size, 1, bias=False)
        self.linear_out = _output_layer(rnn_size)

    def score(self, h_t: Tensor, context: Tensor) -> Tensor:
        keys = self.linear_context(context)  # B x S x H
        query = self.linear_query(h_t)  # B x H
        hidden = torch.tanh(keys + query.unsqueeze(1))  # B x S x H
        return self.v(hidden).squeeze(2)  # B x S

    def fused_score(self, h_t: Tensor, context: Tensor, buf: Buf) -> Tensor:
        """W_k h_s in buffer "hidden", which becomes tanh(W_k h_s + W_q h_t + b) in place;
        W_q h_t + b in buffer "query"."""
        B, S, H = context.shape
        flat = _viewed(buf("hidden", (B, S, H)), B * S, H)
        keys = torch.mm(context.reshape(B * S, H), self.linear_context.weight.t(), out=flat)
        q = self.linear_query
        query = torch.addmm(q.bias, h_t, q.weight.t(), out=buf("query", (B, H)))
        hidden = keys.view(B, S, H).add_(query.unsqueeze(1)).tanh_()
        scores = _viewed(buf("scores", (B, S)), B * S, 1)
        return torch.mm(hidden.view(B * S, H), self.v.weight.t(), out=scores).view(B, S)


ATTENTIONS: dict[str, type[Attention]] = {
    "general": GeneralAttention,
    "dot": DotAttention,
    "mlp": MLPAttention,
}


def build_attention(kind: str, rnn_size: int) -> Attention:
    """The attention module named by `model.attention` (validated by the config)."""
    return ATTENTIONS[kind](rnn_size)
