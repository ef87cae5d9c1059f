"""The training loss: the NLL, or label-smoothed cross-entropy with the NLL kept for reports.

Convention (OpenNMT-py's LabelSmoothingLoss, JoeyNMT's XentLoss): with smoothing eps and a
target vocabulary of V, the target distribution q puts 1 - eps on the reference token, 0 on
PAD and eps / (V - 2) on each of the V - 2 other tokens; PAD positions weigh nothing. The
loss is the cross-entropy -sum_k q_k log p_k (OpenNMT-py's KL divergence less the constant
entropy of q: the same gradient, softmax - q with respect to the logits). The clone
executor's criterion (`nmt.engine.nodes.LogSoftMaxNLL`) computes that gradient directly.

Perplexities, in training and validation, always come from the NLL part -log p(reference),
so that runs with and without smoothing compare.
"""

from __future__ import annotations

from torch import Tensor

from nmt.data.vocab import PAD


def smoothing_value(vocab_size: int, eps: float) -> float:
    """The probability mass q gives each token that is neither the reference nor PAD."""
    return eps / (vocab_size - 2)


def smoothed_loss(logp: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """logp: N x V log-probabilities, target: N ids (PAD rows weigh nothing)
    -> (summed label-smoothed cross-entropy, summed NLL)."""
    real = target != PAD
    nll_tok = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
    nll = nll_tok.masked_fill(~real, 0.0).sum()
    if eps == 0:
        return nll, nll
    # sum over the tokens other than the reference and PAD of log p
    others = logp.sum(1) + nll_tok - logp[:, PAD]
    loss_tok = (1.0 - eps) * nll_tok - smoothing_value(logp.size(1), eps) * others
    return loss_tok.masked_fill(~real, 0.0).sum(), nll
