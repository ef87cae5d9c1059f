"""Gold scoring: how likely the model finds given references (seq2seq-attn's -score_gold).

A reference's score is the sum of the log-probabilities of its tokens and of </s> under
teacher forcing, the same quantity beam search reports for a finished hypothesis, so an
n-best score can be checked by feeding the hypothesis back as a reference. Sources are
padded and masked exactly as in translation; the output layer runs one position at a time
(`nmt.loss`), so no batch x length x vocabulary tensor is made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nmt.data.vocab import BOS, EOS, PAD
from nmt.loss import gold_log_probs
from nmt.translate.translator import evaluating, length_batches, pad_sources

if TYPE_CHECKING:
    from nmt.translate.ensemble import Decodable


@dataclass(frozen=True)
class GoldScores:
    """Per-reference log-likelihoods and the tokens they cover (</s> included)."""

    scores: list[float]
    tokens: int

    @property
    def total(self) -> float:
        return sum(self.scores)

    @property
    def perplexity(self) -> float:
        """exp(-total / tokens): training's perplexity, over the references."""
        return math.exp(min(-self.total / max(self.tokens, 1), 100.0))


def gold_scores(
    model: Decodable,
    sources: list[list[int]],
    targets: list[list[int]],
    batch_size: int = 32,
) -> GoldScores:
    """Teacher-forced log-likelihood of each target (ids without specials) given its source."""
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    device = next(model.parameters()).device
    scores = [0.0] * len(sources)
    with evaluating(model):
        for batch in length_batches([len(s) for s in sources], batch_size):
            src, mask = pad_sources([sources[i] for i in batch], device)
            T = max(len(targets[i]) for i in batch) + 1
            tgt_in = torch.full((len(batch), T), PAD, dtype=torch.long)
            tgt_out = torch.full((len(batch), T), PAD, dtype=torch.long)
            for row, i in enumerate(batch):
                n = len(targets[i])
                tgt_in[row, : n + 1] = torch.tensor([BOS, *targets[i]])
                tgt_out[row, : n + 1] = torch.tensor([*targets[i], EOS])
            tgt_in, tgt_out = tgt_in.to(device), tgt_out.to(device)
            context, final = model.encode(src, mask)
            state = model.init_decoder_state(final)
            total = context.new_zeros(len(batch), dtype=torch.float64)
            for t in range(T):
                out, state, _ = model.decode_step(tgt_in[:, t], state, context, mask)
                gold = tgt_out[:, t]
                total += gold_log_probs(model, out, gold).double()
            for i, score in zip(batch, total.tolist(), strict=True):
                scores[i] = score
    return GoldScores(scores, sum(len(t) + 1 for t in targets))
