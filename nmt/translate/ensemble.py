"""Ensemble decoding: several models searched as one, their next-token probabilities averaged.

As OpenNMT-py's `-model A B`: at every step each model gives its distribution over the
target vocabulary, the ensemble's is their mean, and the search ranks by its log. The
models may differ in anything but their vocabularies (layers, sizes, cell, attention,
granularity, precision); each keeps its own decoder state and attention.

`Ensemble` offers the few methods the searches and gold scoring call on a model (`encode`,
`init_decoder_state`, `decode_step`, `log_probs`), so those run unchanged. What they carry
from step to step is the ensemble's: the context is the members' contexts side by side
(B x S x sum of rnn sizes) and the attentional output likewise, so that the searches'
reordering of the context and of the state's rows (beams, finished sentences) reorders every
member's. The attention the searches record (replace-unk, attention files) is the mean of
the members' attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from nmt.data.tokenizers import Tokenizer
from nmt.errors import NmtError
from nmt.model import DecoderState, Seq2SeqAttn


def vocabulary_state(tok: Tokenizer) -> tuple[str, bytes | tuple[str, ...]]:
    """What makes two tokenizers the same vocabulary: the same kind and the same pieces (a
    word vocabulary), or the same sentencepiece model (the same pieces cut the same way)."""
    state = tok.state_dict()
    if "model" in state:
        return state["kind"], bytes(state["model"].cpu().numpy().tobytes())
    return state["kind"], tuple(state["pieces"])


def check_vocabularies(
    first: Path, first_toks: tuple[Tokenizer, Tokenizer], path: Path, toks: tuple[Tokenizer, ...]
) -> None:
    """Refuse, naming both files, a model whose source or target vocabulary is not the first
    model's: its ids would mean other words."""
    for side, a, b in zip(("source", "target"), first_toks, toks, strict=True):
        if vocabulary_state(a) != vocabulary_state(b):
            raise NmtError(
                f"{path}: cannot be ensembled with {first}: the {side} vocabularies differ"
            )


@dataclass
class EnsembleState:
    """Every member's decoder state, reordered together."""

    members: list[DecoderState]

    def index_select(self, index: Tensor) -> EnsembleState:
        return EnsembleState([state.index_select(index) for state in self.members])


class Ensemble(nn.Module):
    """Models with one source and one target vocabulary, decoding as one model whose
    next-token distribution is the mean of theirs."""

    def __init__(self, models: list[Seq2SeqAttn]):
        super().__init__()
        if len(models) < 2:
            raise ValueError("an ensemble needs at least two models")
        self.members = nn.ModuleList(models)
        self.sizes = [m.cfg.rnn_size for m in models]
        # the dtype the carried context and output are held in: every member's converts
        # to it and back exactly (bfloat16 and float32 side by side: float32)
        dtype = models[0].generator.weight.dtype
        for m in models[1:]:
            dtype = torch.promote_types(dtype, m.generator.weight.dtype)
        self.dtype = dtype

    def _split(self, joined: Tensor) -> list[Tensor]:
        """The members' parts of a side-by-side tensor, each in its member's dtype."""
        parts = joined.split(self.sizes, dim=-1)
        return [p.to(m.generator.weight.dtype) for p, m in zip(parts, self.members, strict=True)]

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> tuple[Tensor, list]:
        """Every member encodes: their contexts side by side, their final states as a list."""
        contexts, finals = [], []
        for m in self.members:
            context, final = m.encode(src, src_mask)
            contexts.append(context.to(self.dtype))
            finals.append(final)
        return torch.cat(contexts, dim=-1), finals

    def init_decoder_state(self, finals: list) -> EnsembleState:
        return EnsembleState(
            [m.init_decoder_state(f) for m, f in zip(self.members, finals, strict=True)]
        )

    def decode_step(
        self, y: Tensor, state: EnsembleState, context: Tensor, src_mask: Tensor | None = None
    ) -> tuple[Tensor, EnsembleState, Tensor]:
        """One target position for every member: their attentional outputs side by side,
        their states, and the mean of their attention."""
        outs, states, attns = [], [], []
        for m, s, c in zip(self.members, state.members, self._split(context), strict=True):
            out, new, attn = m.decode_step(y, s, c, src_mask)
            outs.append(out.to(self.dtype))
            states.append(new)
            attns.append(attn.to(self.dtype))
        return torch.cat(outs, dim=-1), EnsembleState(states), torch.stack(attns).mean(0)

    def log_probs(self, out: Tensor) -> Tensor:
        """log of the mean of the members' probabilities: logsumexp of their
        log-probabilities less log(n), which stays exact where a probability underflows."""
        logps = [m.log_probs(o) for m, o in zip(self.members, self._split(out), strict=True)]
        dtype = logps[0].dtype
        for lp in logps[1:]:
            dtype = torch.promote_types(dtype, lp.dtype)
        stacked = torch.stack([lp.to(dtype) for lp in logps])
        return torch.logsumexp(stacked, dim=0) - math.log(len(logps))


# what the searches, the translator and gold scoring decode with: one model, or an ensemble
# standing in for one
Decodable = Seq2SeqAttn | Ensemble
